"""The beam-search runners of one engine: static buffers per search shape and runners per
catalog and filter shape, kept within a count and a byte budget (least recently used dropped).

A search's shape is its request bucket, beam width, prefix bucket and levels. Per shape a
:class:`SearchBuffers` holds everything the levels read and write: the KV cache (prompts and
beam tails), each request's prompt-final hidden state and prefix length, the identity
ancestry; a :class:`~genrec.engine.beam_runner.BeamRunner` runs the levels over them. On the
CPU requests are not padded unless buckets are given (padding costs compute and saves nothing
without graphs). Above the largest request bucket a search runs eagerly at its own size.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from genrec.catalog.filters import LevelLists, PartFilter, padded_lists
from genrec.catalog.trie import SemanticTrie
from genrec.engine.beam import BeamResult, filter_inputs, prompt_forward
from genrec.engine.beam_runner import BeamRunner
from genrec.engine.search_buffers import SearchBuffers, prefix_bucket
from genrec.engine.static_search import StaticSearch, structure
from genrec.model.decoder import DecoderLM
from genrec.utils.device_lock import device_lock

if TYPE_CHECKING:
    from genrec.engine.engine_config import EngineConfig
    from genrec.engine.memory import MemoryBudget

GPU_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
STATIC_PARTS = 2  # a catalog's base and delta


def bucket(n: int, buckets: tuple[int, ...] | None) -> int | None:
    """The smallest bucket >= ``n`` (``None``: above the largest); no buckets: ``n`` itself."""
    if not buckets:
        return n
    return next((b for b in sorted(buckets) if b >= n), None)


def _shape_of(lists: list[list[LevelLists]]) -> tuple:
    return tuple(tuple(tuple(None if t is None else tuple(t.shape) for t in level)
                       for level in part) for part in lists)


@dataclass(frozen=True)
class RunnerConfig:
    """``request_buckets``: request counts a search is padded to (``None``: its own count);
    ``graphs``: capture runners as CUDA graphs (CUDA only); ``max_runners``: runners (and
    buffer sets) kept, least recently used dropped; ``max_bytes``: the most bytes of buffer
    sets kept (the memory budget's share, :attr:`MemoryBudget.search_buffers`; a search larger
    than that still runs, on buffers dropped after it); ``static``: runners read the catalog
    and the filter lists from capacity-sized copies (:mod:`genrec.engine.static_search`), so
    one runner serves every catalog version and filter size that fits."""

    request_buckets: tuple[int, ...] | None = None
    graphs: bool = False
    max_runners: int = 8
    max_bytes: int = 2 << 30
    static: bool = False


@dataclass(frozen=True)
class PoolStats:
    """What a :class:`RunnerPool` keeps now: ``buffer_sets``, ``runners`` and the buffers'
    ``bytes``; ``runners_made``: runners made since it was built (a runner made again for a
    shape seen before was dropped in between: on CUDA, a graph captured again)."""

    buffer_sets: int
    runners: int
    bytes: int
    runners_made: int


def runner_config(config: EngineConfig, device: torch.device, budget: MemoryBudget
                  ) -> RunnerConfig:
    """The runners an engine of ``config`` uses on ``device`` within ``budget``."""
    cuda = device.type == "cuda"
    buckets = config.search_request_buckets
    if buckets is None and cuda:
        buckets = GPU_REQUEST_BUCKETS
    graphs = cuda and config.cuda_graphs
    static = graphs if config.static_search is None else config.static_search
    return RunnerConfig(tuple(buckets) if buckets else None, graphs,
                        config.max_search_runners, budget.search_buffers, static)


class RunnerPool:
    """The runners of one engine, by search shape (least recently used dropped). Searches run
    one at a time (they share the buffers)."""

    def __init__(self, model: DecoderLM, config: RunnerConfig) -> None:
        self.model, self.config = model, config
        self._lock = threading.Lock()
        self._buffers: OrderedDict[tuple, SearchBuffers] = OrderedDict()
        self._runners: OrderedDict[tuple, BeamRunner] = OrderedDict()
        # the device's lock (genrec.utils.device_lock): held while a graph is captured, and by
        # device work beside the batches (the server's preparing thread, catalog builds)
        self.capture_lock = device_lock(model.device)
        # one memory pool for every graph of this engine (searches and scoring grids)
        self.graph_pool = torch.cuda.graph_pool_handle() if config.graphs else None
        self._made = 0

    def stats(self) -> PoolStats:
        """What the pool keeps now (see :class:`PoolStats`)."""
        with self._lock:
            return PoolStats(len(self._buffers), len(self._runners),
                             sum(b.nbytes() for b in self._buffers.values()), self._made)

    def kept_buffers(self) -> list[SearchBuffers]:
        """The buffer sets kept now, least recently used first (for inspection)."""
        with self._lock:
            return list(self._buffers.values())

    def kept_runners(self) -> list[BeamRunner]:
        """The runners kept now, least recently used first (for inspection)."""
        with self._lock:
            return list(self._runners.values())

    def release(self) -> None:
        """Drop every kept buffer set and runner (their graphs with them): after an
        out-of-memory error, or to make room for a larger batch."""
        with self._lock:
            self._evict(0, 0)

    def buffer_bytes(self, requests: int, width: int, prefix_cap: int, levels: int) -> int:
        """Bytes of the buffers of a search shape (made or not)."""
        return SearchBuffers.bytes_for(self.model.config, self.model.dtype, requests, width,
                                       prefix_cap, levels)

    def keeps(self, requests: int, width: int, prefix_cap: int, levels: int) -> bool:
        """Whether buffers of this shape are kept after their search (they fit the budget's
        share for search buffers)."""
        return self.buffer_bytes(requests, width, prefix_cap, levels) <= self.config.max_bytes

    def buffers(self, requests: int, width: int, prefix_cap: int, levels: int
                ) -> SearchBuffers:
        """The buffers of a search shape (made now if not kept). Kept: at most
        ``max_runners`` sets and ``max_bytes`` in all (least recently used dropped first,
        with their runners; a set larger than ``max_bytes`` alone serves its search and is
        dropped after it)."""
        key = (requests, width, prefix_cap, levels)
        found = self._buffers.pop(key, None)
        if found is None:
            self._evict(self.config.max_runners - 1, self.config.max_bytes)
            found = SearchBuffers(self.model, requests, width, prefix_cap, levels)
        self._buffers[key] = found
        self._evict(self.config.max_runners, self.config.max_bytes, keep=found)
        return found

    def _evict(self, count: int, max_bytes: int, keep: SearchBuffers | None = None) -> None:
        # drop least recently used buffer sets (and the runners over them) until at most
        # ``count`` sets of at most ``max_bytes`` in all are kept (``keep`` always stays)
        def over() -> bool:
            total = sum(b.nbytes() for b in self._buffers.values())
            return len(self._buffers) > count or total > max_bytes

        while self._buffers and over():
            key, oldest = next(iter(self._buffers.items()))
            if oldest is keep:
                break
            del self._buffers[key]
            for rkey in [k for k, r in self._runners.items() if r.buffers is oldest]:
                del self._runners[rkey]

    def runner(self, buffers: SearchBuffers, parts: list[SemanticTrie],
               level_offsets: list[int], lists: list[list[LevelLists]],
               restricted: list[torch.Tensor | None], graph: bool) -> BeamRunner:
        """The runner of these buffers, catalog and (padded) filter-list shapes."""
        # the runner keeps ``parts`` alive: their ids are not reused while it is kept
        key = (id(buffers), tuple(id(p) for p in parts), tuple(level_offsets),
               _shape_of(lists), tuple(r is not None for r in restricted), graph)
        found = self._runners.pop(key, None)
        if found is None:
            found = BeamRunner(self.model, buffers, parts, level_offsets, lists, restricted,
                               graph, self.graph_pool, self.capture_lock)
            self._made += 1
        self._runners[key] = found
        while len(self._runners) > self.config.max_runners:
            self._runners.popitem(last=False)
        return found

    def _static_runner(self, buffers: SearchBuffers, parts: list[SemanticTrie],
                       level_offsets: list[int], lists: list[list[LevelLists]],
                       restricted: list[torch.Tensor | None], graph: bool) -> BeamRunner:
        # the runner of these buffers and catalog structure, its capacities grown (and its
        # graph captured again) only when the catalog or the filters outgrow them; loaded
        sizes, rows, dev = parts[0].codebook_sizes, buffers.requests, self.model.device
        missing = STATIC_PARTS - len(parts)  # a catalog without a delta: an empty one
        full_parts: list[SemanticTrie | None] = [*parts, *[None] * missing]
        full_lists = lists + [[(None, None, None)] * len(sizes)] * missing
        full_restricted = restricted + [None] * missing
        keys = [structure(p, sizes) for p in full_parts]
        key = ("static", id(buffers), tuple(level_offsets), tuple(keys), graph)
        found = self._runners.pop(key, None)
        if found is None or not found.static.fits(full_parts, full_lists):
            static = StaticSearch.fitting(keys, full_parts, full_lists, dev,
                                          found.static if found is not None else None)
            padded, flags = static.padded(full_lists, full_restricted, rows, dev)
            found = BeamRunner(self.model, buffers, static.parts, level_offsets, padded, flags,
                               graph, self.graph_pool, self.capture_lock)
            found.static = static
            self._made += 1
        self._runners[key] = found
        while len(self._runners) > self.config.max_runners:
            self._runners.popitem(last=False)
        found.static.load(full_parts)
        found.load(*found.static.padded(full_lists, full_restricted, rows, dev))
        return found

    def search(self, parts: list[SemanticTrie], filters: list[PartFilter],
               level_offsets: list[int], embeds: torch.Tensor, prefix_lens: list[int],
               prefix_last: torch.Tensor, width: int) -> BeamResult:
        """Beam search of ``width`` for prompts ``embeds`` [T, H] (packed; ``prefix_lens``
        on the host, ``prefix_last`` [R] each prompt's last row, on the device): results
        [R, width] on the device."""
        with self._lock, torch.inference_mode():
            return self._search(parts, filters, level_offsets, embeds, prefix_lens,
                                prefix_last, width)

    def _search(self, parts: list[SemanticTrie], filters: list[PartFilter],
                level_offsets: list[int], embeds: torch.Tensor, prefix_lens: list[int],
                prefix_last: torch.Tensor, width: int) -> BeamResult:
        n_req, levels = len(prefix_lens), parts[0].num_levels
        rows = bucket(n_req, self.config.request_buckets)
        graph = self.config.graphs and rows is not None
        rows = rows or n_req
        buffers = self.buffers(rows, width, prefix_bucket(max(prefix_lens)), levels)
        hidden, lens = prompt_forward(self.model, embeds, prefix_lens, prefix_last,
                                      buffers.cache)
        buffers.load(hidden, lens)
        lists, restricted = filter_inputs(parts, filters)
        if self.config.static:
            runner = self._static_runner(buffers, parts, level_offsets, lists, restricted,
                                         graph)
        else:
            lists = [[padded_lists(level, rows) for level in part] for part in lists]
            runner = self.runner(buffers, parts, level_offsets, lists, restricted, graph)
            runner.load(lists, restricted)
        out = runner.run()
        # copies: the buffers belong to the next search
        result = BeamResult(out.items[:n_req].clone(), out.scores[:n_req].clone())
        if buffers.nbytes() > self.config.max_bytes:  # larger than all that is kept: not kept
            self._evict(0, self.config.max_bytes)
        return result
