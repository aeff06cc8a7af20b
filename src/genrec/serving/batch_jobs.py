"""What the batch scheduler (:mod:`genrec.serving.scheduler`) is made of: its runner and
observer types, the two steps of an overlapped batch (:class:`Stages`), its errors, and a
queued :class:`Job`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

BatchRunner = Callable[[Hashable, list[Any]], Sequence[Any]]
BatchObserver = Callable[[Hashable, int, float], None]


@dataclass(frozen=True)
class Stages:
    """A batch in two steps: ``prepare(group, payloads) -> prepared`` (host work) and
    ``finish(prepared) -> results`` (one per payload); ``barrier(prepared)``: finish it
    before preparing the next batch."""

    prepare: Callable[[Hashable, list[Any]], Any]
    finish: Callable[[Any], Sequence[Any]]
    barrier: Callable[[Any], bool] = lambda _: False


class QueueFullError(RuntimeError):
    """The queue holds ``max_queue`` jobs: retry later (HTTP 503 + Retry-After)."""


class DrainingError(RuntimeError):
    """The scheduler is shutting down and takes no new jobs (HTTP 503)."""


class DeadlineExceededError(RuntimeError):
    """The job's deadline passed before it ran (HTTP 504)."""


@dataclass(eq=False)
class Job:
    """One queued request: its group and payload, the future its handler awaits (on
    ``loop``), when it was queued and its deadline (monotonic seconds), its state."""

    group: Hashable
    payload: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float
    deadline: float | None
    state: str = "pending"  # pending -> running | dropped


def resolve(future: asyncio.Future, ok: bool, value: Any) -> None:
    """Set ``future``'s result (``ok``) or exception, unless it is done already."""
    if not future.done():
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
