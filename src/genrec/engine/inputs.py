"""Composed inputs: text tokens, virtual item tokens, soft tokens and raw embeddings.

A part of a request (its prefix, or one candidate) is a sequence whose elements are token ids
(``int``) or :class:`Embeds` blocks. Token ids below the vocabulary size are text; ids at or
above it are virtual item tokens that index the item table (row ``id - vocab_size``). The soft
token placeholder id marks where the projected user vector goes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import torch
from torch import nn

from genrec.catalog.item_table import ItemTable
from genrec.model.item_head import ItemHead


@dataclass(frozen=True)
class Embeds:
    """Raw input embeddings given by the caller: [n, hidden]."""

    vectors: torch.Tensor

    def __len__(self) -> int:
        return int(self.vectors.shape[0])


Part = Sequence["int | Embeds"]


class InputError(ValueError):
    """A request that cannot be turned into model inputs; the message names the problem."""


@dataclass
class PackedInputs:
    """Flattened inputs of a whole batch, in packing order (length T)."""

    token_ids: torch.Tensor  # [T] long; -1 where raw embeddings go
    raw_rows: torch.Tensor  # [Tr] packed positions of raw embeddings
    raw_embeds: torch.Tensor | None  # [Tr, hidden]
    soft_rows: torch.Tensor  # [S] packed positions of soft tokens
    user_vectors: torch.Tensor | None  # [S, user_dim]


def _name(field: str | Callable[[], str]) -> str:
    return field if isinstance(field, str) else field()


class InputPacker:
    """Collects parts in packing order, then emits one :class:`PackedInputs`."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._raw_rows: list[int] = []
        self._raw: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, part: Part, field: str | Callable[[], str]) -> int:
        """Append a part; returns its length. ``field`` names it in error messages (a callable
        is only called when there is an error)."""
        if type(part) is list and all(type(e) is int for e in part):  # fast path
            if part and min(part) < 0:
                raise InputError(f"{_name(field)}: negative token id {min(part)}")
            self._ids.extend(part)
            return len(part)
        field = _name(field)
        if isinstance(part, torch.Tensor):
            part = part.tolist()
        if isinstance(part, (str, bytes)) or not isinstance(part, Sequence):
            kind = type(part).__name__
            raise InputError(f"{field}: expected a sequence of token ids, got {kind}")
        if all(type(e) is int for e in part):  # fast path: plain token ids
            if part and min(part) < 0:
                raise InputError(f"{field}: negative token id {min(part)}")
            self._ids.extend(part)
            return len(part)
        n = 0
        for element in part:
            if isinstance(element, Embeds):
                if element.vectors.dim() != 2:
                    raise InputError(f"{field}: Embeds must be [n, hidden]")
                start = len(self._ids)
                self._ids.extend([-1] * len(element))
                self._raw_rows.extend(range(start, start + len(element)))
                self._raw.append(element.vectors)
                n += len(element)
            elif isinstance(element, int) and not isinstance(element, bool):
                if element < 0:
                    raise InputError(f"{field}: negative token id {element}")
                self._ids.append(element)
                n += 1
            else:
                raise InputError(f"{field}: elements must be int token ids or Embeds, got "
                                 f"{type(element).__name__}")
        return n

    def add_token_lists(self, parts: Sequence[Part], max_len: int) -> list[int] | None:
        """Append many parts at once when each is a plain list of 1..``max_len`` non-negative
        int ids (the usual candidate list); returns their lengths, or None (nothing added)
        otherwise, so that the caller checks part by part and names the culprit."""
        if type(parts) is not list or not all(type(p) is list for p in parts):
            return None
        lens = [len(p) for p in parts]
        if not lens or min(lens) == 0 or max(lens) > max_len:
            return None
        flat = list(chain.from_iterable(parts))
        if not all(type(e) is int for e in flat) or (flat and min(flat) < 0):
            return None
        self._ids.extend(flat)
        return lens

    def token_tensor(self) -> torch.Tensor:
        """The packed token ids so far: [T] long (-1 where raw embeddings go)."""
        return torch.tensor(self._ids, dtype=torch.long)

    def finish(
        self, soft_rows: list[int], user_vectors: list[torch.Tensor],
        token_ids: torch.Tensor | None = None,
    ) -> PackedInputs:
        """The batch's inputs; ``token_ids`` reuses an already built :meth:`token_tensor`."""
        return PackedInputs(
            token_ids=self.token_tensor() if token_ids is None else token_ids,
            raw_rows=torch.tensor(self._raw_rows, dtype=torch.long),
            raw_embeds=torch.cat(self._raw) if self._raw else None,
            soft_rows=torch.tensor(soft_rows, dtype=torch.long),
            user_vectors=torch.stack(user_vectors) if user_vectors else None,
        )


def build_input_embeds(
    embed_tokens: nn.Embedding,
    inputs: PackedInputs,
    item_table: ItemTable | None = None,
    projector: nn.Module | None = None,
    item_head: ItemHead | None = None,
) -> torch.Tensor:
    """Input embeddings [T, hidden] of a packed batch, vectorised over all tokens.

    Text ids read ``embed_tokens``; virtual ids (>= vocab size) read the item table; soft-token
    rows get ``projector(user_vectors)``; raw rows get the caller's embeddings; an item head
    with item inputs adds its embedding at each item's last Semantic-ID token. Runs on the
    device of ``embed_tokens``.
    """
    weight = embed_tokens.weight
    device, vocab = weight.device, weight.shape[0]
    ids = inputs.token_ids.to(device)
    virtual = ids >= vocab
    x = embed_tokens(ids.clamp(0, vocab - 1))  # [T, hidden]
    if item_table is not None and item_table.num_rows:
        rows = (ids - vocab).clamp(0, item_table.num_rows - 1)
        x = torch.where(virtual[:, None], item_table.rows(rows).to(x.dtype), x)
    if inputs.soft_rows.numel():
        soft = projector(inputs.user_vectors.to(device, projector.fc1.weight.dtype))
        x = x.index_copy(0, inputs.soft_rows.to(device), soft.to(x.dtype))
    if inputs.raw_rows.numel():
        raw = inputs.raw_embeds.to(device, x.dtype)
        x = x.index_copy(0, inputs.raw_rows.to(device), raw)
    if item_head is not None and item_head.item_inputs:
        x = item_head.add_inputs(x, ids)
    return x
