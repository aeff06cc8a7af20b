"""Dynamic batching: merging, bounds, deadlines, failure isolation, exact engine results."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from genrec import BeamParams, Engine, ScoreParams, ScoreRequest
from genrec.engine import RowRequest
from genrec.serving.messages import RecommendBatch, ScoreBatch
from genrec.serving.scheduler import (
    BatchScheduler,
    DeadlineExceededError,
    DrainingError,
    QueueFullError,
    Stages,
)
from genrec.serving.worker import Worker


class Recorder:
    """A runner that records its batches; ``gate`` (when set) holds every call until opened."""

    def __init__(self, gated: bool = False) -> None:
        self.batches: list[tuple[object, list]] = []
        self.gate = threading.Event()
        self.started = threading.Event()
        if not gated:
            self.gate.set()

    def __call__(self, group, payloads):  # noqa: ANN001, ANN204
        self.started.set()
        self.gate.wait(10)
        self.batches.append((group, list(payloads)))
        if any(p == "bad" for p in payloads):
            raise ValueError("payload: bad")
        if any(p == "boom" for p in payloads):
            raise RuntimeError("engine broke")
        return [(group, p) for p in payloads]


def _run(coro):  # noqa: ANN001, ANN202
    return asyncio.run(coro)


async def _gather(sched: BatchScheduler, jobs, **kw):  # noqa: ANN001, ANN202
    return await asyncio.gather(*(sched.submit(g, p, **kw) for g, p in jobs),
                                return_exceptions=True)


def test_concurrent_requests_merge_into_one_batch_per_group() -> None:
    rec = Recorder()
    sched = BatchScheduler(rec, max_batch_size=32, max_wait_ms=300)
    jobs = [("a", i) for i in range(6)] + [("b", i) for i in range(3)]
    out = _run(_gather(sched, jobs))
    assert out == [(g, p) for g, p in jobs]
    sizes = sorted((g, len(p)) for g, p in rec.batches)
    assert sizes == [("a", 6), ("b", 3)]
    assert sched.close(5)


def test_batch_size_is_capped() -> None:
    rec = Recorder()
    sched = BatchScheduler(rec, max_batch_size=4, max_wait_ms=300)
    out = _run(_gather(sched, [("a", i) for i in range(10)]))
    assert [p for _, p in out] == list(range(10))
    assert [len(p) for _, p in rec.batches] == [4, 4, 2]
    sched.close(5)


def test_next_batch_is_collected_while_the_engine_runs() -> None:
    rec = Recorder(gated=True)
    sched = BatchScheduler(rec, max_batch_size=32, max_wait_ms=0)

    async def scenario():  # noqa: ANN202
        first = asyncio.ensure_future(sched.submit("a", 0))
        await asyncio.to_thread(rec.started.wait, 5)
        rest = [asyncio.ensure_future(sched.submit("a", i)) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        assert sched.queue_depth() == 5
        rec.gate.set()
        return await asyncio.gather(first, *rest)

    out = _run(scenario())
    assert [p for _, p in out] == list(range(6))
    assert [len(p) for _, p in rec.batches] == [1, 5]
    sched.close(5)


def test_queue_bound_and_draining_refuse_at_once() -> None:
    rec = Recorder(gated=True)
    sched = BatchScheduler(rec, max_batch_size=1, max_wait_ms=0, max_queue=2)

    async def scenario():  # noqa: ANN202
        running = asyncio.ensure_future(sched.submit("a", 0))
        await asyncio.to_thread(rec.started.wait, 5)
        waiting = [asyncio.ensure_future(sched.submit("a", i)) for i in (1, 2)]
        await asyncio.sleep(0.02)
        with pytest.raises(QueueFullError):
            await sched.submit("a", 3)
        sched.begin_drain()
        with pytest.raises(DrainingError):
            await sched.submit("a", 4)
        rec.gate.set()
        return await asyncio.gather(running, *waiting)

    assert [p for _, p in _run(scenario())] == [0, 1, 2]
    assert sched.close(5)


def test_deadline_passes_before_the_job_runs() -> None:
    rec = Recorder(gated=True)
    sched = BatchScheduler(rec, max_batch_size=8, max_wait_ms=0)

    async def scenario():  # noqa: ANN202
        running = asyncio.ensure_future(sched.submit("a", 0))
        await asyncio.to_thread(rec.started.wait, 5)
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError, match="deadline_ms"):
            await sched.submit("a", "late", deadline_ms=30)
        assert time.monotonic() - start < 2
        patient = asyncio.ensure_future(sched.submit("a", 1, deadline_ms=10_000))
        rec.gate.set()
        return await asyncio.gather(running, patient)

    assert [p for _, p in _run(scenario())] == [0, 1]
    assert all("late" not in p for _, p in rec.batches)  # the expired job never ran
    sched.close(5)


def test_one_bad_request_does_not_fail_the_others() -> None:
    rec = Recorder()
    sched = BatchScheduler(rec, max_batch_size=8, max_wait_ms=100)
    out = _run(_gather(sched, [("a", 0), ("a", "bad"), ("a", 2)]))
    assert out[0] == ("a", 0) and out[2] == ("a", 2)
    assert isinstance(out[1], ValueError) and "payload" in str(out[1])
    sched.close(5)


def test_an_engine_failure_reaches_every_member() -> None:
    sched = BatchScheduler(Recorder(), max_batch_size=8, max_wait_ms=100)
    out = _run(_gather(sched, [("a", 0), ("a", "boom")]))
    assert all(isinstance(o, RuntimeError) for o in out)
    sched.close(5)


def test_close_runs_queued_jobs_then_refuses() -> None:
    rec = Recorder(gated=True)
    sched = BatchScheduler(rec, max_batch_size=2, max_wait_ms=0)

    async def scenario():  # noqa: ANN202
        futs = [asyncio.ensure_future(sched.submit("a", i)) for i in range(5)]
        await asyncio.to_thread(rec.started.wait, 5)
        closer = asyncio.get_running_loop().run_in_executor(None, sched.close, 10)
        await asyncio.sleep(0.02)
        with pytest.raises(DrainingError):
            await sched.submit("a", 9)
        rec.gate.set()
        assert await closer
        return await asyncio.gather(*futs)

    assert [p for _, p in _run(scenario())] == list(range(5))


# -- the real engine behind the scheduler ----------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Engine:
    from serving_support import tiny_engine

    return tiny_engine()


def test_batched_results_equal_the_engine_called_directly(engine: Engine) -> None:
    sched = BatchScheduler(Worker(engine).run, max_batch_size=16, max_wait_ms=100)
    recs = [RowRequest([3, 17, 8]), RowRequest([1], user_vector=[0.5] * 5),
            RowRequest([5, 6, 7], exclude=[0, 1, 2]), RowRequest([20], allow=[4, 9])]
    scores = [[ScoreRequest([0, 3, 4], [[5, 6], [7]])], [ScoreRequest([0, 9], [[10], [11, 12]])]]
    bad = RowRequest([999])  # unknown item: fails alone
    message = RecommendBatch(8, 5)
    jobs = [(message, r) for r in recs] + [(message, bad)]
    jobs += [(ScoreBatch((3, 4), False), s) for s in scores]
    out = _run(_gather(sched, jobs))
    assert isinstance(out[len(recs)], ValueError) and "unknown item id 999" in str(out[len(recs)])
    for req, got in zip(recs, out[: len(recs)], strict=True):
        want = engine.recommend_rows([req], BeamParams(8, 5))[0]
        assert got.value.items == want.items and got.catalog_version == 3  # the item table's
        assert torch.allclose(torch.tensor(got.value.scores), torch.tensor(want.scores),
                              atol=1e-5)
    params = ScoreParams(mode="labels", label_token_ids=[3, 4])
    for req, got in zip(scores, out[len(recs) + 1:], strict=True):
        want = engine.score_requests(req, params)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got.value, want, strict=True))
    sched.close(5)


class TwoSteps:
    """Stages that record what ran where: ``prepare`` tags payloads, ``finish`` of the first
    batch waits until the second batch has been prepared (so without overlap it would time
    out), "bad" fails in prepare, "late" fails in finish, "update" is a barrier."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.second_prepared = threading.Event()
        self.lock = threading.Lock()

    def prepare(self, group, payloads):  # noqa: ANN001, ANN201
        with self.lock:
            self.events.append(("prepare", tuple(payloads)))
        if "bad" in payloads:
            raise ValueError("payload: bad")
        if any(str(p).startswith("second") for p in payloads):
            self.second_prepared.set()
        return (group, tuple(payloads))

    def finish(self, prepared):  # noqa: ANN001, ANN201
        group, payloads = prepared
        if any(str(p).startswith("first") for p in payloads):
            assert self.second_prepared.wait(10), "batch 2 was not prepared during batch 1"
        with self.lock:
            self.events.append(("finish", payloads))
        if "late" in payloads:
            raise ValueError("payload: late")
        return [(group, p, "done") for p in payloads]

    def stages(self) -> Stages:
        return Stages(self.prepare, self.finish,
                      barrier=lambda prepared: "update" in prepared[1])

    def runner(self, group, payloads):  # noqa: ANN001, ANN201
        return self.finish(self.prepare(group, payloads))


def test_overlap_prepares_the_next_batch_while_one_runs() -> None:
    steps = TwoSteps()
    sched = BatchScheduler(steps.runner, max_batch_size=4, max_wait_ms=1,
                           stages=steps.stages())

    async def go():  # noqa: ANN202
        first = asyncio.ensure_future(sched.submit("a", "first"))
        await asyncio.sleep(0.05)  # batch 1 is running
        second = await _gather(sched, [("b", "second-1"), ("b", "second-2")])
        return await first, second

    first, second = _run(go())
    assert first == ("a", "first", "done")
    assert second == [("b", "second-1", "done"), ("b", "second-2", "done")]
    order = [kind for kind, _ in steps.events]
    assert order == ["prepare", "prepare", "finish", "finish"]
    assert sched.close(5) and sched.idle()


def test_overlap_isolates_bad_requests_in_either_step() -> None:
    steps = TwoSteps()
    sched = BatchScheduler(steps.runner, max_batch_size=8, max_wait_ms=200,
                           stages=steps.stages())
    out = _run(_gather(sched, [("g", "x"), ("g", "bad"), ("g", "y"), ("g", "late")]))
    assert out[0] == ("g", "x", "done") and out[2] == ("g", "y", "done")
    assert isinstance(out[1], ValueError) and "bad" in str(out[1])
    assert isinstance(out[3], ValueError) and "late" in str(out[3])
    sched.close(5)


def test_overlap_finishes_a_barrier_before_preparing_the_next_batch() -> None:
    steps = TwoSteps()
    sched = BatchScheduler(steps.runner, max_batch_size=1, max_wait_ms=0,
                           stages=steps.stages())
    out = _run(_gather(sched, [("u", "update"), ("r", "read")]))
    assert out == [("u", "update", "done"), ("r", "read", "done")]
    assert steps.events == [("prepare", ("update",)), ("finish", ("update",)),
                            ("prepare", ("read",)), ("finish", ("read",))]
    sched.close(5)


def test_overlap_worker_steps_equal_its_run(engine: Engine) -> None:
    worker = Worker(engine)
    reqs = [RowRequest([1, 2, 3]), RowRequest([4], exclude=[0])]
    msg = RecommendBatch(beam_width=4, n=3)
    prepared = worker.prepare(msg, reqs)
    assert prepared.version == worker.catalog_version
    assert worker.finish(prepared) == worker.run(msg, reqs)
    assert not worker.barrier(prepared)
