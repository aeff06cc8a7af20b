"""The HTTP server on bad input and under load: 4xx naming the field (never a 500 for bad
input), one bad request among concurrent ones, queue full 503, deadline 504, engine failure
500, draining, and the SIGTERM drain of ``genrec serve``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from serving_support import (
    RECOMMEND,
    EngineRanker,
    Updater,
    error_message,
    is_ready,
    offline,
    post,
    wait_until,
)

from genrec import Engine
from genrec.model import save_model
from genrec.serving import BackgroundServer, RowRankRequest, ServeConfig, create_app
from genrec.serving.uvicorn_server import free_port

BAD = [
    ("/v1/recommend", {"history": "abc"}, 422, "history"),
    ("/v1/recommend", {"history": [1.5]}, 422, "history[0]"),
    ("/v1/recommend", {"history": [True]}, 422, "history[0]"),
    ("/v1/recommend", {"history": [999]}, 422, "history: none of its 1 items is in the catalog"),
    ("/v1/recommend", {"history": [1.5]}, 422, "history[0]"),
    ("/v1/recommend", {"history": [""]}, 422, "history[0]"),
    ("/v1/recommend", {"history": list(range(5000))}, 422, "history"),
    ("/v1/recommend", {"history": [1], "user_vector": [1.0, 2.0]}, 422, "user_vector"),
    ("/v1/recommend", {"history": [1], "user_vector": "NaN"}, 422, "user_vector"),
    ("/v1/recommend", {"history": [1], "user_vector": [1e300] * 70000}, 422, "user_vector"),
    ("/v1/recommend", {"history": [1], "allow": [40, 2, "x"]}, 422,
     "allow: unknown item ids ['40', 'x']"),
    ("/v1/recommend", {"history": [1], "exclude": [True]}, 422, "exclude[0]"),
    ("/v1/recommend", {"history": [1], "n": 30, "beam_width": 5}, 422, "n:"),
    ("/v1/recommend", {"history": [1], "beam_width": 10_000}, 422, "beam_width"),
    ("/v1/recommend", {"history": [], "n": 1}, 422, "history: empty history"),
    ("/v1/recommend", {"history": [1], "bogus": 1}, 422, "bogus"),
    ("/v1/recommend", [1, 2], 422, "body"),
    ("/v1/rank", {"history": [1], "candidates": []}, 422, "candidates"),
    ("/v1/rank", {"history": [1], "candidates": [77]}, 422, "candidates: unknown item ids ['77']"),
    ("/v1/rank", {"history": [1], "candidates": list(range(20_000))}, 422, "candidates"),
    ("/v1/score", {"query": [1], "items": [[2]]}, 422, "label_token_ids"),
    ("/v1/score", {"query": [1], "items": [[2]], "label_token_ids": [500]}, 422,
     "label_token_ids"),
    ("/v1/score", {"query": [1], "items": [[2], [10_000]], "label_token_ids": [3]}, 422,
     "items[1]"),
    ("/v1/score", {"query": [1] * 60, "items": [[2] * 10], "label_token_ids": [3]}, 422,
     "items[0]"),
    ("/v1/score", {"query": "q", "items": [[2]], "label_token_ids": [3]}, 422, "query"),
    ("/v1/score", {"query": [], "items": [[]], "label_token_ids": [3]}, 422, "items[0]"),
    ("/v1/completions", {"prompt": [5, 6, 7], "use_beam_search": True}, 422, "prompt"),
    ("/v1/completions", {"prompt": [0, 5, 6], "use_beam_search": True}, 422, "prompt"),
    ("/v1/completions", {"prompt": [0, 1, 3, 8, 12], "use_beam_search": True}, 422, "prompt"),
    ("/v1/completions", {"prompt": "<b_1> <a_2> <c_0>", "use_beam_search": True}, 422, "prompt"),
    ("/v1/completions", {"prompt": "hello", "use_beam_search": True}, 422, "prompt"),
    ("/v1/completions", {"prompt": [0], "use_beam_search": True, "max_tokens": 1}, 422,
     "max_tokens"),
    ("/v1/completions", {"prompt": [0], "use_beam_search": True, "n": 5, "best_of": 2}, 422,
     "n:"),
    ("/v1/completions", {"prompt": [0], "use_beam_search": True, "stream": True}, 400, "stream"),
    ("/v1/catalog/items", {"items": []}, 422, "items"),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD)
def test_bad_input_is_4xx_naming_the_field(full: tuple[str, Updater], path: str, body: object,
                                           status: int, field: str) -> None:
    url, _ = full
    method = "PUT" if path == "/v1/catalog/items" else "POST"
    r = httpx.request(method, url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert field in error_message(r)


@pytest.mark.parametrize(
    ("content", "field"),
    [(b"", "body"), (b"{not json", "body: invalid JSON"), (b'{"history": [1], "user_vector": '
     b'[NaN, 1, 1, 1, 1]}', "user_vector[0]"), (b"null", "body")],
)
def test_empty_and_malformed_bodies(full: tuple[str, Updater], content: bytes,
                                    field: str) -> None:
    url, _ = full
    r = httpx.post(url + "/v1/recommend", content=content,
                   headers={"content-type": "application/json"})
    assert r.status_code == 422 and field in r.json()["detail"], r.text


def test_missing_ranker_and_bad_deadline_header(bare: str, full: tuple[str, Updater]) -> None:
    r = post(bare, "/v1/rank", {"history": [1], "candidates": [2]})
    assert r.status_code == 400 and r.json()["detail"] == "no ranker loaded"
    r = post(bare, "/v1/recommend", {"history": [1], "rerank": True})
    assert r.status_code == 400 and r.json()["detail"] == "rerank: no ranker loaded"
    r = post(full[0], "/v1/recommend", {"history": [1]}, headers={"X-Deadline-Ms": "soon"})
    assert r.status_code == 422 and r.json()["detail"].startswith("X-Deadline-Ms")


def test_bad_request_among_concurrent_ones_fails_alone(full: tuple[str, Updater],
                                                       engine: Engine) -> None:
    url, _ = full
    bodies = [{"history": [1, 2], "candidates": [3, 4]},
              {"history": [1, 2], "candidates": [3, 400]},
              {"history": [9], "candidates": [10]}]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda b: post(url, "/v1/rank", b), bodies))
    assert [a.status_code for a in answers] == [200, 422, 200]
    ranker = EngineRanker(engine)
    for i in (0, 2):
        want = ranker.rank_rows([RowRankRequest(bodies[i]["history"], bodies[i]["candidates"])])[0]
        assert torch.allclose(torch.tensor(answers[i].json()["scores"]), want, atol=1e-5)


def test_queue_full_is_503_and_deadline_is_504(engine: Engine) -> None:
    gate = threading.Event()
    ranker = EngineRanker(engine, gate)
    app = create_app(engine, ranker=ranker,
                     config=ServeConfig(max_batch_size=1, max_wait_ms=0, max_queue=1))
    body = {"history": [1], "candidates": [2]}
    with BackgroundServer(app) as server, ThreadPoolExecutor(2) as pool:
        try:
            running = pool.submit(post, server.url, "/v1/rank", body)
            assert ranker.entered.wait(10)  # the first request holds the engine
            late = post(server.url, "/v1/rank", body, headers={"X-Deadline-Ms": "50"})
            assert late.status_code == 504 and "deadline" in late.json()["detail"]
            queued = pool.submit(post, server.url, "/v1/rank", body)
            wait_until(lambda: app.state.scheduler.queue_depth() == 1)
            full = post(server.url, "/v1/rank", body)
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
        finally:
            gate.set()
        assert running.result().status_code == 200 and queued.result().status_code == 200
        text = httpx.get(server.url + "/metrics").text
        assert 'genrec_rejected_total{reason="queue_full"} 1.0' in text



def test_genrec_serve_drains_on_sigterm(tmp_path, engine: Engine) -> None:  # noqa: ANN001
    save_model(engine.model, tmp_path)
    engine.vocab.save(tmp_path)
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "genrec.cli", "serve", "--model",
                             str(tmp_path), "--port", str(port), "--max-wait-ms", "20000",
                             "--threads", "1", "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: is_ready(url) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stdout.read().decode()
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(post, url, "/v1/recommend", RECOMMEND[0])
            wait_until(lambda: "genrec_queue_depth 1.0" in httpx.get(url + "/metrics").text)
            proc.send_signal(signal.SIGTERM)  # the request waits in the batcher: it completes
            answer = in_flight.result()
        assert answer.status_code == 200 and answer.json()["items"] == offline(
            engine, RECOMMEND[0])[0]
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, -signal.SIGTERM)



def test_loaders_explain_what_is_missing(tmp_path) -> None:  # noqa: ANN001
    from genrec.serving.backends import RankerCatalogUpdater, load_catalog_updater, load_ranker

    with pytest.raises(RuntimeError, match="--item-store"):
        load_ranker(tmp_path, None)
    with pytest.raises(RuntimeError, match="need a --ranker"):
        load_catalog_updater(tmp_path, None)

    class Live:
        def __init__(self) -> None:
            self.calls = []

        def update_rows(self, vectors=None, retire=(), ids=None):  # noqa: ANN001, ANN202
            self.calls.append((vectors, list(retire)))
            return len(self.calls)

        def encode_texts(self, texts):  # noqa: ANN001, ANN202
            self.texts = list(texts)
            return [f"encoded {t}" for t in texts]

    live = Live()
    updater = RankerCatalogUpdater(live)
    assert updater.upsert([{"item_id": 3, "text": "a lamp"}]) == 1
    assert updater.upsert([{"item_id": 4, "vectors": [[0.0, 1.0]]}]) == 2
    assert updater.retire([3]) == 3
    assert live.texts == ["a lamp"] and live.calls[0] == ({3: "encoded a lamp"}, [])
    assert live.calls[2] == (None, [3])
    with pytest.raises(ValueError, match=r"items\[0\]"):
        updater.upsert([{"item_id": 5}])


def test_an_engine_failure_is_a_bare_500(engine: Engine) -> None:
    class Broken(EngineRanker):
        def rank_rows(self, requests):  # noqa: ANN001, ANN202
            raise RuntimeError("secret internals")

    app = create_app(engine, ranker=Broken(engine))
    with BackgroundServer(app) as server:
        r = post(server.url, "/v1/rank", {"history": [1], "candidates": [2]})
        assert r.status_code == 500 and r.json() == {"detail": "internal server error"}
        assert 'endpoint="/v1/rank",status="500"' in httpx.get(server.url + "/metrics").text
        assert httpx.get(server.url + "/health").status_code == 200


def test_draining_turns_ready_and_new_work_away(engine: Engine) -> None:
    with BackgroundServer(create_app(engine)) as server:
        assert httpx.get(server.url + "/ready").status_code == 200
        server.server.begin_drain()  # what SIGTERM does first
        assert httpx.get(server.url + "/ready").status_code == 503
        assert httpx.get(server.url + "/health").status_code == 200
        r = post(server.url, "/v1/recommend", RECOMMEND[0])
        assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_the_error_table_answers_each_refusal() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from genrec.serving.admission import MemoryBusyError, RequestTooLargeError
    from genrec.serving.api_errors import ApiError, CatalogBehindError
    from genrec.serving.batch_jobs import DeadlineExceededError, DrainingError, QueueFullError
    from genrec.serving.engine_process import EngineGoneError
    from genrec.serving.http_errors import map_errors
    from genrec.serving.prometheus import ServerMetrics
    from genrec.serving.spec import ServeConfig

    raised = {"queue": QueueFullError("queue full"), "behind": CatalogBehindError(7, 5),
              "draining": DrainingError("draining"), "gone": EngineGoneError("gone"),
              "large": RequestTooLargeError("too large"), "busy": MemoryBusyError("busy"),
              "late": DeadlineExceededError("late"), "api": ApiError(404, "model: no such"),
              "value": ValueError("history: bad")}
    app, metrics = FastAPI(), ServerMetrics(lambda: 0, lambda: 0)
    map_errors(app, metrics, ServeConfig(retry_after_s=3))

    @app.get("/{name}")
    def fail(name: str) -> None:
        raise raised[name]

    want = {"queue": (503, "3"), "behind": (503, "3"), "draining": (503, "3"),
            "gone": (503, "3"), "large": (413, None), "busy": (503, "3"), "late": (504, None),
            "api": (404, None), "value": (422, None)}
    with TestClient(app) as client:
        for name, (status, retry) in want.items():
            r = client.get(f"/{name}")
            assert (r.status_code, r.headers.get("Retry-After")) == (status, retry), name
            assert r.json() == {"detail": str(raised[name])}
    text = metrics.render().decode()
    for reason in ("queue_full", "catalog_behind", "draining", "too_large", "memory",
                   "deadline"):
        assert f'genrec_rejected_total{{reason="{reason}"}} 1.0' in text
