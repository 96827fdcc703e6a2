"""The compact stage: remove every head and FFN neuron the compressed model no longer uses, proven exact."""

from __future__ import annotations

from pipeline.compress.exact_compaction import compact_folder

run = compact_folder  # (compressed_dir, ref, out_dir, atol, max_length, max_examples=256) -> report
