"""Scoring on fixed grids: static buffers per grid shape, replayed as CUDA graphs on a GPU.

A scoring batch whose candidates all have ``k`` tokens (DuoLM: k virtual item tokens; a
label or head read at the last one) runs on a grid (:mod:`genrec.model.score_grid`): requests
padded to a request bucket, prefixes to a prefix bucket, candidates per request to a power of
two. A :class:`ScoreRunner` per grid shape and read-out holds the grid's input embeddings,
used prefix lengths and output scores; a batch is scattered into the grid (padding rows are
zeros: harmless, their scores dropped), the forward and read-out run (on CUDA: one captured
graph, replayed), and each real candidate's score is gathered back. Other batches (candidates
of several lengths, ``loglik``, grids above the bounds) take the packed path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from genrec.engine.batch import PackedBatch
from genrec.engine.params import ScoreParams
from genrec.engine.runner_pool import RunnerPool, bucket
from genrec.engine.search_buffers import prefix_bucket
from genrec.model.decoder import DecoderLM
from genrec.model.score_grid import ScoreGridLayout
from genrec.utils.cuda_graphs import capture
from genrec.utils.device_lock import DeviceLock
from genrec.utils.sizes import next_power_of_two

MAX_GRID_TOKENS = 1 << 16


@dataclass(frozen=True)
class GridKey:
    """A grid's shape and read-out: what a runner (and its graph) is made for."""

    requests: int
    prefix_cap: int
    width: int
    branch_len: int
    mode: str
    labels: tuple[int, ...]
    softmax: bool


def grid_key(batch: PackedBatch, params: ScoreParams,
             request_buckets: tuple[int, ...] | None) -> GridKey | None:
    """The grid of ``batch`` (``None``: it takes the packed path)."""
    if params.mode not in ("labels", "head") or not batch.branch_lens:
        return None
    k = batch.branch_lens[0]
    if any(n != k for n in batch.branch_lens):
        return None
    rows = bucket(len(batch.prefix_lens), request_buckets)
    if rows is None:
        return None
    width = next_power_of_two(max(batch.branch_counts))
    cap = prefix_bucket(max(batch.prefix_lens))
    if rows * (cap + width * k) > MAX_GRID_TOKENS:
        return None
    labels = tuple(params.label_token_ids or ()) if params.mode == "labels" else ()
    return GridKey(rows, cap, width, k, params.mode, labels, params.apply_softmax)


def _segments(starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``starts[i], starts[i] + 1, ..., starts[i] + lens[i] - 1`` for every i, concatenated."""
    total = int(lens.sum())
    first = torch.cumsum(lens, 0) - lens
    seg = torch.repeat_interleave(torch.arange(lens.numel()), lens, output_size=total)
    return starts[seg] + torch.arange(total) - first[seg]


class ScoreRunner:
    """The static buffers (and, on CUDA, the graph) of one :class:`GridKey`."""

    def __init__(self, model: DecoderLM, key: GridKey, graph: bool,
                 pool: object | None = None, capture_lock: DeviceLock | None = None
                 ) -> None:
        self.model, self.key, self.use_graph, self.pool = model, key, graph, pool
        self.capture_lock = capture_lock or DeviceLock()
        dev, hidden = model.device, model.config.hidden_size
        tokens = key.requests * (key.prefix_cap + key.width * key.branch_len)
        self.embeds = torch.zeros(tokens, hidden, dtype=model.dtype, device=dev)
        self.used = torch.zeros(key.requests, dtype=torch.long, device=dev)
        self.labels = torch.tensor(key.labels, dtype=torch.long, device=dev)
        cols = max(len(key.labels), 1) if key.mode == "labels" else 1
        self.out = torch.zeros(key.requests * key.width, cols, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.embeds, self.used,
                                                                  self.out))

    def load(self, batch: PackedBatch, embeds: torch.Tensor) -> torch.Tensor:
        """Scatter the packed batch's input embeddings [T, H] into the grid; returns the grid
        row of each real candidate's score (on the device)."""
        key, dev = self.key, self.embeds.device
        n_req, k = len(batch.prefix_lens), key.branch_len
        p_len = torch.tensor(batch.prefix_lens, dtype=torch.long)
        count = torch.tensor(batch.branch_counts, dtype=torch.long)
        r = torch.arange(n_req)
        # packed order: request after request, its prefix then its candidates; the grid's
        # segments for them: prefix slots of row r, candidate tokens of row r
        starts = torch.stack((r * key.prefix_cap,
                              key.requests * key.prefix_cap + r * key.width * k), 1).view(-1)
        lens = torch.stack((p_len, count * k), 1).view(-1)
        self.embeds.zero_()
        self.embeds.index_copy_(0, _segments(starts, lens).to(dev), embeds)
        self.used.zero_()
        self.used[:n_req].copy_(p_len)
        return _segments(r * key.width, count).to(dev)

    def _forward(self) -> torch.Tensor:
        key, model = self.key, self.model
        layout = ScoreGridLayout(self.used, key.prefix_cap, key.width, key.branch_len)
        hidden = model(self.embeds, layout.positions(), layout)[layout.last_rows()]
        if key.mode == "head":
            return model.score_head(hidden).float()
        picked = model.label_logits(hidden, self.labels)
        if key.softmax:
            return torch.softmax(picked, dim=-1)
        return picked - model.log_normalizer(hidden)[:, None]

    def run(self) -> torch.Tensor:
        """Scores of every grid candidate [R * C, K] (K = 1 for the head), on the device."""
        if not self.use_graph:
            return self._forward()
        if self.graph is None:
            with self.capture_lock:  # no other device work on this device meanwhile
                self.graph = capture(lambda: self.out.copy_(self._forward()), self.pool)
        self.graph.replay()
        return self.out


class ScoreRunnerPool:
    """The grid runners of one engine (least recently used dropped past ``max_runners`` or
    ``max_bytes``); ``enabled``: whether batches use them. One batch at a time."""

    def __init__(self, model: DecoderLM, searches: RunnerPool, enabled: bool) -> None:
        # the search runners' settings, capture lock and graph memory pool
        self.model, self.enabled = model, enabled
        config = searches.config
        self.request_buckets, self.graphs = config.request_buckets, config.graphs
        self.max_runners, self.max_bytes = config.max_runners, config.max_bytes
        self.capture_lock, self._pool = searches.capture_lock, searches.graph_pool
        self._runners: OrderedDict[GridKey, ScoreRunner] = OrderedDict()
        self._lock = threading.Lock()

    def nbytes(self) -> int:
        """Bytes of the grids' buffers kept now."""
        with self._lock:
            return sum(r.nbytes for r in self._runners.values())

    def kept_runners(self) -> dict[GridKey, ScoreRunner]:
        """The grid runners kept now by grid, least recently used first (for inspection)."""
        with self._lock:
            return dict(self._runners)

    def release(self) -> None:
        """Drop every kept grid runner (their buffers and graphs)."""
        with self._lock:
            self._runners.clear()

    def key(self, batch: PackedBatch, params: ScoreParams) -> GridKey | None:
        """The grid ``batch`` runs on, ``None`` for the packed path."""
        return grid_key(batch, params, self.request_buckets) if self.enabled else None

    def score(self, key: GridKey, batch: PackedBatch, embeds: torch.Tensor) -> torch.Tensor:
        """Scores of every candidate of ``batch`` on the grid ``key``: [NB, K] (labels) or
        [NB] (head), fp32, on the device."""
        with self._lock:
            runner = self._runners.pop(key, None)
            if runner is None:
                runner = ScoreRunner(self.model, key, self.graphs, self._pool,
                                     self.capture_lock)
            self._runners[key] = runner
            while len(self._runners) > 1 and (
                    len(self._runners) > self.max_runners
                    or sum(r.nbytes for r in self._runners.values()) > self.max_bytes):
                self._runners.popitem(last=False)
            cands = runner.load(batch, embeds)
            scores = runner.run()[cands]
        return scores[:, 0] if key.mode == "head" else scores
