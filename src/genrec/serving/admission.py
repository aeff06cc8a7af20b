"""Admission by cost: a request's memory is estimated before it is batched
(:mod:`genrec.engine.costs`: KV cache, search buffers, filter lists, scoring tokens) and
checked against the engine's memory budget (:mod:`genrec.engine.memory`).

- a request that can never fit (its estimate alone is over the budget): HTTP 413 naming the
  limit, before it is queued (:meth:`Admission.check`);
- a batch that does not fit now (the budget less what the engine keeps, and no more than the
  memory free now): split into runs that fit, in order (:meth:`Admission.plan`); where one
  request alone does not fit even after the engine's caches are dropped, 503 + Retry-After
  (:class:`MemoryBusyError`);
- an out-of-memory error that still happens in a batch: the engine's caches are dropped and
  the batch answers 503 + Retry-After; the server stays up (:meth:`Admission.guarded`).

Rank and catalog batches are not costed (one chunk each); their out-of-memory errors are
handled the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from genrec.engine import Engine, RowRequest, ScoreRequest
from genrec.engine.costs import prompt_tokens, score_bytes, search_bytes
from genrec.engine.memory import GIB, free_memory
from genrec.serving.batch_jobs import BatchRunner, Stages
from genrec.serving.messages import RecommendBatch, ScoreBatch

MIB = 1 << 20


class RequestTooLargeError(RuntimeError):
    """A request whose memory alone is over the engine's budget (HTTP 413)."""


class MemoryBusyError(RuntimeError):
    """A batch that does not fit in memory now, or ran out of it: retry later (HTTP 503 with
    ``Retry-After``)."""


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocator's out-of-memory error (any device)."""
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


@dataclass
class Planned:
    """A batch split for admission: each run's payload indices and its prepared work."""

    runs: list[tuple[list[int], Any]]


class Admission:
    """Admission of one engine's requests; ``on_split`` (optional) is called for each batch
    split into several runs."""

    def __init__(self, engine: Engine, on_split: Callable[[], None] | None = None) -> None:
        self.engine, self.on_split = engine, on_split
        self.budget = engine.memory

    def cost(self, message: Hashable, payload: Any) -> int:
        """Estimated bytes of one payload of a batch of ``message`` (0: not costed)."""
        engine = self.engine
        cfg, dtype = engine.model.config, engine.model.dtype
        if isinstance(message, RecommendBatch) and isinstance(payload, RowRequest):
            catalog = engine.catalog
            if catalog is None:
                return 0
            text = None if payload.text is None else len(payload.text)
            prompt = prompt_tokens(catalog, len(payload.history),
                                   payload.user_vector is not None, text)
            listed = len(payload.exclude or ()) + len(payload.allow or ())
            return search_bytes(cfg, dtype, catalog, prompt, message.beam_width, listed)
        if isinstance(message, ScoreBatch):
            requests: Sequence[ScoreRequest] = payload
            return sum(score_bytes(cfg, dtype, len(r.prefix),
                                   sum(len(c) for c in r.candidates), len(r.candidates),
                                   engine.config.chunk_tokens) for r in requests)
        return 0

    def check(self, message: Hashable, payload: Any, field: str) -> None:
        """Raise :class:`RequestTooLargeError` (naming ``field`` and the limit) for a payload
        that can never fit the budget."""
        need = self.cost(message, payload)
        if need > self.budget.total:
            raise RequestTooLargeError(
                f"{field}: this request needs about {_size(need)} of memory (KV cache, search "
                f"buffers, filter lists, scoring tokens), over the engine's memory budget of "
                f"{_size(self.budget.total)} (EngineConfig.memory_fraction / "
                f"memory_budget_bytes); send fewer or shorter items, or a smaller beam_width")

    def available(self) -> int:
        """Bytes a batch may take now: the budget less what the engine keeps, and no more
        than the memory free now (plus what the engine keeps, which it would reuse)."""
        held = self.engine.held_bytes()
        free, _ = free_memory(self.engine.model.device)
        return max(0, min(self.budget.total - held, free + held))

    def plan(self, message: Hashable, payloads: list[Any]) -> list[list[int]]:
        """The batch as runs of consecutive payloads, each fitting :meth:`available`; raises
        :class:`MemoryBusyError` where one payload alone does not fit even after the
        engine's caches are dropped."""
        costs = [self.cost(message, p) for p in payloads]
        if not any(costs):
            return [list(range(len(payloads)))]
        room = self.available()
        if max(costs) > room:
            self.engine.release_caches()
            room = self.available()
            if max(costs) > room:
                raise MemoryBusyError(
                    f"memory: a request needs about {_size(max(costs))}, "
                    f"{_size(room)} of the engine's budget is free now; retry")
        runs: list[list[int]] = [[]]
        used = 0
        for i, c in enumerate(costs):
            if runs[-1] and used + c > room:
                runs.append([])
                used = 0
            runs[-1].append(i)
            used += c
        if len(runs) > 1 and self.on_split is not None:
            self.on_split()
        return runs

    def guarded(self, call: Callable[[], Sequence[Any]]) -> list[Any]:
        """``call()``; an out-of-memory error drops the engine's caches and becomes
        :class:`MemoryBusyError`."""
        try:
            return list(call())
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self.engine.release_caches()
            raise MemoryBusyError(f"out of memory running this batch (caches freed): {err}; "
                                  "retry") from err

    def runner(self, run: BatchRunner) -> BatchRunner:
        """``run`` with admission: split by :meth:`plan`, each run guarded."""
        def admitted(message: Hashable, payloads: list[Any]) -> list[Any]:
            out: list[Any] = []
            for idx in self.plan(message, payloads):
                part = [payloads[i] for i in idx]
                out += self.guarded(lambda part=part: run(message, part))
            return out

        return admitted

    def stages(self, stages: Stages) -> Stages:
        """Overlapped ``stages`` with admission: each run prepared and finished apart."""
        def prepare(message: Hashable, payloads: list[Any]) -> Planned:
            return Planned([(idx, stages.prepare(message, [payloads[i] for i in idx]))
                            for idx in self.plan(message, payloads)])

        def finish(planned: Planned) -> list[Any]:
            out: list[Any] = []
            for _, prepared in planned.runs:
                out += self.guarded(lambda p=prepared: stages.finish(p))
            return out

        return Stages(prepare, finish,
                      lambda planned: any(stages.barrier(p) for _, p in planned.runs))

