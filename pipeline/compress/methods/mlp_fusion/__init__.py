"""MLP Fusion (arXiv 2307.08941): cluster FFN neurons, keep means plus a constant scaling P."""
