"""Distillation into smaller students: MiniLMv2 relations (arXiv 2012.15828), hidden-state and output transfer."""
