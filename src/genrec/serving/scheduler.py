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

Overlap (``stages``, see :class:`Stages`): a batch runs in two steps, ``prepare`` (host work:
checks, packing) on the collecting thread and ``finish`` (the engine's device work) on a
second thread, so batch k+1 is packed while batch k runs, as the overlap schedulers of
TensorRT-LLM and SGLang do. A prepared batch marked ``barrier`` (a catalog update) is
finished before the next batch is prepared.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from genrec.serving.batch_jobs import (
    BatchObserver,
    BatchRunner,
    DeadlineExceededError,
    DrainingError,
    Job,
    QueueFullError,
    Stages,
    resolve,
)

__all__ = ["BatchObserver", "BatchRunner", "BatchScheduler", "DeadlineExceededError",
           "DrainingError", "QueueFullError", "Stages"]

class BatchScheduler:
    """Bounded queue + one worker thread running batched engine calls.

    ``runner(group, payloads)`` must return one result per payload, in order. ``observer``
    (optional) is called after each batch with ``(group, batch size, seconds)``.
    """

    def __init__(
        self, runner: BatchRunner, max_batch_size: int = 32, max_wait_ms: float = 5.0,
        max_queue: int = 256, observer: BatchObserver | None = None,
        stages: Stages | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1, max_wait_ms >= 0")
        self.runner = runner
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.observer = observer
        self._pending: deque[Job] = deque()
        self._counts: dict[Hashable, int] = {}
        self._cond = threading.Condition()
        self._accepting = True
        self._stopping = False
        self._busy = False
        self.stages = stages
        # overlap: prepared batches for the finishing thread (at most one waits)
        self._handoff: deque[tuple[Hashable, list[Job], Any] | None] = deque()
        self._in_flight = 0  # batches prepared and not finished yet
        self._finisher = None
        if stages is not None:
            self._finisher = threading.Thread(target=self._finish_loop, name="genrec-engine",
                                              daemon=True)
            self._finisher.start()
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
            return not self._pending and not self._busy and not self._in_flight

    async def submit(self, group: Hashable, payload: Any, deadline_ms: float | None = None) -> Any:
        """Queue one job and wait for its result (or the exception its run raised).

        Raises :class:`QueueFullError`, :class:`DrainingError` at once;
        :class:`DeadlineExceededError` if ``deadline_ms`` passes before the job starts (a job
        already running when its deadline passes is waited for).
        """
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        deadline = None if deadline_ms is None else now + deadline_ms / 1000.0
        job = Job(group, payload, loop.create_future(), loop, now, deadline)
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
        if self._finisher is not None:
            self._finisher.join(timeout)
            return not (self._thread.is_alive() or self._finisher.is_alive())
        return not self._thread.is_alive()

    # -- worker side -------------------------------------------------------------------------

    def _drop(self, job: Job) -> bool:
        with self._cond:
            if job.state != "pending":
                return False
            self._remove(job)
            job.state = "dropped"
            return True

    def _remove(self, job: Job) -> None:
        self._pending.remove(job)
        self._decrement(job.group)

    def _decrement(self, group: Hashable) -> None:
        left = self._counts[group] - 1
        if left:
            self._counts[group] = left
        else:
            del self._counts[group]

    def _next_batch(self) -> tuple[Hashable, list[Job], list[Job]] | None:
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
            run: list[Job] = []
            expired: list[Job] = []
            keep: deque[Job] = deque()
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
                if self.stages is not None:
                    self._hand(None)  # the finishing thread stops after what it holds
                return
            group, jobs, expired = picked
            for job in expired:
                err = DeadlineExceededError("deadline_ms: the deadline passed before the "
                                            "request ran")
                self._deliver(job, False, err)
            if jobs and self.stages is not None:
                self._prepare(group, jobs)
            elif jobs:
                self._execute(group, jobs)
            with self._cond:
                self._busy = False

    # -- overlap: prepare here, finish on the finishing thread --------------------------------

    def _prepare(self, group: Hashable, jobs: list[Job]) -> None:
        stages = self.stages
        try:
            parts = [(jobs, stages.prepare(group, [job.payload for job in jobs]))]
        except ValueError as err:
            if len(jobs) == 1:
                self._deliver(jobs[0], False, err)
                return
            parts = []  # find the bad ones: every member alone
            for job in jobs:
                try:
                    parts.append(([job], stages.prepare(group, [job.payload])))
                except Exception as one:  # noqa: BLE001 - this request's own error
                    self._deliver(job, False, one)
        except Exception as err:  # noqa: BLE001 - delivered to every waiting request
            for job in jobs:
                self._deliver(job, False, err)
            return
        for members, prepared in parts:
            self._hand((group, members, prepared))
            if stages.barrier(prepared):
                with self._cond:  # finished before anything later is prepared
                    while self._in_flight:
                        self._cond.wait()

    def _hand(self, item: tuple[Hashable, list[Job], Any] | None) -> None:
        with self._cond:
            while self._handoff:  # one prepared batch waits at most
                self._cond.wait()
            self._handoff.append(item)
            if item is not None:
                self._in_flight += 1
            self._cond.notify_all()

    def _finish_loop(self) -> None:
        while True:
            with self._cond:
                while not self._handoff:
                    self._cond.wait()
                item = self._handoff.popleft()
                self._cond.notify_all()
            if item is None:
                return
            group, jobs, prepared = item
            self._settle(group, jobs, lambda: self.stages.finish(prepared))  # noqa: B023
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def _execute(self, group: Hashable, jobs: list[Job]) -> None:
        payloads = [job.payload for job in jobs]
        self._settle(group, jobs, lambda: self.runner(group, payloads))

    def _settle(self, group: Hashable, jobs: list[Job], call: Callable[[], Sequence[Any]]
                ) -> None:
        # run a batch's ``call`` and deliver each job's outcome; bad input (ValueError) in a
        # batch of several: every member again alone
        start = time.perf_counter()
        try:
            outcomes = self._checked(call(), len(jobs))
        except ValueError as err:
            if len(jobs) == 1:
                outcomes = [(False, err)]
            else:  # find the bad ones: every member alone
                outcomes = [self._call_one(group, job.payload) for job in jobs]
        except Exception as err:  # noqa: BLE001 - delivered to every waiting request
            outcomes = [(False, err)] * len(jobs)
        if self.observer is not None:
            self.observer(group, len(jobs), time.perf_counter() - start)
        for job, (ok, value) in zip(jobs, outcomes, strict=True):
            self._deliver(job, ok, value)

    def _call(self, group: Hashable, payloads: list[Any]) -> list[tuple[bool, Any]]:
        return self._checked(self.runner(group, payloads), len(payloads))

    @staticmethod
    def _checked(results: Sequence[Any], expected: int) -> list[tuple[bool, Any]]:
        results = list(results)
        if len(results) != expected:
            raise RuntimeError(f"batch runner returned {len(results)} results for "
                               f"{expected} requests")
        return [(True, r) for r in results]

    def _call_one(self, group: Hashable, payload: Any) -> tuple[bool, Any]:
        try:
            return self._call(group, [payload])[0]
        except Exception as err:  # noqa: BLE001 - this request's own error
            return False, err

    @staticmethod
    def _deliver(job: Job, ok: bool, value: Any) -> None:
        try:
            job.loop.call_soon_threadsafe(resolve, job.future, ok, value)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass
