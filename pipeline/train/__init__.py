"""Training: the shared loop (`loop`), its losses (`losses`) and task metrics with batched inference (`metrics`)."""
