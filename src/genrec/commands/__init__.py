"""Command-line commands, registered in :mod:`genrec.cli`."""
