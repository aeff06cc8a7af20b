"""Dynamic batching between asyncio request handlers and one engine worker thread.

Handlers ``await scheduler.submit(group, payload)``. Jobs wait in a bounded queue; a worker
thread takes up to ``max_batch_size`` jobs of the *same group* (a hashable key; the server's
are the messages of :mod:`genrec.serving.messages`, such as ``RecommendBatch(beam_width, n)``:
jobs of one group can share one engine call), waiting at most ``max_wait_ms`` after the
oldest job arrived, and calls ``runner(group, payloads)`` once for the whole batch. Jobs that
arrive while the engine runs a batch queue up and form the next batch, which is taken as soon
as the engine is free (collection overlaps execution).

Failure isolation: when the batched call raises ``ValueError`` (the engine's ``InputError``
for bad input), every member is rerun alone, so one bad request fails only itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

BatchRunner = Callable[[Hashable, list[Any]], Sequence[Any]]
BatchObserver = Callable[[Hashable, int, float], None]


class QueueFullError(RuntimeError):
    """The queue holds ``max_queue`` jobs: retry later (HTTP 503 + Retry-After)."""


class DrainingError(RuntimeError):
    """The scheduler is shutting down and takes no new jobs (HTTP 503)."""


class DeadlineExceededError(RuntimeError):
    """The job's deadline passed before it ran (HTTP 504)."""


@dataclass(eq=False)
class _Job:
    group: Hashable
    payload: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float
    deadline: float | None
    state: str = "pending"  # pending -> running | dropped


def _resolve(future: asyncio.Future, ok: bool, value: Any) -> None:
    if not future.done():
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class BatchScheduler:
    """Bounded queue + one worker thread running batched engine calls.

    ``runner(group, payloads)`` must return one result per payload, in order. ``observer``
    (optional) is called after each batch with ``(group, batch size, seconds)``.
    """

    def __init__(
        self, runner: BatchRunner, max_batch_size: int = 32, max_wait_ms: float = 5.0,
        max_queue: int = 256, observer: BatchObserver | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1, max_wait_ms >= 0")
        self.runner = runner
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.observer = observer
        self._pending: deque[_Job] = deque()
        self._counts: dict[Hashable, int] = {}
        self._cond = threading.Condition()
        self._accepting = True
        self._stopping = False
        self._busy = False
        self._thread = threading.Thread(target=self._work, name="genrec-batcher", daemon=True)
        self._thread.start()

    @property
    def accepting(self) -> bool:
        """False once draining began."""
        return self._accepting

    def queue_depth(self) -> int:
        """Jobs waiting (not counting the batch being run)."""
        return len(self._pending)

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        with self._cond:
            return not self._pending and not self._busy

    async def submit(self, group: Hashable, payload: Any, deadline_ms: float | None = None) -> Any:
        """Queue one job and wait for its result (or the exception its run raised).

        Raises :class:`QueueFullError`, :class:`DrainingError` at once;
        :class:`DeadlineExceededError` if ``deadline_ms`` passes before the job starts (a job
        already running when its deadline passes is waited for).
        """
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        deadline = None if deadline_ms is None else now + deadline_ms / 1000.0
        job = _Job(group, payload, loop.create_future(), loop, now, deadline)
        with self._cond:
            if not self._accepting:
                raise DrainingError("server is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFullError(f"queue full ({self.max_queue} requests waiting)")
            self._pending.append(job)
            self._counts[group] = self._counts.get(group, 0) + 1
            self._cond.notify_all()
        try:
            if deadline is None:
                return await job.future
            try:
                return await asyncio.wait_for(asyncio.shield(job.future), deadline - now)
            except asyncio.TimeoutError:
                if self._drop(job):
                    raise DeadlineExceededError(
                        f"deadline_ms: {deadline_ms:g} ms passed before the request ran"
                    ) from None
                return await job.future  # it started in time: wait for its result
        except asyncio.CancelledError:  # the client went away: do not run it
            self._drop(job)
            raise

    def begin_drain(self) -> None:
        """Stop accepting jobs; queued and running ones still complete."""
        with self._cond:
            self._accepting = False
            self._cond.notify_all()  # no more jobs will come: stop waiting for batches to fill

    def close(self, timeout: float | None = None) -> bool:
        """Drain: refuse new jobs, run the queued ones, stop the worker. True when it stopped
        within ``timeout`` seconds."""
        with self._cond:
            self._accepting = False
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- worker side -------------------------------------------------------------------------

    def _drop(self, job: _Job) -> bool:
        with self._cond:
            if job.state != "pending":
                return False
            self._remove(job)
            job.state = "dropped"
            return True

    def _remove(self, job: _Job) -> None:
        self._pending.remove(job)
        self._decrement(job.group)

    def _decrement(self, group: Hashable) -> None:
        left = self._counts[group] - 1
        if left:
            self._counts[group] = left
        else:
            del self._counts[group]

    def _next_batch(self) -> tuple[Hashable, list[_Job], list[_Job]] | None:
        """Under the lock: wait for a batch; returns (group, jobs to run, expired jobs)."""
        while True:
            while not self._pending:
                if self._stopping:
                    return None
                self._cond.wait()
            first = self._pending[0]
            close_at = first.enqueued + self.max_wait
            while (first.state == "pending" and self._accepting
                   and self._counts[first.group] < self.max_batch_size):
                left = close_at - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if first.state != "pending":
                continue  # the oldest job was dropped while we waited
            group, now = first.group, time.monotonic()
            run: list[_Job] = []
            expired: list[_Job] = []
            keep: deque[_Job] = deque()
            for job in self._pending:
                if job.group != group or len(run) == self.max_batch_size:
                    keep.append(job)
                    continue
                self._decrement(group)
                if job.deadline is not None and now >= job.deadline:
                    job.state = "dropped"
                    expired.append(job)
                else:
                    job.state = "running"
                    run.append(job)
            self._pending = keep
            self._busy = bool(run)
            return group, run, expired

    def _work(self) -> None:
        while True:
            with self._cond:
                picked = self._next_batch()
            if picked is None:
                return
            group, jobs, expired = picked
            for job in expired:
                err = DeadlineExceededError("deadline_ms: the deadline passed before the "
                                            "request ran")
                self._deliver(job, False, err)
            if jobs:
                self._execute(group, jobs)
                with self._cond:
                    self._busy = False

    def _execute(self, group: Hashable, jobs: list[_Job]) -> None:
        payloads = [job.payload for job in jobs]
        start = time.perf_counter()
        try:
            outcomes = self._call(group, payloads)
        except ValueError as err:
            if len(jobs) == 1:
                outcomes = [(False, err)]
            else:  # find the bad ones: every member alone
                outcomes = [self._call_one(group, payload) for payload in payloads]
        except Exception as err:  # noqa: BLE001 - delivered to every waiting request
            outcomes = [(False, err)] * len(jobs)
        if self.observer is not None:
            self.observer(group, len(jobs), time.perf_counter() - start)
        for job, (ok, value) in zip(jobs, outcomes, strict=True):
            self._deliver(job, ok, value)

    def _call(self, group: Hashable, payloads: list[Any]) -> list[tuple[bool, Any]]:
        results = list(self.runner(group, payloads))
        if len(results) != len(payloads):
            raise RuntimeError(f"batch runner returned {len(results)} results for "
                               f"{len(payloads)} requests")
        return [(True, r) for r in results]

    def _call_one(self, group: Hashable, payload: Any) -> tuple[bool, Any]:
        try:
            return self._call(group, [payload])[0]
        except Exception as err:  # noqa: BLE001 - this request's own error
            return False, err

    @staticmethod
    def _deliver(job: _Job, ok: bool, value: Any) -> None:
        try:
            job.loop.call_soon_threadsafe(_resolve, job.future, ok, value)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass
