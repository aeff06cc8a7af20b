"""The static buffers of one beam-search shape (request rows, beam width, prefix capacity,
levels): the KV cache, prompt-final hidden states, prefix lengths and the identity ancestry,
and what they take in bytes before they are made (:meth:`SearchBuffers.bytes_for`)."""

from __future__ import annotations

import torch

from genrec.model.config import ModelConfig
from genrec.model.decoder import DecoderLM
from genrec.model.kv_cache import KVCache
from genrec.utils.sizes import next_power_of_two

MIN_PREFIX_BUCKET = 64


def prefix_bucket(longest: int) -> int:
    """Prefix capacity of a search whose longest prompt has ``longest`` tokens: the next
    power of two, at least :data:`MIN_PREFIX_BUCKET`."""
    return max(MIN_PREFIX_BUCKET, next_power_of_two(longest))


class SearchBuffers:
    """The static buffers of one search shape: ``requests`` (rows), ``width``,
    ``prefix_cap``, ``levels``."""

    def __init__(self, model: DecoderLM, requests: int, width: int, prefix_cap: int,
                 levels: int) -> None:
        cfg, dev = model.config, model.device
        self.requests, self.width, self.levels = requests, width, levels
        n_beams, tail = requests * width, max(levels - 1, 1)
        self.cache = KVCache(cfg.num_hidden_layers, requests, prefix_cap, n_beams, tail,
                             cfg.num_key_value_heads, cfg.head_dim, model.dtype, dev)
        self.hidden = torch.zeros(requests, cfg.hidden_size, dtype=model.dtype, device=dev)
        self.prefix_len = torch.zeros(requests, dtype=torch.long, device=dev)
        # ancestry of the level-0 beams: every row reads its own slots
        self.ancestry = torch.arange(n_beams, device=dev)[:, None].repeat(1, tail)
        self._nbytes = self.cache.nbytes() + sum(t.numel() * t.element_size() for t in (
            self.hidden, self.prefix_len, self.ancestry))

    @staticmethod
    def bytes_for(cfg: ModelConfig, dtype: torch.dtype, requests: int, width: int,
                  prefix_cap: int, levels: int) -> int:
        """Bytes the buffers of this shape take for a model of ``cfg`` in ``dtype`` (as
        :meth:`nbytes` once made), computed without allocating them."""
        item = dtype.itemsize
        n_beams, tail = requests * width, max(levels - 1, 1)
        kv_rows = requests * prefix_cap + n_beams * tail
        kv = 2 * cfg.num_hidden_layers * kv_rows * cfg.num_key_value_heads * cfg.head_dim * item
        return kv + requests * cfg.hidden_size * item + 8 * (requests + n_beams * tail)

    def load(self, hidden: torch.Tensor, prefix_len: torch.Tensor) -> None:
        """Copy the prompts' hidden states [R, H] and prefix lengths [R] in (R <= rows)."""
        r = hidden.shape[0]
        self.hidden[:r].copy_(hidden)
        self.prefix_len[:r].copy_(prefix_len)
        if r < self.requests:  # padding requests: no prefix
            self.hidden[r:].zero_()
            self.prefix_len[r:].zero_()

    def nbytes(self) -> int:
        """Bytes of the buffers (fixed when made)."""
        return self._nbytes
