"""Configuration: the schema (`schema`) and YAML recipes with shared teacher definitions (`recipes`)."""
