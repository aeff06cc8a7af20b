"""Item filters of a constrained beam search, as sorted ranks: cost O(filter size), not O(N).

A trie edge covers a contiguous range of ranked items (see :mod:`genrec.catalog.trie`), so a
filter only matters at the *ancestor edges* of the items it names: an edge is closed when
every item under it is dead (retired, or moved to another part of the catalog) or excluded by
the request, and, for a request with an allow list, open only when some allowed item lies
under it. Before a search, :meth:`PartFilter.prepare` turns the rank lists into per-level
sorted edge lists (each listed rank's ancestor at every level: ``O(list size x levels x
log N)``), with fixed shapes: a request's rows are as wide as its longest list (known on the
host), so building them reads no device value; a beam step then tests its candidate edges
against the lists of its level with one binary search each, and skips a level without lists
(no exclude / allow list, and no edge of the level closed by dead items). Nothing is built per
item of the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from genrec.catalog.trie import SemanticTrie
from genrec.utils.sizes import next_power_of_two

# per level: edges closed for every request (all items dead), edges closed per request [R, S]
# (dead or excluded), edges open per request [R, S] (some allowed item); None: no list
LevelLists = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]
# pads a sorted edge list: above every edge id
PAD_EDGE = 2**62


def count_in(sorted_ranks: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """How many of ``sorted_ranks`` lie in ``[start, end)``. ``sorted_ranks``: [S] (one list
    for everything) or [R, S] (one per request, rows sorted, padded with a value above every
    rank); ``start`` / ``end``: [R, ...]. Returns int64 like ``start``."""
    if sorted_ranks.numel() == 0:
        return torch.zeros_like(start)
    if sorted_ranks.dim() == 1:
        return torch.searchsorted(sorted_ranks, end) - torch.searchsorted(sorted_ranks, start)
    shape = start.shape
    s, e = start.reshape(shape[0], -1), end.reshape(shape[0], -1)
    got = torch.searchsorted(sorted_ranks, e) - torch.searchsorted(sorted_ranks, s)
    return got.view(shape)


def padded_ranks(request_of: torch.Tensor, ranks: torch.Tensor, num_requests: int,
                 pad: int, width: int | None = None) -> torch.Tensor:
    """Ranks grouped by request into sorted rows [R, width], padded with ``pad``.
    ``request_of`` / ``ranks``: int64 [M] (any order; duplicates are dropped, entries equal to
    ``pad`` are padding). ``width`` (>= 1): at least the most entries of one request, known on
    the host (default: M); nothing of the data is read, so no device value reaches the host."""
    device = ranks.device
    width = max(ranks.numel() if width is None else width, 1)
    out = torch.full((num_requests, width), pad, dtype=torch.int64, device=device)
    if ranks.numel() == 0:
        return out
    key = torch.sort(request_of * (pad + 1) + ranks.clamp(max=pad)).values
    req, rank = key // (pad + 1), key % (pad + 1)
    dup = torch.zeros_like(key, dtype=torch.bool)
    dup[1:] = key[1:] == key[:-1]
    # duplicates become padding, sorted after the request's ranks
    key = torch.sort(req * (pad + 1) + rank.masked_fill(dup, pad)).values
    req, rank = key // (pad + 1), key % (pad + 1)
    col = torch.arange(key.numel(), device=device) - torch.searchsorted(key, req * (pad + 1))
    out[req, col] = rank  # col < width: a request has at most ``width`` entries
    return out


def num_edges(trie: SemanticTrie, level: int) -> int:
    """Edges of a level (the next level's nodes; items at the last level)."""
    if level + 1 < trie.num_levels:
        return trie.levels[level + 1].num_nodes
    return trie.num_items


def ancestors(trie: SemanticTrie, ranks: torch.Tensor) -> list[torch.Tensor]:
    """The edge above each ranked item at every level (level l: int64 shaped like ``ranks``):
    up from the leaf edge (= the rank), the node owning edge ``e`` is the last row start
    <= ``e``, and node ``n`` of a level is edge ``n`` of the level above. The binary searches
    run on the ranks in sorted order (the map is monotone), which keeps them cache-friendly."""
    flat = ranks.reshape(-1).to(torch.int64)
    ordered, perm = torch.sort(flat)
    out = [ordered]
    for deeper in range(trie.num_levels - 1, 0, -1):
        ptr = trie.levels[deeper].row_ptr
        found = torch.searchsorted(ptr, out[-1].to(ptr.dtype), right=True)
        out.append(found.to(torch.int64) - 1)
    result = []
    for edges in reversed(out):
        back = torch.empty_like(edges)
        back[perm] = edges
        result.append(back.view(ranks.shape))
    return result


def dead_edges(trie: SemanticTrie, dead: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per level, the sorted edges all of whose items are in ``dead`` (ranks). Bottom-up: at
    the last level an edge is an item; above, an edge is closed when all its children are,
    so each level looks only at the parents of the closed edges below it (O(D log N) in all).
    A catalog state computes them once per update (:class:`PartFilter`)."""
    closed = torch.unique(dead.to(torch.int64))
    out = [closed]
    for level in range(trie.num_levels - 2, -1, -1):
        if closed.numel():
            ptr = trie.levels[level + 1].row_ptr  # its nodes are this level's edges
            parent = torch.searchsorted(ptr, closed.to(ptr.dtype), right=True).to(torch.int64) - 1
            edges, counts = torch.unique_consecutive(parent, return_counts=True)  # sorted
            closed = edges[counts == (ptr[edges + 1] - ptr[edges]).to(torch.int64)]
        out.append(closed)
    return tuple(reversed(out))


def _in_sorted(values: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    # edges [...] in the sorted list values [S] (S >= 1)
    edges = edges.contiguous()
    pos = torch.searchsorted(values, edges).clamp_(max=values.numel() - 1)
    return values[pos] == edges


def _in_rows(rows: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    # edges [R, ...] in row r of rows [R, S] (sorted rows)
    q = edges.reshape(rows.shape[0], -1).contiguous()
    pos = torch.searchsorted(rows, q).clamp_(max=rows.shape[1] - 1)
    return (rows.gather(1, pos) == q).view(edges.shape)


def _listed(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # (request, rank) of every entry of padded rows [R, S], padding included (fixed shapes)
    req = torch.arange(rows.shape[0], device=rows.device)[:, None].expand_as(rows)
    return req.reshape(-1), rows.reshape(-1)


@dataclass(frozen=True)
class PartFilter:
    """What a search may return from one trie: ``dead`` sorted ranks [D] (for every request),
    ``excluded`` [R, X] and ``allowed`` [R, A] (sorted rows padded with a value above every
    rank; allowed ranks are live and not excluded, excluded ones live), ``restricted`` bool
    [R] (the request has an allow list). Any of the lists may be empty. ``closed``: the
    :func:`dead_edges` of ``dead`` when the caller keeps them (else computed here)."""

    dead: torch.Tensor
    excluded: torch.Tensor | None = None
    allowed: torch.Tensor | None = None
    restricted: torch.Tensor | None = None
    closed: tuple[torch.Tensor, ...] | None = None
    _lists: dict[int, LevelLists] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)
    _above: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def trivial(self) -> bool:
        """Nothing is filtered: every item of the trie may be returned."""
        return self.dead.numel() == 0 and self.excluded is None and self.allowed is None

    def prepare(self, trie: SemanticTrie) -> PartFilter:
        """Build the per-level edge lists for ``trie`` now (once, before the search; their
        sizes are the request lists' widths: no device value is read). Returns ``self``."""
        if not self.trivial:
            for level in range(trie.num_levels):
                self._level(trie, level)
        return self

    def _listed_above(self, trie: SemanticTrie, which: str, rows: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        # (request, listed (not padding), the ancestors at every level) of every entry of
        # rows, once per list
        if which not in self._above:
            req, ranks = _listed(rows)
            listed = ranks < trie.num_items
            self._above[which] = (req, listed, ancestors(trie, ranks.clamp(max=trie.num_items - 1)))
        return self._above[which]

    def _level(self, trie: SemanticTrie, level: int) -> LevelLists:
        # Fixed shapes throughout (sorts, binary searches, padding): the lists' widths are the
        # request lists' (host-known) widths, so building them reads nothing from the device.
        if level in self._lists:
            return self._lists[level]
        edges_here = num_edges(trie, level)  # also the padding of this level's lists
        closed = self.closed if self.closed is not None else dead_edges(trie, self.dead)
        gone = closed[level] if closed[level].numel() else None
        blocked = opened = None
        if self.excluded is not None:
            req, listed, above = self._listed_above(trie, "excluded", self.excluded)
            key = torch.sort(req * (edges_here + 1)
                             + above[level].masked_fill(~listed, edges_here)).values
            req, edges = key // (edges_here + 1), key % (edges_here + 1)
            counts = (torch.searchsorted(key, key, right=True)
                      - torch.searchsorted(key, key))  # entries per (request, edge)
            first = torch.ones_like(key, dtype=torch.bool)
            first[1:] = key[1:] != key[:-1]
            start, end = trie.edge_ranks(level, edges.clamp(max=edges_here - 1))
            # closed for this request: its excluded items and the dead ones fill the edge
            full = (first & (edges < edges_here)
                    & (counts + count_in(self.dead, start, end) == end - start))
            blocked = padded_ranks(req, edges.masked_fill(~full, edges_here),
                                   self.excluded.shape[0], edges_here, self.excluded.shape[1])
        if self.allowed is not None:
            req, listed, above = self._listed_above(trie, "allowed", self.allowed)
            opened = padded_ranks(req, above[level].masked_fill(~listed, edges_here),
                                  self.allowed.shape[0], edges_here, self.allowed.shape[1])
        self._lists[level] = (gone, blocked, opened)
        return self._lists[level]

    def level_lists(self, trie: SemanticTrie, level: int) -> LevelLists:
        """The sorted edge lists of ``level`` (built by :meth:`prepare`): closed for every
        request [S], closed per request [R, S], open per request [R, S]; ``None``: none."""
        if self.trivial:
            return (None, None, None)
        return self._level(trie, level)

    def live(self, trie: SemanticTrie, level: int, edges: torch.Tensor) -> torch.Tensor:
        """Whether some returnable item lies under each edge: ``edges`` int64 [R, ...] (level
        ``level`` edge ids, -1: none) -> bool, same shape."""
        if self.trivial:
            return edges >= 0
        return live_edges(self._level(trie, level), self.restricted, edges)


def live_edges(lists: LevelLists, restricted: torch.Tensor | None, edges: torch.Tensor
               ) -> torch.Tensor:
    """Whether some returnable item lies under each edge [R, ...] (-1: none), given a level's
    lists (:meth:`PartFilter.level_lists`; lists may be padded with :data:`PAD_EDGE`) and
    ``restricted`` [R] (the requests with an allow list; needed when there is an open list)."""
    gone, blocked, opened = lists
    ok = edges >= 0
    if gone is not None:
        ok &= ~_in_sorted(gone, edges)
    if blocked is not None:
        ok &= ~_in_rows(blocked, edges)
    if opened is not None:
        restricted = restricted.view(-1, *([1] * (edges.dim() - 1)))
        ok = torch.where(restricted, (edges >= 0) & _in_rows(opened, edges), ok)
    return ok


def padded_lists(lists: LevelLists, num_requests: int, capacity: int | None = None
                 ) -> LevelLists:
    """``lists`` with ``num_requests`` rows (new rows empty) and each list padded with
    :data:`PAD_EDGE` to ``capacity`` entries (default: the next power of two), so that lists of
    searches of one shape have one shape (a captured step's static buffers)."""
    out = []
    for k, t in enumerate(lists):
        if t is None:
            out.append(None)
            continue
        cap = capacity or next_power_of_two(int(t.shape[-1]))
        if k == 0:
            shape = (max(cap, t.shape[0]),)
        else:
            shape = (num_requests, max(cap, t.shape[-1]))
        full = torch.full(shape, PAD_EDGE, dtype=torch.int64, device=t.device)
        if k == 0:
            full[: t.shape[0]] = t
        else:
            full[: t.shape[0], : t.shape[1]] = t
        out.append(full)
    return out[0], out[1], out[2]
