"""Models: folder checks (`folders`, torch-free), layers at per-layer shapes, task heads, load and save (`io`)."""
