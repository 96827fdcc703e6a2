"""Task data: task specs (`tasks`), loading from GLUE TSV, the hub or shipped samples (`loaders`), `encoding`."""
