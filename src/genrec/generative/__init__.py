"""Generative retrieval: Semantic-ID vocabulary and prompts shared by training and serving."""

from genrec.generative.vocab import SidVocab

__all__ = ["SidVocab"]
