"""The vocabulary of a generative recommender: a few special tokens, then Semantic-ID tokens.

Token ids ``0 .. base-1`` are special (``bos``, the soft-token placeholder, ``pad``); level ``l``
of the Semantic IDs occupies ``base + sum(K_0..K_{l-1}) + [0, K_l)``. A user's prompt is
``bos [soft] sid(item_1) ... sid(item_n)``: the last ``max_history`` items, oldest first.
Training and serving build prompts with the same function.

A vocabulary *extending* a pretrained LM's (:meth:`SidVocab.extending`) keeps the text tokens
``0 .. text_vocab-1`` as they are; ``bos``, soft and ``pad`` are the next three ids and the
Semantic-ID tokens follow (``base = text_vocab + 3``). Its prompts may carry text:
``bos [soft] text... sid(item_1) ...``, the text being the request's or, by default, the
vocabulary's ``text_ids`` (e.g. a fixed instruction the model was trained with).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from genrec.catalog.id_map import check_rows
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.utils.atomic import atomic_write_json

BOS_ID, SOFT_ID, PAD_ID = 0, 1, 2
NUM_SPECIAL = 3
VOCAB_FILE = "sid_vocab.json"
INDEX_FILE = "semantic_index.json"


_SAVED_KEYS = ("base", "max_history", "text_vocab", "bos_id", "soft_id", "pad_id", "text_ids")


@dataclass
class SidVocab:
    """Semantic-ID token layout of a model; ``index`` maps items to codes. ``text_vocab``:
    the text tokens kept before the special ones (0: a Semantic-ID-only model); ``text_ids``:
    the default text of every prompt (text token ids, after ``bos [soft]``)."""

    index: SemanticIndex
    base: int = NUM_SPECIAL
    max_history: int = 20
    text_vocab: int = 0
    bos_id: int = BOS_ID
    soft_id: int = SOFT_ID
    pad_id: int = PAD_ID
    text_ids: tuple[int, ...] = ()
    # each item's token ids as a Python list, built on the first prompt (the index's codes are
    # immutable): prompts are then built without a tensor op per request
    _rows: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.text_ids = tuple(self.text_ids)
        special = {"bos_id": self.bos_id, "soft_id": self.soft_id, "pad_id": self.pad_id}
        for name, value in special.items():
            if not self.text_vocab <= value < self.base:
                raise ValueError(f"{name}: {value} is not a special token id "
                                 f"({self.text_vocab}..{self.base - 1})")
        if len(set(special.values())) != len(special):
            raise ValueError(f"bos_id, soft_id and pad_id must differ, got {special}")
        self.check_text(self.text_ids, "text_ids")

    @classmethod
    def extending(cls, index: SemanticIndex, text_vocab: int, max_history: int = 20,
                  text_ids: Sequence[int] = ()) -> SidVocab:
        """The layout appended to a text vocabulary of ``text_vocab`` tokens: ``bos``, soft,
        ``pad`` = ``text_vocab + 0, 1, 2``, then the Semantic-ID tokens."""
        return cls(index, base=text_vocab + NUM_SPECIAL, max_history=max_history,
                   text_vocab=text_vocab, bos_id=text_vocab + BOS_ID,
                   soft_id=text_vocab + SOFT_ID, pad_id=text_vocab + PAD_ID,
                   text_ids=tuple(text_ids))

    def check_text(self, ids: Sequence[int], field: str) -> None:
        """Raise ValueError naming ``field`` when ``ids`` are not text token ids."""
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.text_vocab:
                if not self.text_vocab:
                    raise ValueError(f"{field}: this model has no text vocabulary (a "
                                     "Semantic-ID-only model); prompts cannot carry text")
                raise ValueError(f"{field}: {t!r} is not a text token id "
                                 f"(0..{self.text_vocab - 1})")

    def head(self, soft_token: bool, text: Sequence[int] | None = None) -> list[int]:
        """A prompt's tokens before its Semantic IDs: ``bos [soft] text`` (``text`` None: the
        default :attr:`text_ids`)."""
        out = [self.bos_id, self.soft_id] if soft_token else [self.bos_id]
        return out + list(self.text_ids if text is None else text)

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
        check_rows(items, self.index.num_items, field)

    def prompt(self, history: Sequence[int], soft_token: bool = False,
               truncate: bool = True, text: Sequence[int] | None = None) -> list[int]:
        """``bos [soft] text sid(h_1) ... sid(h_n)`` over the last ``max_history`` items (all
        of them when ``truncate`` is False); ``text`` None: the default :attr:`text_ids`."""
        keep = self.max_history if truncate else 0
        history = list(history)[-keep:] if keep else list(history)
        head = self.head(soft_token, text)
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
        meta = {"base": self.base, "max_history": self.max_history}
        if self.text_vocab:  # a Semantic-ID-only layout is written as before
            meta |= {"text_vocab": self.text_vocab, "bos_id": self.bos_id,
                     "soft_id": self.soft_id, "pad_id": self.pad_id,
                     "text_ids": list(self.text_ids)}
        atomic_write_json(directory / VOCAB_FILE, meta)

    @classmethod
    def load(cls, directory: str | Path) -> SidVocab:
        """The vocabulary saved in ``directory`` by :meth:`save`."""
        directory = Path(directory)
        meta = json.loads((directory / VOCAB_FILE).read_text())
        unknown = set(meta) - set(_SAVED_KEYS)
        if unknown:
            raise ValueError(f"{directory / VOCAB_FILE}: unknown keys {sorted(unknown)}")
        return cls(SemanticIndex.load(directory / INDEX_FILE), **meta)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        return (Path(directory) / VOCAB_FILE).is_file()
