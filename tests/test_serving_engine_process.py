"""``genrec serve --engine-process``: engine batches run in a spawned child process. Answers
equal the offline engine's, bad input still names the field, catalog updates reach both
processes under one version, the child stops with the server, and a failed start is clear."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from serving_support import N_ITEMS, RECOMMEND, SIZES, offline, post, wait_until

from genrec import Engine
from genrec.engine import RowRequest
from genrec.serving import BackgroundServer, ServeConfig, Worker
from genrec.serving.app_loader import load_app
from genrec.serving.engine_process import EngineProcess
from genrec.serving.messages import RecommendBatch
from genrec.serving.spec import AppSpec


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Engine:
    return Engine.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def served(checkpoint: Path) -> Iterator[tuple[str, EngineProcess]]:
    spec = AppSpec.of(checkpoint, threads=1,
                      config=ServeConfig(max_wait_ms=1, engine_process=True))
    app = load_app(spec)
    child = app.state.worker
    with BackgroundServer(app) as server:
        yield server.url, child
    assert not child.alive  # stopped with the app


def test_answers_equal_the_offline_engine(served, reference: Engine) -> None:
    url, child = served
    assert child.pid is not None and child.alive
    for body in RECOMMEND:
        r = post(url, "/v1/recommend", body)
        assert r.status_code == 200, r.text
        items, scores = offline(reference, body)
        assert r.json()["items"] == items
        assert torch.allclose(torch.tensor(r.json()["scores"]), torch.tensor(scores), atol=1e-5)


def test_errors_of_the_child_come_back_naming_the_field(served) -> None:
    url, child = served
    with pytest.raises(ValueError, match=r"requests\[0\]\.history"):
        child.call(RecommendBatch(4, 2), [RowRequest(history=[N_ITEMS + 5])])
    r = post(url, "/v1/recommend", {"history": [N_ITEMS + 5]})
    assert r.status_code == 422 and r.json()["detail"].startswith("history")


def test_catalog_updates_reach_both_processes(served, reference: Engine) -> None:
    url, child = served
    used = {tuple(c) for c in reference.vocab.index.codes.tolist()}
    every = torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
    sid = next(c for c in every if tuple(c) not in used)
    r = httpx.put(url + "/v1/catalog/items",
                  json={"items": [{"item_id": N_ITEMS, "semantic_id": sid}]})
    assert r.status_code == 200, r.text
    version = r.json()["catalog_version"]
    got = post(url, "/v1/recommend", {"history": [3], "allow": [N_ITEMS], "n": 1,
                                      "beam_width": 4}).json()
    assert got == {**got, "items": [str(N_ITEMS)], "catalog_version": version}
    first = post(url, "/v1/recommend", {"history": [3, 17, 8]}).json()["items"][0]
    r = httpx.request("DELETE", url + "/v1/catalog/items", json={"item_ids": [first]})
    assert r.status_code == 200 and r.json()["catalog_version"] == version + 1
    after = post(url, "/v1/recommend", {"history": [3, 17, 8]}).json()
    assert first not in after["items"] and after["catalog_version"] == version + 1
    assert httpx.get(url + "/ready").json()["catalog_version"] == version + 1


def test_signals_to_the_process_group_leave_the_engine_to_the_server(served) -> None:
    url, child = served
    os.kill(child.pid, signal.SIGINT)
    os.kill(child.pid, signal.SIGTERM)
    r = post(url, "/v1/recommend", RECOMMEND[0])
    assert r.status_code == 200 and child.alive


def test_a_dead_engine_process_makes_health_and_ready_fail(checkpoint: Path) -> None:
    spec = AppSpec.of(checkpoint, threads=1, config=ServeConfig(engine_process=True))
    app = load_app(spec)
    child = app.state.worker
    with BackgroundServer(app) as server:
        assert httpx.get(server.url + "/ready").status_code == 200
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: not child.alive)
        for path in ("/health", "/ready"):
            r = httpx.get(server.url + path)
            assert r.status_code == 503 and "engine process exited" in r.json()["detail"]
        r = post(server.url, "/v1/recommend", RECOMMEND[0])
        assert r.status_code == 503 and "engine process" in r.json()["detail"]


def test_a_failed_start_names_the_cause(tmp_path: Path, reference: Engine) -> None:
    spec = AppSpec.of(tmp_path / "missing", config=ServeConfig(engine_process=True))
    with pytest.raises(RuntimeError, match="engine process failed to start"):
        EngineProcess(spec, Worker(reference))
