"""The server under load from a second process: a bounded burst gets only 200s and 503s (with
Retry-After), every 200 equal to the offline engine / ranker; and catalog updates during load
fail no request and never mix catalog versions inside one response."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from serving_support import N_ITEMS, RECOMMEND, offline, tiny_engine

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.item_table import ItemTable
from genrec.duolm.prompts import SOFT_ID, STUDENT_VOCAB_SIZE, YES_ID
from genrec.duolm.ranker import DuoRanker, rank_requests
from genrec.duolm.requests import RowRankRequest
from genrec.engine import RowRequest
from genrec.live_catalog.state import CatalogState
from genrec.model.registry import build_model
from genrec.serving import BackgroundServer, ServeConfig, create_app
from genrec.serving.backends import RankerCatalogUpdater
from genrec.training.duolm_task import ranker_config
from genrec.training.initialization import init_weights

CLIENT = Path(__file__).with_name("serving_load_client.py")
K, HIDDEN = 2, 32
RANK = [{"history": [1, 2, 3], "candidates": [4, 5, 6, 10]},
        {"history": [11], "candidates": [1, 2]},
        {"history": [], "candidates": [3, 4, 5, 6, 10, 11]}]
RANK_ITEMS = {i for body in RANK for i in body["history"] + body["candidates"]}
PLAN = ([{"path": "/v1/recommend", "body": b} for b in RECOMMEND]
        + [{"path": "/v1/rank", "body": b} for b in RANK])


def duo_ranker(seed: int = 0) -> DuoRanker:
    """A random DuoLM student over the same 40 items as the generative engine."""
    torch.manual_seed(seed)
    model = build_model(ranker_config(STUDENT_VOCAB_SIZE, HIDDEN, 2, 4, 2, 128))
    init_weights(model, std=0.2)
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID))
    return DuoRanker(engine, ItemTable(torch.randn(N_ITEMS, K, HIDDEN)))


@dataclass
class Served:
    url: str
    engine: Engine
    ranker: DuoRanker
    # what each catalog version served: the ranker's table and the generative catalog
    versions: dict[int, tuple[ItemTable, CatalogState]] = field(default_factory=dict)

    def record(self, version: int) -> None:
        self.versions[version] = (self.ranker.table, self.engine.catalog)


def slowed(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` after a short pause: widens the window in which a catalog update that was
    not serialised with the engine batches would change the catalog under a running batch."""

    def run(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)
        return method(*args, **kwargs)

    return run


def serve(max_queue: int, slow: bool = False) -> Iterator[Served]:
    engine, ranker = tiny_engine(), duo_ranker()
    if slow:
        engine.run_recommend = slowed(engine.run_recommend)  # type: ignore[method-assign]
        ranker.rank_rows = slowed(ranker.rank_rows)  # type: ignore[method-assign]
    app = create_app(engine, ranker=ranker, catalog_updater=RankerCatalogUpdater(ranker),
                     config=ServeConfig(max_batch_size=8, max_wait_ms=2, max_queue=max_queue))
    with BackgroundServer(app) as server:
        served = Served(server.url, engine, ranker)
        served.record(app.state.service.catalog_version())
        yield served


def run_client(tmp: Path, url: str, plan: dict) -> subprocess.Popen:
    (tmp / "plan.json").write_text(json.dumps(plan))
    return subprocess.Popen([sys.executable, str(CLIENT), url, str(tmp / "plan.json"),
                             str(tmp / "out.json")])


class Expected:
    """Offline answers per (plan index, catalog version), computed once each."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.cache: dict[tuple[int, int], tuple[list[int] | None, list[float]]] = {}

    def __call__(self, k: int, version: int) -> tuple[list[int] | None, list[float]]:
        key = (k, version)
        if key not in self.cache:
            table, catalog = self.served.versions[version]
            body = PLAN[k]["body"]
            if PLAN[k]["path"] == "/v1/rank":
                req = RowRankRequest(body["history"], body["candidates"])
                scores = rank_requests(self.served.ranker.engine, self.served.ranker.prompts,
                                       [req], YES_ID, table.num_items, table, feedback=True)[0]
                self.cache[key] = None, scores.tolist()
            else:
                req = RowRequest(body["history"], body.get("user_vector"),
                                       body.get("exclude"), body.get("allow"))
                params = BeamParams(body.get("beam_width", 20), body.get("n", 10))
                rec = self.served.engine.recommend_rows([req], params, catalog=catalog)[0]
                self.cache[key] = rec.items, rec.scores
        return self.cache[key]


def check(results: list[dict], expected: Expected) -> dict[str, int]:
    """Every answer is a 200 equal to the offline one at its version, or a 503 with
    Retry-After; returns the count of each status."""
    counts: dict[str, int] = {}
    for res in results:
        status, body = res["status"], res["json"]
        counts[str(status)] = counts.get(str(status), 0) + 1
        if status == 503:
            assert res["retry_after"] is not None, res
            continue
        assert status == 200, res
        items, scores = expected(res["k"], body["catalog_version"])
        if items is None:  # /v1/rank
            assert torch.allclose(torch.tensor(body["scores"]), torch.tensor(scores),
                                  atol=1e-5), res
        else:
            _, catalog = expected.served.versions[body["catalog_version"]]
            assert not {int(i) for i in body["items"]} & set(catalog.retired()), res
            assert body["items"] == [str(i) for i in items], res
            assert torch.allclose(torch.tensor(body["scores"]), torch.tensor(scores),
                                  atol=1e-4), res
    return counts


@pytest.fixture
def small_queue() -> Iterator[Served]:
    yield from serve(max_queue=16)


@pytest.fixture
def roomy() -> Iterator[Served]:
    yield from serve(max_queue=256, slow=True)


def test_bounded_load_from_another_process(small_queue: Served, tmp_path: Path) -> None:
    served = small_queue
    plan = {"requests": [PLAN[k % len(PLAN)] for k in range(200)], "concurrency": 200}
    proc = run_client(tmp_path, served.url, plan)
    assert proc.wait(timeout=120) == 0
    results = json.loads((tmp_path / "out.json").read_text())
    assert len(results) == 200
    for res in results:
        res["k"] %= len(PLAN)
    counts = check(results, Expected(served))
    assert set(counts) <= {"200", "503"} and counts.get("200", 0) >= 16, counts
    assert {PLAN[r["k"]]["path"] for r in results if r["status"] == 200} == {
        "/v1/recommend", "/v1/rank"}


def test_catalog_updates_during_load(roomy: Served, tmp_path: Path) -> None:
    served = roomy
    url = served.url
    stop = tmp_path / "stop"
    proc = run_client(tmp_path, url, {"requests": PLAN, "concurrency": 12, "until": str(stop),
                                      "max_seconds": 60})
    started = tmp_path / "out.json.started"
    end = time.monotonic() + 30
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < end, "load client did not start"
        time.sleep(0.02)
    free = [c for c in torch.cartesian_prod(*[torch.arange(k) for k in (5, 4, 3)]).tolist()
            if tuple(c) not in {tuple(r) for r in served.engine.vocab.index.codes.tolist()}]
    first_items = {int(i) for body in RECOMMEND for i in offline(served.engine, body)[0][:2]}
    retire = sorted(first_items - RANK_ITEMS)
    g = torch.Generator().manual_seed(1)

    def vectors(n: int = 1) -> list:
        return torch.randn(n, K, HIDDEN, generator=g).tolist()

    updates = [
        ("PUT", {"items": [{"item_id": i, "vectors": v}
                           for i, v in zip((4, 5, 1), vectors(3), strict=True)]}),
        ("DELETE", {"item_ids": retire[:3]}),
        ("PUT", {"items": [{"item_id": N_ITEMS, "semantic_id": free[0], "vectors": vectors()[0]},
                           {"item_id": 6, "vectors": vectors()[0]}]}),
        ("PUT", {"items": [{"item_id": N_ITEMS + 1, "semantic_id": free[1]}]}),
        ("DELETE", {"item_ids": retire[3:]}),
        ("PUT", {"items": [{"item_id": i, "vectors": v}
                           for i, v in zip((10, 2, 3, 11), vectors(4), strict=True)]}),
    ]
    try:
        for method, body in updates:
            time.sleep(0.25)
            r = httpx.request(method, url + "/v1/catalog/items", json=body, timeout=60)
            assert r.status_code == 200, r.text
            served.record(r.json()["catalog_version"])
        time.sleep(0.25)
    finally:
        stop.write_text("1")
        assert proc.wait(timeout=60) == 0
    results = json.loads((tmp_path / "out.json").read_text())
    counts = check(results, Expected(served))
    assert set(counts) <= {"200", "503"}, counts
    seen = {(PLAN[r["k"]]["path"], r["json"]["catalog_version"]) for r in results
            if r["status"] == 200}
    versions = sorted(served.versions)
    assert len(versions) == len(updates) + 1
    assert len({v for _, v in seen}) >= 3, seen  # the load spanned several versions
    assert f"genrec_catalog_version {float(versions[-1])}" in httpx.get(url + "/metrics").text
    # the versions differ where it matters: rank scores change, retired items disappear
    expected = Expected(served)
    assert expected(len(RECOMMEND), versions[0])[1] != expected(len(RECOMMEND), versions[1])[1]
    assert set(served.versions[versions[-1]][1].retired()) == set(retire)
