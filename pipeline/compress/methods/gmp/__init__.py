"""GMP* (arXiv 2210.06384): gradual magnitude pruning with a cubic schedule, KD and learning-rate re-warming."""
