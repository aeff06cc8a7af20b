"""Item catalog: Semantic IDs, the constraint trie and item embeddings."""

from genrec.catalog.embeddings import (
    SentenceEncoder,
    encode_texts,
    format_item_text,
    item_texts,
    load_embeddings,
    save_embeddings,
)
from genrec.catalog.filters import PartFilter
from genrec.catalog.kmeans import residual_kmeans
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.catalog.sid_sources import build_semantic_index, load_sid_index
from genrec.catalog.trie import SemanticTrie

__all__ = [
    "PartFilter",
    "SemanticIndex",
    "SemanticTrie",
    "SentenceEncoder",
    "build_semantic_index",
    "encode_texts",
    "format_item_text",
    "item_texts",
    "load_embeddings",
    "load_sid_index",
    "residual_kmeans",
    "save_embeddings",
]
