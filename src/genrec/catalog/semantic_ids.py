"""Semantic IDs: per-item code tuples, their token mapping, saving and loading, collisions.

An item's Semantic ID is a tuple of codes ``(c_0, ..., c_{L-1})`` with ``0 <= c_l < K_l``. In the
model vocabulary each level has its own token range: level ``l`` code ``c`` is token
``base + sum(K_0..K_{l-1}) + c`` (see :meth:`SemanticIndex.token_offsets`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genrec.catalog.codebooks import CODEBOOKS_KEY, IdCodebooks
from genrec.utils.atomic import atomic_write_json

FORMAT = "genrec.semantic_index"
FORMAT_VERSION = 1


@dataclass
class SemanticIndex:
    """Semantic IDs of a catalog: ``codes`` int64 [num_items, levels], ``codebook_sizes`` [levels].

    ``item_ids`` optionally records the original item id of each row, ``meta`` how it was built.
    Treat ``codes`` as immutable: token -> item lookups cache a table built from it.
    """

    codes: torch.Tensor
    codebook_sizes: list[int]
    item_ids: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # sorted mixed-radix keys of all IDs and the item of each, built on first lookup
    _lookup: tuple[torch.Tensor, torch.Tensor] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.codes = torch.as_tensor(self.codes, dtype=torch.int64)
        self.codebook_sizes = [int(k) for k in self.codebook_sizes]
        if self.codes.dim() != 2 or self.codes.shape[1] != len(self.codebook_sizes):
            shape = tuple(self.codes.shape)
            raise ValueError(f"codes must be [num_items, {self.num_levels}], got {shape}")
        if self.item_ids is not None and len(self.item_ids) != self.codes.shape[0]:
            raise ValueError(f"{len(self.item_ids)} item ids for {self.codes.shape[0]} code rows")
        sizes = torch.tensor(self.codebook_sizes, dtype=torch.int64, device=self.codes.device)
        bad = ((self.codes < 0) | (self.codes >= sizes)).any(dim=1).nonzero().flatten()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(
                f"item {self._name(i)} has codes {self.codes[i].tolist()} outside the codebook "
                f"sizes {self.codebook_sizes} ({bad.numel()} items affected)"
            )

    @property
    def num_items(self) -> int:
        """Number of items (rows of ``codes``)."""
        return int(self.codes.shape[0])

    @property
    def num_levels(self) -> int:
        """Number of code levels per ID."""
        return len(self.codebook_sizes)

    @property
    def vocab_size(self) -> int:
        """Number of Semantic-ID tokens over all levels (sum of the codebook sizes)."""
        return sum(self.codebook_sizes)

    def _name(self, i: int) -> str:
        return f"{i} (id {self.item_ids[i]!r})" if self.item_ids is not None else str(i)

    def token_offsets(self, base: int = 0) -> list[int]:
        """First token id of each level: ``base + sum of the earlier codebook sizes``."""
        offsets, total = [], base
        for k in self.codebook_sizes:
            offsets.append(total)
            total += k
        return offsets

    def item_to_tokens(self, items: torch.Tensor | Sequence[int], base: int = 0) -> torch.Tensor:
        """Token ids of items: [n] -> int64 [n, levels]."""
        items = torch.as_tensor(items, dtype=torch.int64, device=self.codes.device)
        offsets = torch.tensor(self.token_offsets(base), device=self.codes.device)
        return self.codes[items] + offsets

    def tokens_to_codes(self, tokens: torch.Tensor, base: int = 0) -> torch.Tensor:
        """Token ids [..., levels] -> codes [..., levels] (-1 where a token is out of its level)."""
        offsets = torch.tensor(self.token_offsets(base), device=tokens.device)
        sizes = torch.tensor(self.codebook_sizes, device=tokens.device)
        codes = tokens.to(torch.int64) - offsets
        return torch.where((codes >= 0) & (codes < sizes), codes, torch.full_like(codes, -1))

    def codes_to_items(self, codes: torch.Tensor) -> torch.Tensor:
        """Item index of each code tuple: [..., levels] -> [...] int64, -1 if no item has it."""
        keys, items = self._lookup_table(codes.device)
        valid = (codes >= 0) & (codes < torch.tensor(self.codebook_sizes, device=codes.device))
        query = self._keys(codes.clamp(min=0)).reshape(-1)
        pos = torch.searchsorted(keys, query).clamp(max=keys.numel() - 1)
        hit = (keys[pos] == query) & valid.all(dim=-1).reshape(-1)
        return torch.where(hit, items[pos], torch.full_like(query, -1)).reshape(codes.shape[:-1])

    def tokens_to_items(self, tokens: torch.Tensor, base: int = 0) -> torch.Tensor:
        """Item index of each token tuple: [..., levels] -> [...] int64, -1 if not an item."""
        return self.codes_to_items(self.tokens_to_codes(tokens, base))

    def _keys(self, codes: torch.Tensor) -> torch.Tensor:
        return mixed_radix_key(codes, self.codebook_sizes)

    def _lookup_table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._lookup is None:
            self.validate()
            keys, order = torch.sort(self._keys(self.codes))
            self._lookup = (keys, order)
        keys, order = self._lookup
        if keys.device != device:
            self._lookup = keys, order = keys.to(device), order.to(device)
        return keys, order

    def validate(self) -> None:
        """Raise ValueError naming the items if two items share a full Semantic ID."""
        prod = 1
        for k in self.codebook_sizes:
            prod *= k
        if prod >= 2**62:
            raise ValueError(f"codebook sizes {self.codebook_sizes} too large for int64 keys")
        groups = duplicate_groups(self.codes)
        if groups:
            desc = "; ".join(
                f"{self.codes[g[0]].tolist()}: items {', '.join(self._name(i) for i in g[:5])}"
                + (f" (+{len(g) - 5} more)" if len(g) > 5 else "")
                for g in groups[:5]
            )
            raise ValueError(
                f"{len(groups)} Semantic IDs are shared by several items (largest group "
                f"{len(groups[0])}): {desc}"
            )

    def to(self, device: torch.device | str) -> SemanticIndex:
        """A copy with ``codes`` on ``device``."""
        return SemanticIndex(self.codes.to(device), self.codebook_sizes, self.item_ids, self.meta)

    def save(self, path: str | Path) -> None:
        """Write the index as JSON (atomically: temporary file + rename)."""
        atomic_write_json(
            path,
            {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "codebook_sizes": self.codebook_sizes,
                "num_items": self.num_items,
                "codes": self.codes.cpu().tolist(),
                "item_ids": self.item_ids,
                "meta": self.meta,
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> SemanticIndex:
        """Read an index written by :meth:`save`; validates the uniqueness of IDs."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported version {data.get('version')!r}")
        sizes = data["codebook_sizes"]
        codes = torch.tensor(data["codes"], dtype=torch.int64).reshape(-1, len(sizes))
        if codes.shape[0] != data["num_items"]:
            raise ValueError(f"{path}: {codes.shape[0]} code rows, expected {data['num_items']}")
        index = cls(codes, sizes, data.get("item_ids"), data.get("meta") or {})
        if CODEBOOKS_KEY in index.meta:  # checked now: an index that assigns IDs never fails later
            IdCodebooks.from_meta(index.meta[CODEBOOKS_KEY], sizes, str(path))
        index.validate()
        return index


def duplicate_groups(codes: torch.Tensor) -> list[list[int]]:
    """Groups (sorted item lists) of items sharing the same code row, largest groups first."""
    _, inverse, counts = torch.unique(codes, dim=0, return_inverse=True, return_counts=True)
    if codes.shape[0] == 0 or int(counts.max()) <= 1:
        return []
    dup_mask = counts[inverse] > 1
    items = dup_mask.nonzero().flatten()
    groups: dict[int, list[int]] = {}
    for item, group in zip(items.tolist(), inverse[items].tolist(), strict=True):
        groups.setdefault(group, []).append(item)
    return sorted(groups.values(), key=lambda g: (-len(g), g[0]))


def prefix_stats(codes: torch.Tensor) -> list[dict[str, float]]:
    """Per prefix length l = 1..levels of ``codes`` [n, levels]: the distinct prefixes, the
    largest group of items sharing one, and the share of items whose prefix is theirs alone."""
    out = []
    for level in range(1, codes.shape[1] + 1):
        _, inverse, counts = torch.unique(codes[:, :level], dim=0, return_inverse=True,
                                          return_counts=True)
        out.append({"level": level, "distinct": int(counts.numel()),
                    "largest_group": int(counts.max()),
                    "unique_share": float((counts[inverse] == 1).float().mean())})
    return out


def mixed_radix_key(codes: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """Mixed-radix integer key of each code tuple, in lexicographic order of the tuples
    (int64; the product of ``sizes`` must fit): [..., levels] -> [...]."""
    key = torch.zeros(codes.shape[:-1], dtype=torch.int64, device=codes.device)
    for level, k in enumerate(sizes):
        key = key * k + codes[..., level]
    return key


def group_counter(key: torch.Tensor) -> torch.Tensor:
    """Counter among rows sharing the same ``key``, in row order: int64 [n] -> [n]."""
    n = key.shape[0]
    # stable sort by key keeps row order inside each group
    order = torch.sort(key, stable=True).indices
    grouped = key[order]
    pos = torch.arange(n, device=key.device)
    is_start = torch.ones(n, dtype=torch.bool, device=key.device)
    is_start[1:] = grouped[1:] != grouped[:-1]
    start = torch.cummax(torch.where(is_start, pos, torch.zeros_like(pos)), dim=0).values
    counter = torch.empty_like(pos)
    counter[order] = pos - start
    return counter


def dedup_level(codes: torch.Tensor) -> torch.Tensor:
    """Counter among items sharing the same code row, in item order: [n, levels] -> [n].

    Appending it as a last level makes every ID unique; its codebook size is ``max + 1``.
    """
    if codes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=codes.device)
    _, inverse = torch.unique(codes, dim=0, return_inverse=True)
    return group_counter(inverse)


def with_dedup_level(codes: torch.Tensor, codebook_sizes: Sequence[int]) -> SemanticIndex:
    """Append the :func:`dedup_level` counter to ``codes``; size = max collisions (>= 1)."""
    counter = dedup_level(codes)
    size = int(counter.max()) + 1 if counter.numel() else 1
    return SemanticIndex(torch.cat([codes, counter[:, None]], dim=1), [*codebook_sizes, size])
