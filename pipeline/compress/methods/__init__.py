"""The compression methods, one folder each (`config.py`, `stage.py`, helpers), listed in `compress.registry`."""
