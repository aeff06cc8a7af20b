"""What a request costs in memory, estimated on the host before it is batched.

Estimates, on the generous side, of the bytes a request makes the engine allocate beyond its
weights: the KV cache (a search's static buffers: :meth:`SearchBuffers.bytes_for`; a scoring
request's prefix and candidate keys and values), the activations of one forward chunk, the
log-probabilities read out, and the filter lists built from ``exclude`` / ``allow``. The
server admits requests against the engine's memory budget with them
(:mod:`genrec.serving.admission`); nothing here touches a tensor.
"""

from __future__ import annotations

import torch

from genrec.engine.search_buffers import SearchBuffers, prefix_bucket
from genrec.live_catalog.state import CatalogState
from genrec.model.config import ModelConfig

FP32 = 4
# int64 words per listed filter item and level: the ancestors, the sort keys (twice), the
# padded rows and their copies into a runner's buffers
FILTER_WORDS = 8


def _activations(cfg: ModelConfig, tokens: int) -> int:
    # one forward's live rows in fp32: the residual, normed input, q/k/v and attention output
    # (~6 hidden-sized rows), the MLP's gate, up and product (3 intermediate-sized rows)
    return tokens * (6 * cfg.hidden_size + 3 * cfg.intermediate_size) * FP32


def _kv_bytes(cfg: ModelConfig, dtype: torch.dtype, rows: int) -> int:
    return (2 * cfg.num_hidden_layers * rows * cfg.num_key_value_heads * cfg.head_dim
            * dtype.itemsize)


def prompt_tokens(catalog: CatalogState, history: int, soft: bool, text: int | None) -> int:
    """Tokens of a Semantic-ID prompt of ``history`` items (cut to the vocabulary's
    ``max_history``), a soft token and ``text`` text tokens (``None``: the default text)."""
    vocab = catalog.base_vocab
    keep = min(history, vocab.max_history) if vocab.max_history else history
    head = len(vocab.head(soft, None)) if text is None else 1 + int(soft) + text
    return head + keep * catalog.num_levels


def search_bytes(cfg: ModelConfig, dtype: torch.dtype, catalog: CatalogState, prompt: int,
                 width: int, listed: int) -> int:
    """One request's beam search of ``width`` beams over a ``prompt``-token prompt with
    ``listed`` items in its ``exclude`` / ``allow`` lists."""
    levels = catalog.num_levels
    buffers = SearchBuffers.bytes_for(cfg, dtype, 1, width, prefix_bucket(prompt), levels)
    level_codes = max(catalog.codebook_sizes)
    # a level's log-probabilities, candidate pairs and their top-k: a few [width, codes] rows
    step = 4 * width * level_codes * FP32 + _activations(cfg, width)
    filters = FILTER_WORDS * 8 * listed * levels
    return buffers + max(_activations(cfg, prompt), step) + filters


def score_bytes(cfg: ModelConfig, dtype: torch.dtype, prefix: int, candidate_tokens: int,
                candidates: int, chunk_tokens: int) -> int:
    """One scoring request: a ``prefix``-token prompt and ``candidates`` candidates of
    ``candidate_tokens`` tokens in all, run in chunks of ``chunk_tokens`` (the KV cache holds
    every token; the activations one chunk; the read-out one full-vocabulary row per
    candidate)."""
    tokens = prefix + candidate_tokens
    readout = candidates * cfg.vocab_size * FP32
    return (_kv_bytes(cfg, dtype, tokens) + _activations(cfg, min(tokens, chunk_tokens))
            + readout)
