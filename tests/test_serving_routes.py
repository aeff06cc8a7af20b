"""The server's routes: the probes (``/health``, ``/ready`` with the catalog version, 503
while draining; ``/metrics``), the ``X-Deadline-Ms`` header (the smaller of it and the body's
``deadline_ms`` reaches the service; a bad value 422 naming the header, on every route that
reads it) and the ``X-Min-Catalog-Version`` header (the larger of it and the body's
``min_catalog_version``; a bad value 422 naming the header)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from serving_support import RECOMMEND, Updater, error_message, post

from genrec import Engine
from genrec.serving import create_app


def test_health_ready_metrics(full: tuple[str, Updater]) -> None:
    url, _ = full
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    ready = httpx.get(url + "/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    post(url, "/v1/recommend", RECOMMEND[0])
    text = httpx.get(url + "/metrics").text
    for name in ("genrec_requests_total", "genrec_request_seconds_bucket", "genrec_batch_size",
                 "genrec_queue_depth", "genrec_catalog_version"):
        assert name in text
    assert 'endpoint="/v1/recommend",status="200"' in text
    # the memory budget taken at start, in bytes
    [budget] = [ln for ln in text.splitlines() if ln.startswith("genrec_memory_budget_bytes ")]
    assert float(budget.split()[-1]) >= 1


@pytest.fixture
def app(engine: Engine) -> Iterator[FastAPI]:
    app = create_app(engine, catalog_updater=Updater())
    yield app
    app.state.worker.close()


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


def test_ready_names_the_catalog_version_until_draining(app: FastAPI,
                                                        client: TestClient) -> None:
    r = client.get("/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready", "catalog_version": 3}
    app.state.scheduler.begin_drain()
    r = client.get("/ready")
    assert r.status_code == 503 and r.json() == {"detail": "draining"}
    assert client.get("/health").json() == {"status": "ok"}  # up, only not taking work


def test_ready_is_503_once_the_app_drains(app: FastAPI, client: TestClient) -> None:
    app.state.draining = True
    assert client.get("/ready").status_code == 503


CALLS = [
    ("post", "/v1/recommend", {"history": [1]}),
    ("post", "/v1/rank", {"history": [1], "candidates": [2]}),
    ("post", "/v1/score", {"query": [1, 2], "items": [[3]], "label_token_ids": [3]}),
    ("post", "/v1/completions", {"model": "genrec", "prompt": [1, 2]}),
    ("put", "/v1/catalog/items", {"items": [{"item_id": 1}]}),
    ("delete", "/v1/catalog/items", {"item_ids": [1]}),
]


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan", "", "1e999"])
@pytest.mark.parametrize("method,path,body", CALLS, ids=[f"{m}-{p}" for m, p, _ in CALLS])
def test_a_bad_deadline_header_is_422_naming_it(client: TestClient, method: str, path: str,
                                                body: dict, value: str) -> None:
    r = client.request(method, path, json=body, headers={"X-Deadline-Ms": value})
    assert r.status_code == 422, r.text
    assert error_message(r).startswith("X-Deadline-Ms:"), r.text


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "", "9223372036854775808", "9" * 5000],
                         ids=["x", "-1", "1.5", "empty", "2**63", "5000-digits"])
@pytest.mark.parametrize("method,path,body", CALLS[:4], ids=[p for _, p, _ in CALLS[:4]])
def test_a_bad_min_version_header_is_422_naming_it(client: TestClient, method: str, path: str,
                                                   body: dict, value: str) -> None:
    r = client.request(method, path, json=body, headers={"X-Min-Catalog-Version": value})
    assert r.status_code == 422, r.text
    assert error_message(r).startswith("X-Min-Catalog-Version:"), r.text
    assert len(error_message(r)) < 120  # a long value is quoted in part


@pytest.mark.parametrize("value", ["\u00b2", "\u00b9\u00b3"])
def test_a_latin1_digit_in_the_min_version_header_is_422_naming_it(bare: str,
                                                                  value: str) -> None:
    # http.client sends the header's latin-1 bytes, as the server decodes them; "\u00b2"
    # (superscript two) is a digit to str.isdigit but not to int
    host, port = bare.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v1/recommend", body=json.dumps({"history": [1]}),
                     headers={"Content-Type": "application/json",
                              "X-Min-Catalog-Version": value})
        r = conn.getresponse()
        status, detail = r.status, json.loads(r.read())["detail"]
    finally:
        conn.close()
    assert status == 422 and detail.startswith("X-Min-Catalog-Version:"), detail


def recorded(app: FastAPI, method: str) -> list[tuple[Any, float | None]]:
    """The (body, deadline) each call of the service's ``method`` gets from its route (it then
    runs as before)."""
    service, calls = app.state.service, []
    real = getattr(service, method)

    async def spy(body: Any, deadline_ms: float | None) -> dict:
        calls.append((body, deadline_ms))
        return await real(body, deadline_ms)

    setattr(service, method, spy)
    return calls


@pytest.mark.parametrize("header,body_ms,want", [
    (None, None, None), ("250", None, 250.0), (None, 300, 300.0), ("250", 300, 250.0),
    ("400", 300, 300.0), (" 2.5 ", None, 2.5)])
def test_the_deadline_is_the_smaller_of_header_and_body(app: FastAPI, client: TestClient,
                                                        header: str | None,
                                                        body_ms: int | None,
                                                        want: float | None) -> None:
    calls = recorded(app, "recommend")
    body = {"history": [1], "deadline_ms": body_ms} if body_ms else {"history": [1]}
    headers = {"X-Deadline-Ms": header} if header is not None else {}
    r = client.post("/v1/recommend", json=body, headers=headers)
    assert [deadline for _, deadline in calls] == [want], r.text


@pytest.mark.parametrize("header,in_body,want", [
    (None, None, None), ("2", None, 2), (None, 2, 2), ("3", 1, 3), ("1", 3, 3), (" 0 ", None, 0)])
def test_the_min_version_is_the_larger_of_header_and_body(app: FastAPI, client: TestClient,
                                                          header: str | None,
                                                          in_body: int | None,
                                                          want: int | None) -> None:
    calls = recorded(app, "rank")
    body: dict[str, Any] = {"history": [1], "candidates": [2]}
    if in_body is not None:
        body["min_catalog_version"] = in_body
    headers = {"X-Min-Catalog-Version": header} if header is not None else {}
    client.post("/v1/rank", json=body, headers=headers)
    assert [b.min_catalog_version for b, _ in calls] == [want]


def test_a_min_version_ahead_of_the_catalog_is_503(client: TestClient) -> None:
    # the tiny engine's catalog is at version 3
    ok = client.post("/v1/recommend", json={"history": [1]},
                     headers={"X-Min-Catalog-Version": "3"})
    assert ok.status_code == 200 and ok.json()["catalog_version"] == 3
    ahead = client.post("/v1/recommend", json={"history": [1], "min_catalog_version": 2},
                        headers={"X-Min-Catalog-Version": "4", "X-Deadline-Ms": "50"})
    assert ahead.status_code == 503 and ahead.headers["retry-after"] == "1"
    assert ahead.json()["detail"].startswith("min_catalog_version: 4 not reached")
