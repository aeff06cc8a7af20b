"""Scale-out: ``genrec serve --ray --replicas 2`` on loopback, called over httpx — answers
equal the offline engine's, both replicas serve, a catalog update taken by one replica is
read on both with ``min_catalog_version`` (never an older catalog), SIGTERM shuts Ray Serve
down. Without Ray, ``genrec serve --ray`` says what to install."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from serving_support import N_ITEMS, RECOMMEND, offline, post, wait_until
from typer.testing import CliRunner

from genrec import Engine
from genrec.cli import app as cli
from genrec.serving.ray_app import CATALOG_PATH, REPLICA_HEADER
from genrec.serving.uvicorn_server import free_port

# Ray Serve's own pydantic models warn on import (pydantic 2 deprecations inside Ray).
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")


@pytest.fixture(scope="module")
def served(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``genrec serve --ray --replicas 2`` in a subprocess; SIGTERM must shut it down."""
    pytest.importorskip("ray")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray
    work = tmp_path_factory.mktemp("ray")
    log = work / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "genrec.cli", "serve", "--model",
                                 str(checkpoint), "--ray", "--replicas", "2", "--port",
                                 str(port), "--threads", "1", "--catalog-state",
                                 str(work / "catalog-state")],
                                env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: b"Ray Serve replica(s) on" in log.read_bytes()
                   or proc.poll() is not None, timeout=300)
        assert proc.poll() is None, log.read_text()
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "shutting down Ray Serve" in log.read_text()
        with pytest.raises(httpx.HTTPError):  # the proxy is gone
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_two_replicas_answer_like_the_offline_engine(served: str, checkpoint: Path) -> None:
    engine = Engine.from_pretrained(checkpoint)
    health = httpx.get(served + "/health", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert health.headers[REPLICA_HEADER]
    bodies = RECOMMEND * 4
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: post(served, "/v1/recommend", b), bodies))
    replicas = set()
    for body, r in zip(bodies, answers, strict=True):
        assert r.status_code == 200, r.text
        items, scores = offline(engine, body)
        assert r.json()["items"] == items
        assert torch.allclose(torch.tensor(r.json()["scores"]), torch.tensor(scores), atol=1e-4)
        replicas.add(r.headers[REPLICA_HEADER])
    replicas |= until_both_replicas(
        lambda: {httpx.get(served + "/health", timeout=30).headers[REPLICA_HEADER]})
    assert len(replicas) == 2
    bad = post(served, "/v1/recommend", {"history": [999]})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("history:")


def test_replicas_share_catalog_updates(served: str) -> None:
    wide = {"history": [3, 17, 8], "beam_width": N_ITEMS, "n": N_ITEMS}
    retired = sorted(post(served, "/v1/recommend", wide).json()["items"])[:2]
    done = httpx.request("DELETE", served + "/v1/catalog/items", json={"item_ids": retired},
                         timeout=30)
    assert done.status_code == 200, done.text
    version = done.json()["catalog_version"]

    def read() -> set[str]:
        r = post(served, "/v1/recommend", {**wide, "min_catalog_version": version})
        if r.status_code == 503:  # not caught up within its wait: never an older answer
            assert "min_catalog_version" in r.json()["detail"]
            return set()
        assert r.status_code == 200 and r.json()["catalog_version"] >= version, r.text
        assert not set(retired) & set(r.json()["items"])
        return {r.headers[REPLICA_HEADER]}

    assert len(until_both_replicas(read)) == 2


def until_both_replicas(call: Callable[[], set[str]], timeout_s: float = 120.0) -> set[str]:
    """The replicas that answered ``call`` (which returns the replica ids it saw), made 8 at
    a time until both answered or ``timeout_s`` passed. Concurrent calls: Ray Serve's router
    may send sequential requests to the replica it last saw idle for seconds."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(8) as pool:
        while len(seen) < 2 and time.monotonic() < deadline:
            for found in pool.map(lambda _: call(), range(8)):
                seen |= found
    return seen


def test_serve_ray_without_ray_says_what_to_install(checkpoint: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    result = CliRunner().invoke(cli, ["serve", "--model", str(checkpoint), "--ray",
                                      "--replicas", "2"])
    assert result.exit_code == 1
    assert "pip install 'genrec[ray]'" in result.output
    result = CliRunner().invoke(cli, ["serve", "--model", str(checkpoint), "--replicas", "2"])
    assert result.exit_code == 1 and "--replicas needs --ray" in result.output
    result = CliRunner().invoke(cli, ["serve", "--model", str(checkpoint), "--ray",
                                      "--engine-process"])
    assert result.exit_code == 1 and "--engine-process is for the single-process" in result.output


def test_serve_ray_checks_paths_before_starting_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    result = CliRunner().invoke(cli, ["serve", "--model", str(tmp_path / "none"), "--ray"])
    assert result.exit_code == 1 and "--model" in result.output
    assert "no config.json" in result.output


def test_catalog_updates_are_refused_only_without_a_shared_state_directory() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from genrec.serving.ray_app import ReplicaMiddleware, refuses_catalog
    from genrec.serving.spec import AppSpec, ServeConfig

    shared = AppSpec("model", config=ServeConfig(catalog_state="state"))
    assert not refuses_catalog(shared, 2) and not refuses_catalog(AppSpec("model"), 1)
    assert refuses_catalog(AppSpec("model"), 2)
    app = FastAPI()
    app.put(CATALOG_PATH)(lambda: {"ok": True})
    app.add_middleware(ReplicaMiddleware, replica="r1", refuse_catalog=True)
    refused = TestClient(app).put(CATALOG_PATH)
    assert refused.status_code == 400 and "no shared catalog state" in refused.json()["detail"]
    assert refused.headers[REPLICA_HEADER] == "r1"
