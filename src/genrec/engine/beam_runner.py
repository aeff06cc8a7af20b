"""Beam-search step runners: the levels of searches of one shape, over static buffers, replayed
as CUDA graphs on a GPU.

A :class:`BeamRunner` holds, per :class:`~genrec.engine.search_buffers.SearchBuffers` (a search
shape), catalog (its tries, kept alive by the runner) and filter-list shape, the filter lists'
padded buffers and, on CUDA, the captured graph of every level after the prompt forward
(:func:`genrec.engine.beam.search_levels`). A call copies its inputs into the buffers (padding
requests get prefix length 0 and empty filters: harmless rows whose results are dropped), runs
or replays the levels, and reads the first R rows. On the CPU the same runners run eagerly over
the same buffers. :mod:`genrec.engine.runner_pool` keeps them.
"""

from __future__ import annotations

import torch

from genrec.catalog.filters import LevelLists
from genrec.catalog.trie import SemanticTrie
from genrec.engine.beam import BeamResult, SearchInputs, search_levels
from genrec.engine.search_buffers import SearchBuffers
from genrec.engine.static_search import StaticSearch
from genrec.model.decoder import DecoderLM
from genrec.utils.cuda_graphs import capture
from genrec.utils.device_lock import DeviceLock


class BeamRunner:
    """The levels of searches of one shape over one catalog (``parts``, ``level_offsets``)
    with filter lists of one padded shape; ``graph``: capture them on CUDA."""

    def __init__(self, model: DecoderLM, buffers: SearchBuffers, parts: list[SemanticTrie],
                 level_offsets: list[int], lists: list[list[LevelLists]],
                 restricted: list[torch.Tensor | None], graph: bool,
                 pool: object | None = None, capture_lock: DeviceLock | None = None
                 ) -> None:
        # lists: padded to the buffers' rows (:func:`padded_lists`); copied in by load
        self.model, self.buffers, self.parts = model, buffers, parts
        self.level_offsets = list(level_offsets)
        rows = buffers.requests
        self.lists = [[tuple(None if t is None else torch.empty_like(t) for t in level)
                       for level in part] for part in lists]
        self.restricted = [None if r is None else torch.zeros(rows, dtype=torch.bool,
                                                              device=model.device)
                           for r in restricted]
        self.use_graph, self.pool = graph, pool
        self.capture_lock = capture_lock or DeviceLock()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.items = torch.full((rows, buffers.width), -1, dtype=torch.long,
                                device=model.device)
        self.scores = torch.zeros(rows, buffers.width, device=model.device)
        self.static: StaticSearch | None = None  # capacity-sized inputs (static runners)

    def load(self, lists: list[list[LevelLists]], restricted: list[torch.Tensor | None]
             ) -> None:
        """Copy a search's padded filter lists (shaped as this runner's: same key) and its
        ``restricted`` flags [R] in."""
        for mine, theirs in zip(self.lists, lists, strict=True):
            for level_mine, level_theirs in zip(mine, theirs, strict=True):
                for buf, t in zip(level_mine, level_theirs, strict=True):
                    if buf is not None:
                        buf.copy_(t)
        for buf, r in zip(self.restricted, restricted, strict=True):
            if buf is not None:
                buf.zero_()
                buf[: r.shape[0]].copy_(r)

    def _levels(self) -> BeamResult:
        b = self.buffers
        inputs = SearchInputs(b.hidden, b.prefix_len, self.lists, self.restricted)
        return search_levels(self.model, self.parts, self.level_offsets, b.width, inputs,
                             b.cache, b.ancestry)

    def run(self) -> BeamResult:
        """The levels over the loaded buffers: eager, or the captured graph (captured on the
        first call, after a warm-up run). Results: ``[rows, width]`` on the device."""
        if not self.use_graph:
            return self._levels()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return BeamResult(self.items, self.scores)

    def _capture(self) -> None:
        # under the capture lock: no other thread of this engine issues device work while a
        # stream captures (see genrec.engine.runner_pool.RunnerPool.capture_lock)
        with self.capture_lock:
            self._capture_now()

    def _capture_now(self) -> None:
        def step() -> None:
            out = self._levels()
            self.items.copy_(out.items)
            self.scores.copy_(out.scores)

        self.graph = capture(step, self.pool)
