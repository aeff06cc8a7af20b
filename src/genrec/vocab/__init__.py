"""Generative retrieval: Semantic-ID vocabulary and prompts shared by training and serving."""

from genrec.vocab.sid_vocab import SidVocab

__all__ = ["SidVocab"]
