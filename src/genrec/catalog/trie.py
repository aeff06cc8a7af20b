"""Prefix trie over Semantic IDs for constrained decoding: per level a dense table or CSR rows.

Items are ranked in lexicographic order of their IDs. Level ``l`` has one node per distinct ID
prefix of length ``l`` (level 0: the root), numbered in that order, and each node's *edges*
(code -> child) are its distinct next codes in increasing order, numbered level-wide in the
same order. That numbering gives three invariants the search relies on:

* the child of edge ``e`` at level ``l`` is node ``e`` at level ``l + 1``;
* at the last level, edge ``e`` is the item of rank ``e``;
* the items under edge ``e`` at level ``l`` are the ranks ``[first(e), first(e + 1))``, where
  ``first`` follows the row starts down to the last level (:meth:`SemanticTrie.edge_ranks`).

Storage (STATIC-style): every level keeps its row starts ``row_ptr`` [nodes + 1]; a level whose
``nodes x K`` table is small or well filled also keeps it dense (``table`` [nodes, K]: edge id or
-1), a sparse one keeps only its edges' codes in CSR order (``codes`` [edges]). Indices are
int32 where they fit. About 15 bytes per item at 10M items with 3 x 256 codes plus a dedup
level, against about 300 for a dense table per level.

Every per-step function works on the trie's device without host syncs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.catalog.semantic_ids import SemanticIndex, mixed_radix_key
from genrec.kernels import trie_expand_dense_op, trie_expand_op

# A level stays dense when its table has at most this many slots, or is at least 1/4 full.
_DENSE_SLOTS = 1 << 20
_DENSE_FILL = 0.25


def _index_dtype(limit: int) -> torch.dtype:
    return torch.int32 if limit < 2**31 - 1 else torch.int64


@dataclass(frozen=True)
class TrieLevel:
    """One level: ``row_ptr`` [nodes + 1] (node n's edges are ``row_ptr[n] .. row_ptr[n+1]``),
    and ``table`` [nodes, K] (edge id or -1; dense levels) or ``codes`` [edges] (sparse levels).
    ``max_degree``: the most edges of one node (a Python int, fixed at build)."""

    size: int
    row_ptr: torch.Tensor
    table: torch.Tensor | None
    codes: torch.Tensor | None
    max_degree: int

    @property
    def num_nodes(self) -> int:
        return int(self.row_ptr.shape[0]) - 1

    @property
    def dense(self) -> bool:
        return self.table is not None

    def to(self, device: torch.device | str) -> TrieLevel:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return TrieLevel(self.size, self.row_ptr.to(device), mv(self.table), mv(self.codes),
                         self.max_degree)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.row_ptr, self.table, self.codes)
                   if t is not None)


def _lex_order(codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    # ranked order of the rows of codes [N, L]: one sort of a mixed-radix key where it fits in
    # int64, else stable sorts from the last level to the first
    if math.prod(sizes) < 2**62:
        return torch.argsort(mixed_radix_key(codes, sizes))
    order = torch.arange(codes.shape[0], device=codes.device)
    for level in reversed(range(len(sizes))):
        order = order[torch.sort(codes[order, level], stable=True).indices]
    return order


@dataclass(frozen=True)
class SemanticTrie:
    """The trie of a set of items (see the module docstring); ``N`` = number of items.

    ``order`` [N]: the item id of each rank. ``rank_items`` / ``rank_values``: item ids sorted
    and their ranks (item -> rank by binary search; ``rank_items`` is ``None`` when the items are
    exactly ``0 .. N-1``, then ``rank_values[item]`` is the rank).
    """

    codebook_sizes: list[int]
    levels: list[TrieLevel]
    order: torch.Tensor
    rank_items: torch.Tensor | None
    rank_values: torch.Tensor

    @property
    def num_levels(self) -> int:
        """Number of code levels."""
        return len(self.codebook_sizes)

    @property
    def num_items(self) -> int:
        """Number of items (leaves)."""
        return int(self.order.shape[0])

    @property
    def device(self) -> torch.device:
        """Device of the trie tensors."""
        return self.order.device

    def nbytes(self) -> int:
        """Bytes held by the trie's tensors."""
        extra = [t for t in (self.order, self.rank_items, self.rank_values) if t is not None]
        return sum(level.nbytes() for level in self.levels) + sum(
            t.numel() * t.element_size() for t in extra)

    @classmethod
    def from_index(cls, index: SemanticIndex) -> SemanticTrie:
        """Build the trie of a :class:`SemanticIndex` (items ``0 .. N-1``)."""
        return cls.from_codes(index.codes, index.codebook_sizes)

    @classmethod
    def from_codes(
        cls, codes: torch.Tensor, codebook_sizes: Sequence[int],
        items: torch.Tensor | None = None,
    ) -> SemanticTrie:
        """Build from codes [N, L] of items ``items`` [N] (default ``0 .. N-1``, on the codes'
        device). IDs must be unique and within ``codebook_sizes``."""
        codes = torch.as_tensor(codes).to(torch.int64)
        sizes = [int(k) for k in codebook_sizes]
        n, n_levels = codes.shape
        if n == 0:
            raise ValueError("cannot build a trie over an empty catalog")
        if n_levels != len(sizes) or n_levels == 0:
            raise ValueError(f"codes [{n}, {n_levels}] do not match codebook sizes {sizes}")
        dev = codes.device
        if bool(((codes < 0) | (codes >= torch.tensor(sizes, device=dev))).any()):
            raise ValueError(f"codes outside the codebook sizes {sizes}")
        order = _lex_order(codes, sizes)
        ranked = codes[order]
        # starts[l][i]: ranked item i begins a new prefix of length l + 1
        new = torch.zeros(n, dtype=torch.bool, device=dev)
        new[0] = True
        levels, nodes = [], 1
        node_of = torch.zeros(n, dtype=torch.int64, device=dev)  # node at level l per item
        for level, k in enumerate(sizes):
            step = torch.ones(n, dtype=torch.bool, device=dev)
            step[1:] = ranked[1:, level] != ranked[:-1, level]
            new = new | step
            if level + 1 == n_levels and not bool(new.all()):
                raise ValueError(f"{n - int(new.sum())} duplicate Semantic IDs; IDs must be "
                                 "unique")
            edge_pos = torch.nonzero(new).flatten()  # first ranked item under each edge
            parent = node_of[edge_pos]
            counts = torch.bincount(parent, minlength=nodes)
            itype = _index_dtype(edge_pos.numel() + 1)
            row_ptr = torch.zeros(nodes + 1, dtype=itype, device=dev)
            row_ptr[1:] = torch.cumsum(counts, 0).to(itype)
            edge_codes = ranked[edge_pos, level]
            table = codes_out = None
            if nodes * k <= _DENSE_SLOTS or edge_pos.numel() >= _DENSE_FILL * nodes * k:
                table = torch.full((nodes, k), -1, dtype=itype, device=dev)
                table[parent, edge_codes] = torch.arange(edge_pos.numel(), device=dev,
                                                         dtype=itype)
            else:
                codes_out = edge_codes.to(torch.int16 if k <= 2**15 - 1 else torch.int32)
            levels.append(TrieLevel(k, row_ptr, table, codes_out, int(counts.max())))
            node_of = torch.cumsum(new.to(torch.int64), 0) - 1
            nodes = int(edge_pos.numel())
        itype = _index_dtype(n + 1)
        if items is None:
            item_of_rank = order.to(itype)
            rank_items, rank_values = None, torch.empty(n, dtype=itype, device=dev)
            rank_values[order] = torch.arange(n, dtype=itype, device=dev)
        else:
            items = torch.as_tensor(items, device=dev).to(torch.int64)
            if items.shape != (n,):
                raise ValueError(f"items must be [{n}], got {tuple(items.shape)}")
            item_of_rank = items[order]
            sorted_items, by_item = torch.sort(items)
            if n > 1 and bool((sorted_items[1:] == sorted_items[:-1]).any()):
                raise ValueError("item ids of a trie must be unique")
            ranks = torch.empty(n, dtype=torch.int64, device=dev)
            ranks[order] = torch.arange(n, device=dev)
            rank_items, rank_values = sorted_items, ranks[by_item].to(itype)
        return cls(sizes, levels, item_of_rank, rank_items, rank_values)

    def to(self, device: torch.device | str) -> SemanticTrie:
        """A copy with every tensor on ``device``."""
        return SemanticTrie(
            self.codebook_sizes, [level.to(device) for level in self.levels],
            self.order.to(device),
            None if self.rank_items is None else self.rank_items.to(device),
            self.rank_values.to(device),
        )

    # -- per beam step ----------------------------------------------------------------------

    def expand(self, level: int, nodes: torch.Tensor) -> torch.Tensor:
        """The edges of ``nodes`` [...] (level-``level`` node ids, negative: none) by code:
        int64 [..., K] (edge id, -1 where the node has no such code)."""
        lv = self.levels[level]
        if nodes.device.type == "cpu":  # one native pass over the nodes' rows
            if lv.table is None and (csr := trie_expand_op()) is not None:
                return csr(nodes.to(torch.int64), lv.row_ptr, lv.codes, lv.size)
            if lv.table is not None and (dense := trie_expand_dense_op()) is not None:
                return dense(nodes.to(torch.int64), lv.table)
        valid = nodes >= 0
        safe = nodes.clamp(min=0).to(torch.int64)
        if lv.table is not None:
            edges = lv.table[safe].to(torch.int64)
            return edges.masked_fill(~valid[..., None], -1)
        start = lv.row_ptr[safe].to(torch.int64)
        degree = torch.where(valid, lv.row_ptr[safe + 1].to(torch.int64) - start, 0)
        steps = torch.arange(max(lv.max_degree, 1), device=nodes.device)
        ok = steps < degree[..., None]  # [..., D]
        edge = start[..., None] + steps
        code = lv.codes[edge.clamp(max=lv.codes.shape[0] - 1)].to(torch.int64)
        out = torch.full((*nodes.shape, lv.size + 1), -1, dtype=torch.int64,
                         device=nodes.device)
        # edges a node lacks go to the spare column K, dropped below
        out.scatter_(-1, torch.where(ok, code, lv.size), torch.where(ok, edge, -1))
        return out[..., : lv.size]

    def edge_ranks(self, level: int, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ranked items under ``edges`` (level-``level`` edge ids >= 0): ``[start, end)``,
        int64, both shaped like ``edges``."""
        start, end = edges.to(torch.int64), edges.to(torch.int64) + 1
        for deeper in self.levels[level + 1 :]:
            start = deeper.row_ptr[start].to(torch.int64)
            end = deeper.row_ptr[end].to(torch.int64)
        return start, end

    def leaf_items(self, edges: torch.Tensor) -> torch.Tensor:
        """Item ids of last-level edges (-1 where the edge is negative): int64, same shape."""
        items = self.order[edges.clamp(min=0)].to(torch.int64)
        return items.masked_fill(edges < 0, -1)

    # -- lookups ----------------------------------------------------------------------------

    def ranks(self, items: torch.Tensor) -> torch.Tensor:
        """Rank of each item id [...] in this trie, -1 where the trie does not hold it."""
        items = items.to(device=self.device, dtype=torch.int64)
        n = self.num_items
        if self.rank_items is None:
            ok = (items >= 0) & (items < n)
            return torch.where(ok, self.rank_values[items.clamp(0, n - 1)].to(torch.int64), -1)
        pos = torch.searchsorted(self.rank_items, items).clamp(max=n - 1)
        ok = self.rank_items[pos] == items
        return torch.where(ok, self.rank_values[pos].to(torch.int64), -1)

    def child(self, level: int, nodes: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The edge of each node [M] for its code [M] (int64, -1 where the node is negative
        or has no such code): one table read per dense level, ``max_degree`` reads of the
        node's row per CSR level (not ``K`` as with :meth:`expand`)."""
        lv = self.levels[level]
        ok = (nodes >= 0) & (codes >= 0) & (codes < lv.size)
        safe = nodes.clamp(min=0)
        if lv.table is not None:
            edge = lv.table[safe, codes.clamp(0, lv.size - 1)].to(torch.int64)
            return torch.where(ok, edge, -1)
        start = lv.row_ptr[safe].to(torch.int64)
        degree = lv.row_ptr[safe + 1].to(torch.int64) - start
        steps = torch.arange(max(lv.max_degree, 1), device=nodes.device)
        edge = start[:, None] + steps  # [M, D]
        row_code = lv.codes[edge.clamp(max=lv.codes.shape[0] - 1)].to(torch.int64)
        hit = (steps < degree[:, None]) & (row_code == codes[:, None]) & ok[:, None]
        return torch.where(hit, edge, -1).amax(dim=1)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Item id of each code tuple [..., L] -> int64 [...], -1 where no item has that ID."""
        flat = codes.reshape(-1, self.num_levels).to(device=self.device, dtype=torch.int64)
        node = torch.zeros(flat.shape[0], dtype=torch.int64, device=self.device)
        for level in range(self.num_levels):
            node = self.child(level, node, flat[:, level])
        return self.leaf_items(node).reshape(codes.shape[:-1])
