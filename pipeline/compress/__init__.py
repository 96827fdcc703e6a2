"""Compression: the method registry, what a method receives, masks, exact compaction, and the methods."""
