"""Replicas that agree: two real ``genrec serve`` processes on loopback sharing one
``--catalog-state`` directory. Two clients send catalog updates, one to each server, at the
same time, while a third sends recommendations to both. Each writer reads its own write on the
other server with ``min_catalog_version`` (an answer of that version or later, or a 503, never
an older one); the versions never fork (every acknowledged update is in the log exactly once,
versions one by one); at the end both servers are at the same version and give the same
answers (wide beams: the same live items)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving_support import N_ITEMS, RECOMMEND, is_ready, post, rows, wait_until

from genrec import Engine
from genrec.live_catalog.stored import read_state
from genrec.model import save_model
from genrec.serving.uvicorn_server import free_port

WIDE = {"history": [3, 17, 8], "beam_width": N_ITEMS, "n": N_ITEMS}  # every live item
OWNED = (range(20, 30), range(30, 40))  # the items each writer updates (none in WIDE's history)
STEPS = 12  # updates per writer
Update = tuple[str, list]


def start(model: Path, state: Path, n: int) -> list[tuple[subprocess.Popen, str]]:
    """``n`` servers on ``state``, started together, once all are ready."""
    servers = []
    for _ in range(n):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "genrec.cli", "serve", "--model",
                                 str(model), "--catalog-state", str(state), "--port", str(port),
                                 "--threads", "1", "--log-level", "warning"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        servers.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in servers:
        wait_until(lambda: is_ready(url) or proc.poll() is not None, timeout=120)  # noqa: B023
        assert proc.poll() is None, proc.stdout.read().decode()
    return servers


def send(url: str, update: Update) -> httpx.Response:
    op, data = update
    if op == "upsert":
        return httpx.put(url + "/v1/catalog/items", json={"items": data}, timeout=30)
    return httpx.request("DELETE", url + "/v1/catalog/items", json={"item_ids": data},
                         timeout=30)


class Writer:
    """Retires and restores (its own Semantic ID again) the items it owns, on one server, and
    reads each write on another."""

    def __init__(self, k: int, codes: list[list[int]], write_url: str, read_url: str) -> None:
        self.own, self.codes = set(OWNED[k]), codes
        self.write_url, self.read_url = write_url, read_url
        self.rng, self.dead = random.Random(k), set()
        self.acknowledged: list[tuple[int, str, list]] = []
        self.behind = 0  # reads answered 503: the other server not there yet
        self.error: BaseException | None = None

    def next_update(self) -> Update:
        live = sorted(self.own - self.dead)
        if self.dead and (not live or self.rng.random() < 0.5):
            back = self.rng.sample(sorted(self.dead), min(2, len(self.dead)))
            return "upsert", [{"item_id": i, "semantic_id": self.codes[i]} for i in sorted(back)]
        return "retire", sorted(self.rng.sample(live, min(2, len(live))))

    def run(self) -> None:
        try:
            for _ in range(STEPS):
                op, data = self.next_update()
                answer = send(self.write_url, (op, data))
                assert answer.status_code == 200, answer.text
                version = answer.json()["catalog_version"]
                assert not self.acknowledged or version > self.acknowledged[-1][0]
                self.acknowledged.append((version, op, data))
                self.dead = (self.dead | set(data) if op == "retire"
                             else self.dead - {it["item_id"] for it in data})
                self.read(version)
        except BaseException as err:  # noqa: BLE001 - raised in the test's thread
            self.error = err

    def read(self, version: int) -> None:
        answer = post(self.read_url, "/v1/recommend", {**WIDE, "min_catalog_version": version})
        if answer.status_code == 503:
            assert "min_catalog_version" in answer.json()["detail"]
            assert answer.headers["Retry-After"]
            self.behind += 1
            return
        assert answer.status_code == 200, answer.text
        assert answer.json()["catalog_version"] >= version  # never an older catalog
        assert set(rows(answer.json()["items"])) & self.own == self.own - self.dead


def load(urls: list[str], stop: threading.Event, seen: list[BaseException]) -> None:
    """Recommendations to every server in turn until ``stop`` (bounded): each a 200, the
    versions each server answers with never going back."""
    last = dict.fromkeys(urls, -1)
    end = time.monotonic() + 120
    try:
        for k in range(5000):
            if stop.is_set() or time.monotonic() > end:
                return
            url = urls[k % len(urls)]
            answer = post(url, "/v1/recommend", RECOMMEND[k % 4])
            assert answer.status_code == 200, answer.text
            assert answer.json()["catalog_version"] >= last[url]
            last[url] = answer.json()["catalog_version"]
    except BaseException as err:  # noqa: BLE001 - raised in the test's thread
        seen.append(err)


def test_two_servers_on_one_state_directory_agree(tmp_path: Path, engine: Engine) -> None:
    model = tmp_path / "model"
    save_model(engine.model, model)
    engine.vocab.save(model)
    state = tmp_path / "state"
    servers = start(model, state, 2)
    urls = [url for _, url in servers]
    try:
        start_version = httpx.get(urls[0] + "/ready").json()["catalog_version"]
        codes = engine.vocab.index.codes.tolist()
        writers = [Writer(k, codes, urls[k], urls[1 - k]) for k in range(2)]
        stop, load_errors = threading.Event(), []
        loader = threading.Thread(target=load, args=(urls, stop, load_errors))
        threads = [threading.Thread(target=w.run) for w in writers]
        loader.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        stop.set()
        loader.join(60)
        for w in writers:
            assert w.error is None, w.error
        assert not load_errors, load_errors[0]
        # never forked: every acknowledged update in the log once, versions one by one
        acknowledged = sorted(a for w in writers for a in w.acknowledged)
        end_version = start_version + 2 * STEPS
        assert [v for v, _, _ in acknowledged] == list(range(start_version + 1, end_version + 1))
        records = read_state(state).records
        assert [(r.version, r.op, r.data) for r in records] == acknowledged
        # both at the end version, with the same answers
        for url in urls:
            wait_until(lambda: httpx.get(url + "/ready").json()["catalog_version"]  # noqa: B023
                       == end_version, timeout=10)
        for body in (WIDE, *RECOMMEND):
            one, two = (post(url, "/v1/recommend", body).json() for url in urls)
            assert one["items"] == two["items"] and one["catalog_version"] == end_version
            assert one["scores"] == pytest.approx(two["scores"], abs=1e-4)
        dead = set().union(*(w.dead for w in writers))
        assert set(rows(post(urls[0], "/v1/recommend", WIDE).json()["items"])) == (
            set(range(N_ITEMS)) - dead)
        at_end = {"min_catalog_version": end_version}
        score = post(urls[1], "/v1/score", {"query": [0, 3, 4], "items": [[6], [8]],
                                           "label_token_ids": [3], **at_end})
        assert score.status_code == 200, score.text
        assert score.json()["meta_info"]["catalog_version"] == end_version
        sid = "".join(f"<{chr(97 + k)}_{c}>" for k, c in enumerate(codes[0]))
        done = post(urls[1], "/v1/completions", {"prompt": sid, "use_beam_search": True,
                                                 "n": 2, **at_end})
        assert done.json()["catalog_version"] == end_version, done.text
        # a version no replica has: a bounded wait, then 503 naming the field
        ahead = post(urls[1], "/v1/recommend", {**WIDE, "min_catalog_version": end_version + 1})
        assert ahead.status_code == 503 and "min_catalog_version" in ahead.json()["detail"]
        assert ahead.headers["Retry-After"]
        by_header = post(urls[0], "/v1/recommend", WIDE,
                         headers={"X-Min-Catalog-Version": str(end_version + 1)})
        assert by_header.status_code == 503 and by_header.headers["Retry-After"]
        met = post(urls[0], "/v1/recommend", WIDE,
                   headers={"X-Min-Catalog-Version": str(end_version)})
        assert met.status_code == 200 and met.json()["catalog_version"] == end_version
        bad = post(urls[0], "/v1/recommend", WIDE, headers={"X-Min-Catalog-Version": "x"})
        assert bad.status_code == 422 and "X-Min-Catalog-Version" in bad.json()["detail"]
        metrics = httpx.get(urls[1] + "/metrics").text
        assert 'genrec_rejected_total{reason="catalog_behind"}' in metrics
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait(30)
