"""encoder-deploy: compress BERT-family encoders, compact them, export to ONNX, validate, benchmark, package."""

from pipeline import methods

__all__ = ["methods"]
