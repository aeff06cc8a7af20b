"""Crash safety of a served catalog kept in a state directory, with a real server process: a
client streams catalog updates over HTTP (upserts of small batches with Semantic IDs: new and
moved items; retires) while the server process is killed (SIGKILL) at random points, then a
new one started on the same directory (forked from a process that did the imports once),
over and over. After each kill the directory replays (offline, in this
process) to exactly the acknowledged updates, or those and the one in flight, whole: none lost,
none half applied, the version never back; after each restart ``/ready`` reports that version
and ``/v1/recommend`` answers as the offline engine over the replayed catalog. Items are named
by string ids (``song-00042``); an upsert of a new id adds an item, whose id survives the
kills with it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from serving_durable_server import SIZES, durable_engine, item_name
from serving_support import is_ready

from genrec import BeamParams, Engine
from genrec.engine import RowRequest
from genrec.live_catalog.served import ServiceCatalog
from genrec.serving.uvicorn_server import free_port

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills the server with SIGKILL")

SERVER = Path(__file__).with_name("serving_durable_server.py")
KILLS = 22  # while updates stream in
SIZE_LOADED = len(durable_engine().catalog.vocab.index.codes)  # items before any upsert
STARTUP_KILLS = 3  # while the server starts (replays, cuts a torn tail)
Update = tuple[str, list]


@dataclass
class Expected:
    """What the acknowledged updates make: each item's Semantic ID, the retired items, the
    version (one per update)."""

    codes: list[tuple[int, ...]]
    retired: set[int] = field(default_factory=set)
    version: int = 0

    def apply(self, update: Update) -> None:
        op, data = update
        if op == "retire":
            self.retired |= set(data)
        for item in data if op == "upsert" else ():
            i, sid = item["item_id"], tuple(item["semantic_id"])
            self.codes[i:i + 1] = [sid]  # a new item extends the list
            self.retired.discard(i)  # an upsert brings a retired item back
        self.version += 1

    def next_update(self, rng: random.Random) -> Update:
        """A valid update: retire 1-3 items, or upsert 1-3 (new ones, or existing ones moved)
        to Semantic IDs no item has."""
        n = len(self.codes)
        if rng.random() < 0.3:
            return "retire", sorted(rng.sample(range(n), rng.randint(1, 3)))
        taken, items, ids = set(self.codes), [], set()
        for _ in range(rng.randint(1, 3)):
            sid = tuple(rng.randrange(k) for k in SIZES)
            while sid in taken:
                sid = tuple(rng.randrange(k) for k in SIZES)
            taken.add(sid)
            item = n + sum(i >= n for i in ids) if rng.random() < 0.5 else rng.randrange(n)
            if item not in ids:
                ids.add(item)
                items.append({"item_id": item, "semantic_id": list(sid)})
        return "upsert", items


def send(client: httpx.Client, update: Update) -> httpx.Response:
    """``update`` (in rows) as the HTTP API takes it: items named by their ids."""
    op, data = update
    if op == "upsert":
        items = [{**item, "item_id": item_name(item["item_id"])} for item in data]
        return client.put("/v1/catalog/items", json={"items": items})
    return client.request("DELETE", "/v1/catalog/items",
                          json={"item_ids": [item_name(i) for i in data]})


def stream(url: str, expected: Expected, rng: random.Random) -> Update | None:
    """Send updates until the server dies; each acknowledged one applied to ``expected``.
    Returns the update in flight when it died (it may or may not have been logged)."""
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=url, timeout=10) as client:
        while True:
            assert time.monotonic() < deadline, "the server was not killed"
            update = expected.next_update(rng)
            try:
                r = send(client, update)
            except httpx.TransportError:
                return update
            assert r.status_code == 200, r.text
            assert r.json()["catalog_version"] == expected.version + 1  # never back, no gap
            expected.apply(update)


def replayed(state: Path, expected: Expected, pending: Update | None) -> Engine:
    """The directory replayed over a fresh engine (read-only), checked against ``expected``
    (with ``pending`` applied when it was logged)."""
    engine = durable_engine()
    catalog = ServiceCatalog.from_dir(engine, None, state, writable=False)
    if pending is not None and catalog.catalog_version == expected.version + 1:
        expected.apply(pending)  # logged before the kill, not acknowledged: whole
    assert catalog.catalog_version == expected.version
    current = engine.catalog
    codes = current.codes_of(torch.arange(current.num_items)).tolist()
    assert [tuple(c) for c in codes] == expected.codes
    assert set(current.retired()) == expected.retired
    names = catalog.ids.ids_of(range(len(expected.codes)))
    assert names == [item_name(i) for i in range(len(expected.codes))]  # new ones included
    return engine


def check_served(url: str, engine: Engine, expected: Expected) -> None:
    """``/ready`` has the version, ``/v1/recommend`` equals ``engine`` (the newest items and
    some retired ones allowed: retired ones never come back)."""
    assert httpx.get(url + "/ready").json()["catalog_version"] == expected.version
    n = len(expected.codes)
    newest = sorted({*range(max(0, n - 12), n), *sorted(expected.retired)[:4]})
    live_new = [i for i in range(SIZE_LOADED, n) if i not in expected.retired]
    added = [{"history": [0], "allow": live_new[-1:], "n": 1, "beam_width": 1}] * bool(live_new)
    for body in ({"history": list(range(n - 3, n)), "n": 5, "beam_width": 16},
                 {"history": [0, n - 1], "allow": newest, "n": 8, "beam_width": 16}, *added):
        named = {k: [item_name(i) for i in v] if k in ("history", "allow") else v
                 for k, v in body.items()}
        got = httpx.post(url + "/v1/recommend", json=named, timeout=30).json()
        want = engine.recommend_rows([RowRequest(body["history"], allow=body.get("allow"))],
                                BeamParams(body["beam_width"], body["n"]))[0]
        assert got["items"] == [item_name(i) for i in want.items]
        assert not {item_name(i) for i in expected.retired} & set(got["items"])
        assert got["scores"] == pytest.approx(want.scores, abs=1e-4)
        if body in added:  # an item added by an upsert, found by its id
            assert got["items"] == [item_name(live_new[-1])]


class Servers:
    """Server processes forked by one ``serving_durable_server.py --fork`` process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--fork"], cwd=SERVER.parent,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, line: str) -> list[str]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        assert answer, f"the fork server exited ({self.proc.poll()})"
        return answer

    def start(self, state: Path, port: int) -> int:
        """A new server process on ``state``; its pid."""
        return int(self._ask(f"start {state} {port}")[1])

    def kill(self, pid: int) -> None:
        """SIGKILL the server ``pid``; returns once it is gone."""
        assert self._ask(f"kill {pid}") == ["killed", str(pid)]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def wait_ready(url: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not is_ready(url):
        assert time.monotonic() < end, "the server did not get ready"
        time.sleep(0.02)


def kill_later(servers: Servers, pid: int, expected: Expected, before: int,
               delay: float) -> None:
    """SIGKILL ``pid`` ``delay`` seconds after two updates of this cycle are acknowledged
    (after 60 s at the latest), so that every cycle kills a server mid-stream however slow
    the machine is."""
    end = time.monotonic() + 60
    while expected.version - before < 2 and time.monotonic() < end:
        time.sleep(0.005)
    time.sleep(delay)
    servers.kill(pid)


def test_every_acknowledged_update_survives_sigkill(tmp_path: Path) -> None:
    rng, state = random.Random(0), tmp_path / "state"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    expected = Expected([tuple(c) for c in durable_engine().catalog.vocab.index.codes.tolist()])
    startup_kills = set(rng.sample(range(KILLS + STARTUP_KILLS), STARTUP_KILLS))
    servers, streamed = Servers(), 0
    try:
        for cycle in range(KILLS + STARTUP_KILLS):
            pid, pending = servers.start(state, port), None
            if cycle in startup_kills:  # somewhere in the start-up, ready or not
                time.sleep(rng.uniform(0.0, 0.6))
                servers.kill(pid)
            else:
                wait_ready(url)
                if cycle:
                    check_served(url, replayed(state, expected, None), expected)
                before = expected.version
                killer = threading.Thread(target=kill_later, args=(
                    servers, pid, expected, before, rng.uniform(0.0, 0.45)))
                killer.start()
                pending = stream(url, expected, rng)
                killer.join()
                streamed += expected.version - before
            replayed(state, expected, pending)
        assert streamed >= 2 * KILLS, "too few updates acknowledged between the kills"
        servers.start(state, port)  # and once more, with a last end-to-end check
        wait_ready(url)
        check_served(url, replayed(state, expected, None), expected)
    finally:
        servers.close()
