"""How int8 graphs round weights: the exporter's (`export.onnx`), which the training that imitates it
(`pipeline.train.fake_quant`) reads, so the two cannot drift apart."""

# Weights take 7 bits of the 8 (ORT's `reduce_range`). A CPU without VNNI (AVX2, or AVX-512 without VNNI) multiplies
# u8 activations by s8 weights with VPMADDUBSW, which adds two products into a saturating int16: with full-range
# weights the sums clip. The 12 x 768 MPNet teacher's int8 graph read 92.2% on SST-2 dev on a VNNI CPU and 49.1%
# (chance) on an AVX2 EPYC; with 7-bit weights 91.7% there, at the same speed. An artifact is served wherever it is
# copied, so every int8 graph is made to be right on both.
REDUCE_RANGE = True  # ORT's reduce_range: symmetric weights in [-64, 64]
