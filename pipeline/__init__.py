"""encoder-deploy: compress BERT-family encoders, compact them, export to ONNX, validate, benchmark, package."""
