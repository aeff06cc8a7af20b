"""The vocabulary of a generative recommender: a few special tokens, then Semantic-ID tokens.

Token ids ``0 .. base-1`` are special (``bos``, the soft-token placeholder, ``pad``); level ``l``
of the Semantic IDs occupies ``base + sum(K_0..K_{l-1}) + [0, K_l)``. A user's prompt is
``bos [soft] sid(item_1) ... sid(item_n)``: the last ``max_history`` items, oldest first.
Training and serving build prompts with the same function.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from genrec.catalog.semantic_ids import SemanticIndex
from genrec.utils.atomic import atomic_write_json

BOS_ID, SOFT_ID, PAD_ID = 0, 1, 2
NUM_SPECIAL = 3
VOCAB_FILE = "sid_vocab.json"
INDEX_FILE = "semantic_index.json"


@dataclass
class SidVocab:
    """Semantic-ID token layout of a model; ``index`` maps items to codes."""

    index: SemanticIndex
    base: int = NUM_SPECIAL
    max_history: int = 20
    # each item's token ids as a Python list, built on the first prompt (the index's codes are
    # immutable): prompts are then built without a tensor op per request
    _rows: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return self.base + self.index.vocab_size

    @property
    def num_levels(self) -> int:
        return self.index.num_levels

    @property
    def level_offsets(self) -> list[int]:
        return self.index.token_offsets(self.base)

    def item_tokens(self, items: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Token ids of items: [n] -> [n, levels]."""
        return self.index.item_to_tokens(items, self.base)

    def check_items(self, items: Sequence[int], field: str) -> None:
        """Raise ValueError naming ``field`` when an item id is not in the index."""
        n = self.index.num_items
        for i in items:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise ValueError(f"{field}: unknown item id {i!r} (catalog has 0..{n - 1})")

    def prompt(self, history: Sequence[int], soft_token: bool = False,
               truncate: bool = True) -> list[int]:
        """``bos [soft] sid(h_1) ... sid(h_n)`` over the last ``max_history`` items (all of
        them when ``truncate`` is False)."""
        keep = self.max_history if truncate else 0
        history = list(history)[-keep:] if keep else list(history)
        head = [BOS_ID, SOFT_ID] if soft_token else [BOS_ID]
        if not history:
            return head
        if self._rows is None:
            self._rows = self.item_tokens(torch.arange(self.index.num_items)).tolist()
        rows = self._rows
        n = len(rows)
        for i in history:
            if not 0 <= i < n:
                raise IndexError(f"item id {i} is out of range for {n} items")
        return head + [t for i in history for t in rows[i]]

    def save(self, directory: str | Path) -> None:
        """Write the index and this layout beside a model checkpoint (atomically)."""
        directory = Path(directory)
        self.index.save(directory / INDEX_FILE)
        atomic_write_json(directory / VOCAB_FILE,
                          {"base": self.base, "max_history": self.max_history})

    @classmethod
    def load(cls, directory: str | Path) -> SidVocab:
        directory = Path(directory)
        meta = json.loads((directory / VOCAB_FILE).read_text())
        unknown = set(meta) - {"base", "max_history"}
        if unknown:
            raise ValueError(f"{directory / VOCAB_FILE}: unknown keys {sorted(unknown)}")
        return cls(SemanticIndex.load(directory / INDEX_FILE), **meta)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        return (Path(directory) / VOCAB_FILE).is_file()
