"""Capacity-sized copies of what a captured search reads: the catalog's tries and the filter
lists, so that one graph serves every catalog version and filter size that fits.

A CUDA graph replays fixed addresses and fixed shapes. A search keyed by the catalog object
and the filter lists' shapes would capture again at every catalog update and every new
``exclude`` size. Here a runner owns, per part (the catalog's base and delta; a catalog
without a delta searches an empty one), a :class:`StaticTrie`: every tensor of the trie in a
buffer of a power-of-two capacity, the real rows copied in before each search and the rest
padded so that nothing reaches it (row starts repeat the last one: padded nodes have no
edges; dense rows and item ranks of -1); and per level the three filter lists in buffers of
power-of-two widths, padded with :data:`~genrec.catalog.filters.PAD_EDGE` (absent lists are
all padding, absent ``restricted`` flags False, which a search reads as "no filter").

A catalog or filter that no longer fits grows the capacities (at least doubling) and only
then is the graph captured again: captures grow with the logarithm of the catalog's growth,
not with updates or requests. What changes the searched code itself (a level switching
between dense and sparse storage, an index dtype) is part of the runner's key
(:meth:`StaticTrie.structure`).
"""

from __future__ import annotations

import torch

from genrec.catalog.filters import PAD_EDGE, LevelLists
from genrec.catalog.trie import SemanticTrie, TrieLevel
from genrec.utils.sizes import next_power_of_two

MIN_CAPACITY = 16


def grown(need: int, old: int = 0) -> int:
    """A capacity for ``need`` entries: ``old`` when it fits, else a power of two, at least
    :data:`MIN_CAPACITY` and double ``old``."""
    if old and need <= old:
        return old
    return max(next_power_of_two(max(need, MIN_CAPACITY)), 2 * old)


def _level_structure(lv: TrieLevel) -> tuple:
    data = lv.table if lv.table is not None else lv.codes
    return (lv.size, lv.table is not None, lv.row_ptr.dtype, data.dtype)


def structure(trie: SemanticTrie | None, sizes: list[int]) -> tuple:
    """What a searched trie's code depends on (``None``: an empty part, every level sparse)."""
    if trie is None:
        return tuple((k, False, torch.int32, torch.int32) for k in sizes)
    return tuple(_level_structure(lv) for lv in trie.levels)


class StaticTrie:
    """A trie's tensors in capacity-sized buffers (see the module docstring); :attr:`trie` is
    the :class:`SemanticTrie` a search walks (its ``num_items`` is the capacity)."""

    def __init__(self, key: tuple, caps: list[tuple[int, int, int]], order_cap: int,
                 device: torch.device) -> None:
        # caps per level: (nodes, stored rows or edges, max degree)
        self.key, self.caps, self.order_cap = key, caps, order_cap
        levels = []
        for (size, dense, ptr_dtype, data_dtype), (nodes, data, degree) in zip(key, caps,
                                                                                strict=True):
            row_ptr = torch.zeros(nodes + 1, dtype=ptr_dtype, device=device)
            if dense:
                table = torch.full((nodes, size), -1, dtype=data_dtype, device=device)
                levels.append(TrieLevel(size, row_ptr, table, None, degree))
            else:
                codes = torch.zeros(data, dtype=data_dtype, device=device)
                levels.append(TrieLevel(size, row_ptr, None, codes, degree))
        order = torch.full((order_cap,), -1, dtype=torch.int64, device=device)
        self.trie = SemanticTrie([k[0] for k in key], levels, order, None,
                                 torch.zeros(1, dtype=torch.int64, device=device))

    @staticmethod
    def needs(trie: SemanticTrie | None, levels: int) -> tuple[list[tuple[int, int, int]], int]:
        """The capacities ``trie`` needs: per level (nodes, stored rows or edges, max
        degree), and its items."""
        if trie is None:
            return [(1, 1, 1)] * levels, 1
        caps = []
        for lv in trie.levels:
            data = lv.table.shape[0] if lv.table is not None else lv.codes.shape[0]
            caps.append((lv.num_nodes, int(data), max(lv.max_degree, 1)))
        return caps, trie.num_items

    def fits(self, trie: SemanticTrie | None) -> bool:
        caps, items = self.needs(trie, len(self.caps))
        return items <= self.order_cap and all(
            n <= cn and d <= cd and g <= cg
            for (n, d, g), (cn, cd, cg) in zip(caps, self.caps, strict=True))

    @classmethod
    def for_trie(cls, key: tuple, trie: SemanticTrie | None, device: torch.device,
                 old: StaticTrie | None = None) -> StaticTrie:
        """Buffers that fit ``trie``, grown from ``old``'s capacities."""
        caps, items = cls.needs(trie, len(key))
        prev = old.caps if old is not None else [(0, 0, 0)] * len(caps)
        new = [(grown(n, pn), grown(d, pd), min(grown(g, pg), k[0]))
               for (n, d, g), (pn, pd, pg), k in zip(caps, prev, key, strict=True)]
        return cls(key, new, grown(items, old.order_cap if old is not None else 0), device)

    def load(self, trie: SemanticTrie | None) -> None:
        """Copy ``trie`` in (it must fit), padding the rest."""
        for lv, mine in zip(trie.levels if trie is not None else [None] * len(self.caps),
                            self.trie.levels, strict=True):
            if lv is None:
                mine.row_ptr.zero_()
                continue
            n = lv.num_nodes
            mine.row_ptr[: n + 1].copy_(lv.row_ptr)
            mine.row_ptr[n + 1 :].copy_(lv.row_ptr[n:].expand(mine.row_ptr.shape[0] - n - 1))
            if lv.table is not None:
                mine.table[:n].copy_(lv.table)
                mine.table[n:].fill_(-1)
            else:
                mine.codes[: lv.codes.shape[0]].copy_(lv.codes)
        order = self.trie.order
        if trie is not None:
            order[: trie.num_items].copy_(trie.order)
            order[trie.num_items :].fill_(-1)
        else:
            order.fill_(-1)


def list_widths(lists: list[LevelLists]) -> list[tuple[int, ...]]:
    """Per level, the widths the lists need (0 for an absent list)."""
    return [tuple(0 if t is None else int(t.shape[-1]) for t in level) for level in lists]


class StaticSearch:
    """The capacity-sized inputs of one search runner: a :class:`StaticTrie` per part and
    the filter lists' widths per part and level (see the module docstring)."""

    def __init__(self, tries: list[StaticTrie], list_caps: list[list[tuple[int, ...]]]) -> None:
        self.tries, self.list_caps = tries, list_caps

    @classmethod
    def fitting(cls, keys: list[tuple], parts: list[SemanticTrie | None],
                lists: list[list[LevelLists]], device: torch.device,
                old: StaticSearch | None = None) -> StaticSearch:
        """Capacities for ``parts`` and ``lists``, grown from ``old``'s."""
        tries = [StaticTrie.for_trie(k, p, device, old.tries[i] if old is not None else None)
                 for i, (k, p) in enumerate(zip(keys, parts, strict=True))]
        caps = []
        for i, part_lists in enumerate(lists):
            prev = old.list_caps[i] if old is not None else [(0, 0, 0)] * len(part_lists)
            caps.append([tuple(grown(w, c) for w, c in zip(need, cap, strict=True))
                         for need, cap in zip(list_widths(part_lists), prev, strict=True)])
        return cls(tries, caps)

    def fits(self, parts: list[SemanticTrie | None], lists: list[list[LevelLists]]) -> bool:
        """Whether ``parts`` and ``lists`` fit these capacities."""
        return all(t.fits(p) for t, p in zip(self.tries, parts, strict=True)) and all(
            w <= c for part_lists, part_caps in zip(lists, self.list_caps, strict=True)
            for need, cap in zip(list_widths(part_lists), part_caps, strict=True)
            for w, c in zip(need, cap, strict=True))

    @property
    def parts(self) -> list[SemanticTrie]:
        """The tries a search walks (the buffers)."""
        return [t.trie for t in self.tries]

    def load(self, parts: list[SemanticTrie | None]) -> None:
        """Copy the catalog's tries in."""
        for t, p in zip(self.tries, parts, strict=True):
            t.load(p)

    def padded(self, lists: list[list[LevelLists]], restricted: list[torch.Tensor | None],
               rows: int, device: torch.device
               ) -> tuple[list[list[LevelLists]], list[torch.Tensor]]:
        """``lists`` at these capacities (absent ones all padding) and ``restricted`` flags
        for ``rows`` requests (absent: False)."""
        out = []
        for part_lists, part_caps in zip(lists, self.list_caps, strict=True):
            levels = []
            for level, cap in zip(part_lists, part_caps, strict=True):
                full = []
                for k, (t, c) in enumerate(zip(level, cap, strict=True)):
                    shape = (c,) if k == 0 else (rows, c)
                    buf = torch.full(shape, PAD_EDGE, dtype=torch.int64, device=device)
                    if t is not None and k == 0:
                        buf[: t.shape[0]] = t
                    elif t is not None:
                        buf[: t.shape[0], : t.shape[1]] = t
                    full.append(buf)
                levels.append(tuple(full))
            out.append(levels)
        flags = []
        for r in restricted:
            buf = torch.zeros(rows, dtype=torch.bool, device=device)
            if r is not None:
                buf[: r.shape[0]] = r
            flags.append(buf)
        return out, flags
