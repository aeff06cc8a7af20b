"""genrec: an inference engine for LLM-based recommendation."""

__version__ = "0.1.0"
