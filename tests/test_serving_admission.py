"""Admission by cost through the HTTP app: a request over the memory budget gets 413 naming
the limit; a batch over what fits now is split, else 503 + Retry-After; an out-of-memory error
in a batch answers 503, frees the engine's caches, and the server goes on."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from serving_support import EngineRanker, offline, post, tiny_engine, wait_until

from genrec.engine import RowRequest
from genrec.serving import BackgroundServer, ServeConfig, create_app
from genrec.serving import admission as admission_mod
from genrec.serving.admission import Admission
from genrec.serving.messages import RecommendBatch, ScoreBatch

BODY = {"history": [3, 17, 8], "n": 4, "beam_width": 16}


def _cost(width: int = 16) -> int:
    engine = tiny_engine()
    return Admission(engine).cost(RecommendBatch(width, 4), RowRequest([3, 17, 8]))


def _metric(url: str, line_start: str) -> float:
    text = httpx.get(url + "/metrics").text
    found = [ln for ln in text.splitlines() if ln.startswith(line_start)]
    return float(found[0].split()[-1]) if found else 0.0


def test_cost_grows_with_width_filters_and_scoring_tokens() -> None:
    engine = tiny_engine()
    adm = Admission(engine)
    small = adm.cost(RecommendBatch(16, 4), RowRequest([3, 17, 8]))
    assert 0 < small < adm.cost(RecommendBatch(256, 4), RowRequest([3, 17, 8]))
    assert small < adm.cost(RecommendBatch(16, 4), RowRequest([3], exclude=list(range(40))))
    from genrec.engine import ScoreRequest

    few = adm.cost(ScoreBatch((3,), False), [ScoreRequest([1, 2], [[4], [5]])])
    assert 0 < few < adm.cost(ScoreBatch((3,), False), [ScoreRequest([1, 2], [[4]] * 50)])


def test_a_request_over_the_budget_gets_413_naming_the_limit() -> None:
    engine = tiny_engine(memory_budget_bytes=_cost(16) * 2)
    with BackgroundServer(create_app(engine)) as server:
        ok = post(server.url, "/v1/recommend", BODY)
        assert ok.status_code == 200, ok.text
        big = post(server.url, "/v1/recommend", {**BODY, "beam_width": 256})
        assert big.status_code == 413
        detail = big.json()["detail"]
        assert detail.startswith("beam_width:") and "memory budget" in detail
        score = post(server.url, "/v1/score", {"query": [1, 2, 3], "items": [[4, 5]] * 5000,
                                               "label_token_ids": [3]})
        assert score.status_code == 413 and score.json()["detail"].startswith("items:")
        assert _metric(server.url, 'genrec_rejected_total{reason="too_large"}') == 2
        # the server goes on
        assert post(server.url, "/v1/recommend", BODY).json()["items"] == offline(engine, BODY)[0]


def test_a_batch_over_what_fits_now_is_split() -> None:
    # room for one request at a time: two batched requests run as two engine calls
    engine = tiny_engine(memory_budget_bytes=int(_cost(16) * 1.5))
    gate = threading.Event()
    ranker = EngineRanker(engine, gate)
    app = create_app(engine, ranker=ranker, config=ServeConfig(max_wait_ms=5))
    bodies = [BODY, {**BODY, "history": [5, 6, 7]}]
    with BackgroundServer(app) as server, ThreadPoolExecutor(3) as pool:
        # a rank batch holds the engine thread while both recommend requests queue up
        held = pool.submit(post, server.url, "/v1/rank", {"history": [1], "candidates": [2]})
        assert ranker.entered.wait(10)
        answers = [pool.submit(post, server.url, "/v1/recommend", b) for b in bodies]
        # both queued behind the held batch (their order does not matter)
        wait_until(lambda: app.state.scheduler.queue_depth() == 2)
        gate.set()
        assert held.result().status_code == 200
        for body, answer in zip(bodies, answers, strict=True):
            r = answer.result()
            assert r.status_code == 200, r.text
            assert r.json()["items"] == offline(engine, body)[0]
        assert _metric(server.url, 'genrec_batch_size_count{kind="recommend"}') == 1
        assert _metric(server.url, "genrec_batch_splits_total") == 1


def test_a_request_that_does_not_fit_now_gets_503_and_retry_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the machine's memory is taken by something else: a request that fits the budget but not
    # the memory free now waits for a retry
    engine = tiny_engine(memory_budget_bytes=_cost(16) * 4)
    with BackgroundServer(create_app(engine)) as server:
        monkeypatch.setattr(admission_mod, "free_memory", lambda device: (1024, "test"))
        busy = post(server.url, "/v1/recommend", BODY)
        assert busy.status_code == 503 and "Retry-After" in busy.headers
        assert busy.json()["detail"].startswith("memory:")
        assert _metric(server.url, 'genrec_rejected_total{reason="memory"}') == 1
        monkeypatch.undo()
        assert post(server.url, "/v1/recommend", BODY).status_code == 200


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to "
                                                          "allocate 6.00 GiB"),
                                   RuntimeError("DefaultCPUAllocator: not enough memory: "
                                                "you tried to allocate 1 bytes; out of memory")])
def test_out_of_memory_in_a_batch_answers_503_frees_caches_and_goes_on(
        monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    engine = tiny_engine()
    with BackgroundServer(create_app(engine)) as server:
        assert post(server.url, "/v1/recommend", BODY).status_code == 200
        assert engine.searches.stats().buffer_sets == 1  # kept for the next call
        real = engine.run_recommend

        def fails_once(work):  # noqa: ANN001, ANN202
            monkeypatch.setattr(engine, "run_recommend", real)
            raise error

        monkeypatch.setattr(engine, "run_recommend", fails_once)
        oom = post(server.url, "/v1/recommend", BODY)
        assert oom.status_code == 503 and "Retry-After" in oom.headers
        assert "out of memory" in oom.json()["detail"]
        assert engine.searches.stats().buffer_sets == 0  # caches freed
        again = post(server.url, "/v1/recommend", BODY)
        assert again.status_code == 200 and again.json()["items"] == offline(engine, BODY)[0]
