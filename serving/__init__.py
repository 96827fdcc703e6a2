"""Serving runtime: ONNX Runtime over an artifact folder, with the fast tokenizer and no torch."""
