"""Prefix trie over Semantic IDs as dense per-level tensors (STATIC-style) for constrained decoding.

Level ``l`` has ``num_nodes_l`` nodes (one per distinct ID prefix of length ``l``; level 0 has
the single root node 0) and ``K_l`` possible codes. Nodes are numbered in lexicographic order of
their prefixes, and items are also ranked lexicographically by ID, so every (node, code) slot
covers a contiguous range ``[slot_start, slot_end)`` of ranked items. That makes "is some allowed
item under this node" a prefix-sum lookup, see :func:`level_masks` and :func:`allowed_codes`.

All per-level functions work on the device of the trie and the given tensors (no host syncs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.catalog.semantic_ids import SemanticIndex


@dataclass
class SemanticTrie:
    """Dense trie tensors; ``L`` = number of levels, ``N`` = number of items.

    * ``allowed[l]``: bool [num_nodes_l, K_l], whether code ``c`` continues some item's ID;
    * ``child[l]`` (``l < L-1``): int64 [num_nodes_l, K_l], node at level l+1 or -1;
    * ``leaf_item``: int64 [num_nodes_{L-1}, K_{L-1}], item index at the last level or -1;
    * ``item_node[l]``: int64 [N], node at level l on each item's path;
    * ``rank``: int64 [N], lexicographic rank of each item's ID (``order`` is its inverse);
    * ``slot_start[l]`` / ``slot_end[l]``: int64 [num_nodes_l, K_l], ranked item range per slot.
    """

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

    @property
    def device(self) -> torch.device:
        """Device of the trie tensors."""
        return self.rank.device

    @classmethod
    def from_index(cls, index: SemanticIndex) -> SemanticTrie:
        """Build the trie of a :class:`SemanticIndex` (on the device of its codes)."""
        return cls.from_codes(index.codes, index.codebook_sizes)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, codebook_sizes: Sequence[int]) -> SemanticTrie:
        """Build from codes int64 [N, L]; IDs must be unique and within ``codebook_sizes``."""
        codes = codes.to(torch.int64)
        sizes = [int(k) for k in codebook_sizes]
        n, levels = codes.shape
        if n == 0:
            raise ValueError("cannot build a trie over an empty catalog")
        if levels != len(sizes) or levels == 0:
            raise ValueError(f"codes [{n}, {levels}] do not match codebook sizes {sizes}")
        dev = codes.device
        limit = torch.tensor(sizes, device=dev)
        if bool(((codes < 0) | (codes >= limit)).any()):
            raise ValueError(f"codes outside the codebook sizes {sizes}")
        uniq, rank = torch.unique(codes, dim=0, return_inverse=True)
        if uniq.shape[0] != n:
            raise ValueError(f"{n - uniq.shape[0]} duplicate Semantic IDs; IDs must be unique")
        order = torch.empty_like(rank)
        order[rank] = torch.arange(n, device=dev)
        # ranked codes are sorted lexicographically
        ranked = codes[order]
        item_node = [torch.zeros(n, dtype=torch.int64, device=dev)]
        num_nodes = [1]
        for level in range(1, levels):
            _, inv = torch.unique(codes[:, :level], dim=0, return_inverse=True)
            item_node.append(inv)
            num_nodes.append(int(inv.max()) + 1)
        allowed, child, slot_start, slot_end = [], [], [], []
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
            # slot ids are non-decreasing along the ranked items
            slots = item_node[level][order] * k + ranked[:, level]
            all_slots = torch.arange(shape[0] * k, device=dev)
            slot_start.append(torch.searchsorted(slots, all_slots).view(shape))
            slot_end.append(torch.searchsorted(slots, all_slots, right=True).view(shape))
        return cls(sizes, allowed, child, leaf_item, item_node, rank, order, slot_start, slot_end)

    def to(self, device: torch.device | str) -> SemanticTrie:
        """A copy with every tensor on ``device``."""

        def mv(ts: list[torch.Tensor]) -> list[torch.Tensor]:
            return [t.to(device) for t in ts]

        return SemanticTrie(
            self.codebook_sizes,
            mv(self.allowed),
            mv(self.child),
            self.leaf_item.to(device),
            mv(self.item_node),
            self.rank.to(device),
            self.order.to(device),
            mv(self.slot_start),
            mv(self.slot_end),
        )

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Item index of each code tuple [..., L] -> int64 [...], -1 where no item has that ID."""
        flat = codes.reshape(-1, self.num_levels).to(device=self.device, dtype=torch.int64)
        node = torch.zeros(flat.shape[0], dtype=torch.int64, device=self.device)
        ok = torch.ones(flat.shape[0], dtype=torch.bool, device=self.device)
        for level, k in enumerate(self.codebook_sizes):
            code = flat[:, level]
            ok = ok & (code >= 0) & (code < k)
            code = code.clamp(0, k - 1)
            table = self.child[level] if level + 1 < self.num_levels else self.leaf_item
            nxt = table[node, code]
            ok = ok & (nxt >= 0)
            node = nxt.clamp(min=0)
        item = torch.where(ok, node, torch.full_like(node, -1))
        return item.reshape(codes.shape[:-1])


def build_item_mask(
    num_items: int,
    allow: Sequence[Sequence[int] | None] | None = None,
    exclude: Sequence[Sequence[int] | None] | None = None,
    num_requests: int | None = None,
    device: torch.device | str | None = None,
    active: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-request item mask bool [R, num_items] from allow lists and exclude lists.

    A request with an allow list (not ``None``) may only return those items; otherwise every
    item. Items in its exclude list are then removed, and so are, for every request, the items
    that ``active`` (bool [num_items], the catalog's live items) marks False. ``R`` is the
    length of the given lists.
    """
    lengths = {len(x) for x in (allow, exclude) if x is not None}
    if num_requests is not None:
        lengths.add(num_requests)
    if len(lengths) > 1:
        raise ValueError(f"allow/exclude/num_requests disagree on the request count: {lengths}")
    r = lengths.pop() if lengths else 1

    def flat(lists: Sequence[Sequence[int] | None], what: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [i for i, items in enumerate(lists) for _ in items or ()]
        cols = [int(j) for items in lists for j in items or ()]
        bad = [(i, j) for i, j in zip(rows, cols, strict=True) if not 0 <= j < num_items]
        if bad:
            raise ValueError(f"{what} list of request {bad[0][0]} has item {bad[0][1]} "
                             f"outside 0..{num_items - 1}")
        return (torch.tensor(rows, dtype=torch.int64, device=device),
                torch.tensor(cols, dtype=torch.int64, device=device))

    mask = torch.ones(r, num_items, dtype=torch.bool, device=device)
    if allow is not None:
        restricted = torch.tensor([a is not None for a in allow], dtype=torch.bool, device=device)
        mask[restricted] = False
        mask[flat(allow, "allow")] = True
    if exclude is not None:
        mask[flat(exclude, "exclude")] = False
    if active is not None:
        mask &= active.to(device=mask.device, dtype=torch.bool)
    return mask


def ranked_prefix_counts(trie: SemanticTrie, item_mask: torch.Tensor) -> torch.Tensor:
    """Prefix sums of the item mask in ranked order: bool [R, N] -> int64 [R, N + 1]."""
    ranked = item_mask[:, trie.order].to(torch.int64)
    return torch.nn.functional.pad(torch.cumsum(ranked, dim=1), (1, 0))


def level_masks(trie: SemanticTrie, item_mask: torch.Tensor) -> list[torch.Tensor]:
    """Per-request allowed codes at every level: item mask bool [R, N] -> level l: [R, n_l, K_l].

    Slot (node, code) is allowed iff some allowed item lies under it. Memory is
    ``R * num_nodes_l * K_l`` per level; for beam search prefer :func:`allowed_codes`.
    """
    counts = ranked_prefix_counts(trie, item_mask)
    r = item_mask.shape[0]
    out = []
    for start, end in zip(trie.slot_start, trie.slot_end, strict=True):
        s = counts.gather(1, start.reshape(1, -1).expand(r, -1))
        e = counts.gather(1, end.reshape(1, -1).expand(r, -1))
        out.append((e > s).view(r, *start.shape))
    return out


def allowed_codes(
    trie: SemanticTrie,
    level: int,
    nodes: torch.Tensor,
    item_mask: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Allowed next codes for the current nodes of each request's beams.

    ``nodes``: int64 [R, B] node ids at ``level`` (negative = dead beam, nothing allowed).
    ``item_mask``: bool [R, N] or ``None`` (only the trie constraint); ``counts`` may pass the
    precomputed :func:`ranked_prefix_counts` to reuse it across levels. Returns bool [R, B, K_l].
    """
    r, b = nodes.shape
    valid = (nodes >= 0)[..., None]
    safe = nodes.clamp(min=0)
    if item_mask is None and counts is None:
        return trie.allowed[level][safe] & valid
    if counts is None:
        counts = ranked_prefix_counts(trie, item_mask)
    # [R, B, K] ranked item ranges of the candidate slots
    start = trie.slot_start[level][safe].reshape(r, -1)
    end = trie.slot_end[level][safe].reshape(r, -1)
    ok = counts.gather(1, end) > counts.gather(1, start)
    return ok.view(r, b, -1) & valid
