"""Static Model Pruning (arXiv 2210.06210): frozen weights, trained first-order mask scores."""
