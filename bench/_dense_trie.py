"""Bench-only copy of genrec's previous catalog trie (git 4cd0c2c, ``genrec.catalog.trie``): the
*dense trie* baseline of ``bench/catalog.py``. Not genrec code; kept here so the benchmark
measures the old design in the same run as the new one.

Every level is a dense ``[nodes, K]`` table: ``allowed`` (bool), ``child`` / ``leaf_item``
(int64), ``slot_start`` / ``slot_end`` (int64 ranked item ranges), plus ``item_node`` (int64
[N] per level), ``rank`` and ``order``. Filters are an ``[R, N]`` item mask and its ranked
prefix sums ``[R, N + 1]`` (:func:`build_item_mask`, :func:`ranked_prefix_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch


@dataclass
class DenseTrie:
    """Dense trie tensors (see the module docstring); ``N`` = number of items."""

    codebook_sizes: list[int]
    allowed: list[torch.Tensor]
    child: list[torch.Tensor]
    leaf_item: torch.Tensor
    item_node: list[torch.Tensor]
    rank: torch.Tensor
    order: torch.Tensor
    slot_start: list[torch.Tensor]
    slot_end: list[torch.Tensor]

    @property
    def num_levels(self) -> int:
        """Number of code levels."""
        return len(self.codebook_sizes)

    @property
    def num_items(self) -> int:
        """Number of items (leaves)."""
        return int(self.rank.shape[0])

    def nbytes(self) -> int:
        """Bytes held by the trie's tensors."""
        total = 0
        for f in fields(self):
            value = getattr(self, f.name)
            for t in value if isinstance(value, list) else [value]:
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total

    @classmethod
    def from_codes(cls, codes: torch.Tensor, codebook_sizes: Sequence[int]) -> DenseTrie:
        """Build from codes int64 [N, L]; IDs must be unique and within ``codebook_sizes``
        (the old ``SemanticTrie.from_codes``, unchanged)."""
        codes = codes.to(torch.int64)
        sizes = [int(k) for k in codebook_sizes]
        n, levels = codes.shape
        if n == 0:
            raise ValueError("cannot build a trie over an empty catalog")
        dev = codes.device
        limit = torch.tensor(sizes, device=dev)
        if bool(((codes < 0) | (codes >= limit)).any()):
            raise ValueError(f"codes outside the codebook sizes {sizes}")
        uniq, rank = torch.unique(codes, dim=0, return_inverse=True)
        if uniq.shape[0] != n:
            raise ValueError(f"{n - uniq.shape[0]} duplicate Semantic IDs; IDs must be unique")
        order = torch.empty_like(rank)
        order[rank] = torch.arange(n, device=dev)
        ranked = codes[order]
        item_node = [torch.zeros(n, dtype=torch.int64, device=dev)]
        num_nodes = [1]
        for level in range(1, levels):
            _, inv = torch.unique(codes[:, :level], dim=0, return_inverse=True)
            item_node.append(inv)
            num_nodes.append(int(inv.max()) + 1)
        allowed, child, slot_start, slot_end = [], [], [], []
        leaf_item = torch.empty(0, dtype=torch.int64)
        for level, k in enumerate(sizes):
            node, code = item_node[level], codes[:, level]
            shape = (num_nodes[level], k)
            mask = torch.zeros(shape, dtype=torch.bool, device=dev)
            mask[node, code] = True
            allowed.append(mask)
            target = torch.full(shape, -1, dtype=torch.int64, device=dev)
            if level + 1 < levels:
                target[node, code] = item_node[level + 1]
                child.append(target)
            else:
                target[node, code] = torch.arange(n, device=dev)
                leaf_item = target
            slots = item_node[level][order] * k + ranked[:, level]
            all_slots = torch.arange(shape[0] * k, device=dev)
            slot_start.append(torch.searchsorted(slots, all_slots).view(shape))
            slot_end.append(torch.searchsorted(slots, all_slots, right=True).view(shape))
        return cls(sizes, allowed, child, leaf_item, item_node, rank, order, slot_start, slot_end)


def build_item_mask(
    num_items: int, allow: Sequence[Sequence[int] | None], exclude: Sequence[Sequence[int] | None],
    active: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-request item mask bool [R, num_items] (the old ``build_item_mask``: a request with
    an allow list may return only those items, then its exclude list and the retired items
    are removed)."""
    r = len(allow)

    def flat(lists: Sequence[Sequence[int] | None]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [i for i, items in enumerate(lists) for _ in items or ()]
        cols = [int(j) for items in lists for j in items or ()]
        bad = [j for j in cols if not 0 <= j < num_items]
        if bad:
            raise ValueError(f"item {bad[0]} outside 0..{num_items - 1}")
        return torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64)

    mask = torch.ones(r, num_items, dtype=torch.bool)
    restricted = torch.tensor([a is not None for a in allow], dtype=torch.bool)
    if bool(restricted.any()):
        mask[restricted] = False
        mask[flat(allow)] = True
    if any(e for e in exclude):
        mask[flat(exclude)] = False
    if active is not None:
        mask &= active
    return mask


def ranked_prefix_counts(trie: DenseTrie, item_mask: torch.Tensor) -> torch.Tensor:
    """Prefix sums of the item mask in ranked order: bool [R, N] -> int64 [R, N + 1]."""
    ranked = item_mask[:, trie.order].to(torch.int64)
    return torch.nn.functional.pad(torch.cumsum(ranked, dim=1), (1, 0))


def allowed_codes(trie: DenseTrie, level: int, nodes: torch.Tensor,
                  counts: torch.Tensor | None = None) -> torch.Tensor:
    """Allowed next codes of each beam's node: ``nodes`` int64 [R, B] (negative: dead beam),
    ``counts`` from :func:`ranked_prefix_counts` (``None``: only the trie). bool [R, B, K]."""
    r, b = nodes.shape
    valid = (nodes >= 0)[..., None]
    safe = nodes.clamp(min=0)
    if counts is None:
        return trie.allowed[level][safe] & valid
    start = trie.slot_start[level][safe].reshape(r, -1)
    end = trie.slot_end[level][safe].reshape(r, -1)
    ok = counts.gather(1, end) > counts.gather(1, start)
    return ok.view(r, b, -1) & valid
