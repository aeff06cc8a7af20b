"""Schema fuzzing over HTTP: a real server process on loopback (serving_fuzz_server.py, with
an api key and an admin key) gets 2,000+ requests across every endpoint, drawn by hypothesis
from its OpenAPI spec (serving_fuzz_strategies.py: valid-shaped bodies with boundary values,
huge numbers and odd unicode, bodies broken in one place, bodies that are not JSON, wrong
content types, odd deadline headers, missing or wrong keys), while a second client sends
valid requests. Asserted: no 5xx (but 503 with ``Retry-After``, a full queue, and 504 for a
request with a deadline, which passed), every error JSON ``{"detail": str}`` (OpenAI's error
object on the OpenAI-style routes), 401 exactly when
the key does not open a /v1 route, the server never dies, and the catalog it dumps on SIGTERM
(and ``/v1/recommend`` shows) is the initial one with the accepted updates replayed in order.

Reproducible (derandomized, no example database), about 30 s on 2 cores;
``GENREC_FUZZ_PROFILE=fuzz-deep`` draws new examples each run, ``GENREC_FUZZ_SCALE=5`` sends
five times as many.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving_fuzz_server import __file__ as SERVER
from serving_fuzz_server import catalog_dump, tiny_ranker
from serving_fuzz_strategies import Call, calls
from serving_support import N_ITEMS, error_message, is_ready, tiny_engine, wait_until

from genrec.catalog.id_map import IdMap
from genrec.live_catalog.ids import to_rows
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.state import CatalogState
from genrec.serving import BackgroundServer, create_app
from genrec.serving.backends import RankerCatalogUpdater
from genrec.serving.uvicorn_server import free_port

settings.register_profile(
    "fuzz-ci", deadline=None, derandomize=True, database=None, print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example])
settings.register_profile("fuzz-deep", settings.get_profile("fuzz-ci"), derandomize=False)
PROFILE = os.environ.get("GENREC_FUZZ_PROFILE", "fuzz-ci")
SCALE = float(os.environ.get("GENREC_FUZZ_SCALE", "1"))

API, ADMIN = "fuzz-api-key-7c1d", "fuzz-admin-key-42ab"
CATALOG = "/v1/catalog/items"
BUDGET = {("POST", "/v1/recommend"): 320, ("POST", "/v1/rank"): 240,
          ("POST", "/v1/score"): 300, ("POST", "/v1/completions"): 300, ("PUT", CATALOG): 360,
          ("DELETE", CATALOG): 240, ("GET", "/health"): 50, ("GET", "/ready"): 50,
          ("GET", "/metrics"): 50, ("GET", "/v1/models"): 50, ("GET", "/v1/models/{model}"): 50}
MISC_BUDGET = 150  # other methods and paths
MISC_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
MISC_PATHS = ["/v1/recommend", CATALOG, "/v1/catalog/other", "/v1/nope", "/v1", "/nope",
              "/health", "/docs", "/openapi.json", "/v1/completions", "/v1/models/gpt-4"]


@dataclass
class Run:
    """The server under test and what the fuzzing saw: the accepted catalog updates
    ``(method, body, catalog_version)`` in answer order and the requests sent per route."""

    server: subprocess.Popen
    http: httpx.Client
    accepted: list[tuple[str, dict, int]] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    statuses: dict[tuple[str, int], int] = field(default_factory=dict)

    def send(self, call: Call) -> None:
        """Send ``call`` and check the answer (see the module docstring)."""
        r = self.http.request(call.method, call.path, content=call.body, headers=call.headers,
                              params=call.params)
        where = f"{r.status_code} {r.text[:300]!r}\n{call.repro()}"
        key = f"{call.method} {call.path}"
        self.sent[key] = self.sent.get(key, 0) + 1
        self.statuses[key, r.status_code] = self.statuses.get((key, r.status_code), 0) + 1
        assert self.server.poll() is None, f"the server died\n{where}"
        assert r.status_code < 500 or allowed_5xx(r, call.has_deadline()), where
        if call.path.startswith("/v1"):
            assert (r.status_code == 401) == (not call.authorized), where
        if r.status_code >= 400 and call.method != "HEAD":
            is_json = r.headers.get("content-type", "").startswith("application/json")
            assert is_json, where
            error_message(r)  # genrec's detail, or OpenAI's error on the OpenAI-style routes
        assert API not in r.text and ADMIN not in r.text, where
        if call.path == CATALOG and r.status_code == 200:
            self.accepted.append((call.method, json.loads(call.body), r.json()["catalog_version"]))

    def fuzz(self, strategy: st.SearchStrategy[Call], examples: int) -> None:
        """``examples`` requests drawn from ``strategy``, each sent and checked."""

        @settings(settings.get_profile(PROFILE), max_examples=max(1, int(examples * SCALE)))
        @given(call=strategy)
        def one(call: Call) -> None:
            self.send(call)

        one()


def allowed_5xx(r: httpx.Response, deadline: bool) -> bool:
    """503 with Retry-After (queue full), 504 for a request with a deadline (it passed)."""
    return (r.status_code == 503 and "retry-after" in r.headers) or (
        r.status_code == 504 and deadline)


def background(url: str, stop: threading.Event, bad: list, count: int = 20_000,
               seconds: float = 300) -> None:
    """Recommend and rank requests until ``stop`` (at most ``count``, ``seconds``), valid
    but for the items the fuzzing retires meanwhile; 5xx answers (but 503 with Retry-After)
    go to ``bad``."""
    bodies = [("/v1/recommend", {"history": [1, 2, 3], "exclude": [4], "n": 5}),
              ("/v1/rank", {"history": [5], "candidates": [1, 2, 3]})]
    end = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=60, headers={"authorization": f"Bearer {API}"}) as h:
        for k in range(count):
            if stop.is_set() or time.monotonic() > end:
                return
            path, body = bodies[k % 2]
            r = h.post(path, json=body)
            if r.status_code >= 500 and not allowed_5xx(r, False):
                bad.append((path, r.status_code, r.text[:300]))
            time.sleep(0.05)


def replay(state: CatalogState, active: list[bool], accepted: list[tuple[str, dict, int]]
           ) -> tuple[CatalogState, list[bool], IdMap]:
    """The accepted updates applied in order as the server applies them: to the generative
    catalog an upsert's Semantic IDs and a retire's ids that it has; to the ranker's table
    (which items are active) the upsert items it takes and every retired id, the table grown
    by each call to the id map's rows (those it was given no item for retired); the id map
    the updates grew (an unseen id of an upsert is the next row)."""
    active, ids = list(active), IdMap.rows_named(len(active))
    for method, body, version in accepted:
        op = "upsert" if method == "PUT" else "retire"
        update = to_rows(ids, op, body["items"] if op == "upsert" else body["item_ids"], True)
        ids = update.ids
        if method == "PUT":  # a null semantic_id or embedding is no field
            items = [{k: v for k, v in it.items()
                      if k not in ("semantic_id", "embedding") or v is not None}
                     for it in update.data]
            sids = [(it["item_id"], it.get("semantic_id")) for it in items]
            new = state.updated(sids) if any(s is not None for _, s in sids) else None
            taken = [it["item_id"] for it in items if ServiceCatalog.for_ranker(it)]
            if taken:  # the ranker's call: its table grows to the id map
                active += [False] * (len(ids) - len(active))
            for i in taken:
                active[i] = True
        else:
            mine = [i for i in update.data if 0 <= i < state.num_items]
            new = state.updated(retire=mine) if mine else None
            active += [False] * (len(ids) - len(active))
            for i in update.data:
                active[i] = False
        state = state if new is None else new.with_version(version)
    return state, active, ids


def test_fuzz_every_endpoint(tmp_path: Path) -> None:
    port, dump = free_port(), tmp_path / "catalog.json"
    env = {**os.environ, "GENREC_API_KEY": API, "GENREC_ADMIN_KEY": ADMIN}
    server = subprocess.Popen([sys.executable, SERVER, str(port), str(dump)],
                              cwd=Path(SERVER).parent, env=env)
    url, stop, bad = f"http://127.0.0.1:{port}", threading.Event(), []
    load = threading.Thread(target=background, args=(url, stop, bad), daemon=True)
    try:
        wait_until(lambda: server.poll() is not None or is_ready(url), timeout=120)
        assert server.poll() is None, "the server process exited"
        with httpx.Client(base_url=url, timeout=60) as http:
            spec = http.get("/openapi.json").json()
            defs, run = spec["components"]["schemas"], Run(server, http)
            ops = {(m.upper(), p): op for p, item in spec["paths"].items()
                   for m, op in item.items()}
            assert set(ops) == set(BUDGET), "an endpoint without a fuzzing budget"
            load.start()
            for (method, path), op in ops.items():
                body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
                run.fuzz(calls([method], [path], body.get("schema"), defs, API, ADMIN),
                         BUDGET[method, path])
            everything = {"anyOf": [{"$ref": f"#/components/schemas/{k}"} for k in defs]}
            run.fuzz(calls(MISC_METHODS, MISC_PATHS, everything, defs, API, ADMIN), MISC_BUDGET)
            stop.set()
            load.join(60)
            expected, active, ids = replay(tiny_engine().catalog, [True] * N_ITEMS,
                                           run.accepted)
            check_http_view(http, expected, ids, run.accepted)
    finally:
        stop.set()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
            raise
    print(f"\n{sum(run.sent.values())} requests, {len(run.accepted)} catalog updates "
          f"accepted; answers: {sorted(run.statuses.items())}")
    assert not bad, bad[:3]
    assert sum(run.sent.values()) >= 2000 * min(SCALE, 1)
    assert all(run.sent.get(f"{m} {p}", 0) >= 20 for m, p in BUDGET), run.sent
    assert len(run.accepted) >= 10, "too few catalog updates accepted to check the catalog"
    assert server.returncode == 0
    versions = [v for _, _, v in run.accepted]
    assert versions == sorted(set(versions)), "catalog versions not strictly increasing"
    assert json.loads(dump.read_text()) == catalog_dump(expected, versions[-1], active)


def check_http_view(http: httpx.Client, expected: CatalogState, ids: IdMap,
                    accepted: list[tuple[str, dict, int]]) -> None:
    """``/ready``'s version is the last accepted update's; a beam as wide as the catalog
    returns exactly its live items (also within an ``allow`` list)."""
    assert accepted, "no catalog update accepted"
    version = http.get("/ready").json()["catalog_version"]
    assert version == accepted[-1][2]
    auth = {"authorization": f"Bearer {API}"}
    retired = set(expected.retired())
    live = [i for i in range(expected.num_items) if i not in retired]
    even = list(range(0, expected.num_items, 2))
    for allow, want in ((None, live), (even, [i for i in live if i % 2 == 0])):
        r = http.post("/v1/recommend", headers=auth, json={
            "history": [0], "n": 1024, "beam_width": 1024,
            "allow": None if allow is None else ids.ids_of(allow)})
        assert r.status_code == 200, r.text
        got = sorted(ids.rows(r.json()["items"], "items"))
        assert got == want and r.json()["catalog_version"] == version


def test_vectors_that_are_not_numbers() -> None:
    ranker = tiny_ranker()
    app = create_app(tiny_engine(), ranker=ranker, catalog_updater=RankerCatalogUpdater(ranker))
    with BackgroundServer(app) as server:
        for vectors in (None, "abc", {"a": 1}, [["x"]]):
            r = httpx.put(server.url + CATALOG, timeout=30,
                          json={"items": [{"item_id": 0, "vectors": vectors}]})
            assert r.status_code == 422, (vectors, r.status_code, r.text)
