"""Catalog updates under load on a 1M-item generative catalog (the issue's criterion): a real
server process on loopback over a random catalog (3 x 256 codes plus a dedup level), steady
recommend load from a second process (4 concurrent clients), then a stream of updates (1,000
upserts + 1,000 retires per step, enough to start a background compaction) while the load
goes on. Every answer is a 200, catalog versions never go back, retired items are never
returned, a compaction is installed, and no request during the updates takes longer than twice
the p99 latency measured before them.

About 25 s on 2 cores. The default suite checks the answers and prints the latencies (``-s``);
the latency criterion is asserted with ``GENREC_LOAD_TIMED=1`` on a quiet machine (the suite
has no timing assertions: a loaded CI machine would make them flaky):
``GENREC_LOAD_TIMED=1 pytest tests/test_serving_load_catalog.py -s``.
``GENREC_LOAD_ITEMS=100000`` runs it over another catalog size.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from serving_load_client import __file__ as CLIENT
from serving_load_server import __file__ as SERVER
from serving_load_server import random_catalog

from genrec.catalog.semantic_ids import mixed_radix_key
from genrec.live_catalog.compaction import compaction_threshold
from genrec.serving.uvicorn_server import free_port

N_ITEMS = int(os.environ.get("GENREC_LOAD_ITEMS", 1_000_000))
TIMED = os.environ.get("GENREC_LOAD_TIMED") == "1"
PER_STEP = 1000  # upserts (half new items, half new IDs for known ones) and retires per step
CONCURRENCY, WARMUP_S, BEFORE_S = 4, 3.0, 8.0
COMPACTIONS, INSTALLED = "genrec_catalog_compaction_seconds", '{outcome="installed"}'


def start_server(tmp: Path, n_items: int) -> tuple[subprocess.Popen, str, torch.Tensor, list]:
    codes, sizes = random_catalog(n_items)
    torch.save({"codes": codes, "sizes": sizes}, tmp / "codes.pt")
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, str(tmp / "codes.pt"), str(port), "1"],
                            cwd=Path(SERVER).parent)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 180
    try:
        while True:
            assert proc.poll() is None, "the server process exited"
            assert time.monotonic() < end, "the server did not get ready"
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    return proc, url, codes, sizes
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise


def free_ids(codes: torch.Tensor, sizes: list[int], count: int, seed: int) -> list[list[int]]:
    """``count`` Semantic IDs no item has, in random order."""
    g = torch.Generator().manual_seed(seed)
    cand = torch.stack([torch.randint(0, k, (2 * count + 1000,), generator=g) for k in sizes], 1)
    keys = torch.unique(mixed_radix_key(cand, sizes))
    keys = keys[~torch.isin(keys, mixed_radix_key(codes, sizes))]
    keys = keys[torch.randperm(keys.numel(), generator=g)][:count]
    assert keys.numel() == count
    out = torch.zeros(count, len(sizes), dtype=torch.int64)
    for level in reversed(range(len(sizes))):
        out[:, level] = keys % sizes[level]
        keys = keys // sizes[level]
    return out.tolist()


def plan(n_items: int) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    items = lambda m: torch.randint(0, n_items, (m,), generator=g).tolist()  # noqa: E731
    bodies = [{"history": items(8)}, {"history": items(3), "n": 5, "beam_width": 10},
              {"history": items(10), "exclude": items(20)}, {"history": items(5),
                                                            "allow": items(300)}]
    return [{"path": "/v1/recommend", "body": b} for b in bodies]


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("n_items", [N_ITEMS])
def test_catalog_updates_under_load(n_items: int, tmp_path: Path) -> None:
    server, url, codes, sizes = start_server(tmp_path, n_items)
    steps, trigger = update_plan(codes, sizes, n_items)
    stop, out = tmp_path / "stop", tmp_path / "out.json"
    client = None
    try:
        (tmp_path / "plan.json").write_text(json.dumps({
            "requests": plan(n_items), "concurrency": CONCURRENCY, "until": str(stop),
            "max_seconds": 600}))
        client = subprocess.Popen([sys.executable, CLIENT, url, str(tmp_path / "plan.json"),
                                   str(out)])
        while not Path(str(out) + ".started").exists():
            assert client.poll() is None, "load client exited"
            time.sleep(0.05)
        time.sleep(WARMUP_S)
        before = (time.monotonic(), time.monotonic() + BEFORE_S)
        time.sleep(BEFORE_S)
        updates, compacted = run_updates(url, steps, trigger)
        during = (before[1], time.monotonic())
    finally:
        stop.write_text("1")
        if client is not None:
            client.wait(timeout=120)
        text = httpx.get(url + "/metrics", timeout=10).text if server.poll() is None else ""
        server.terminate()
        server.wait(timeout=60)
    results = json.loads(out.read_text())
    check_answers(results, updates)
    lat = lambda a, b: [r["t1"] - r["t0"] for r in results if r["t1"] > a and r["t0"] < b]  # noqa: E731
    pre, upd = sorted(lat(*before)), lat(*during)
    p99 = pre[min(len(pre) - 1, math.ceil(0.99 * len(pre)) - 1)]
    seconds = metric(text, f"{COMPACTIONS}_sum{INSTALLED}")
    print(f"\n{n_items} items: {len(pre)} requests before the updates, p50 "
          f"{pre[len(pre) // 2] * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms; {len(upd)} during "
          f"{len(updates)} updates in {during[1] - during[0]:.1f} s (a compaction of "
          f"{seconds:.2f} s installed after step {compacted}), max {max(upd) * 1e3:.1f} ms")
    assert metric(text, f"{COMPACTIONS}_count{INSTALLED}") >= 1
    if TIMED:  # the latency criterion: a measurement, asserted on request only
        assert max(upd) <= 2 * p99, (f"slowest request during the updates took "
                                     f"{max(upd) * 1e3:.1f} ms, more than 2 x the p99 before "
                                     f"them ({p99 * 1e3:.1f} ms)")


@dataclass
class Step:
    """One update step: the PUT and DELETE bodies (JSON, encoded before the load starts so
    that this process stays idle while the latencies are measured) and the retired ids."""

    upsert: bytes
    retire: bytes
    retired: list[int]


def update_plan(codes: torch.Tensor, sizes: list[int], n_items: int) -> tuple[list[Step], int]:
    """Steps enough to pass the compaction threshold and go on for a while, and how many
    pass it: each upserts PER_STEP / 2 new items and gives PER_STEP / 2 known ones a new ID
    (the delta grows by PER_STEP), and retires PER_STEP other known items."""
    trigger = math.ceil(compaction_threshold(n_items) / PER_STEP)
    count, half = trigger + 60, PER_STEP // 2  # a loaded compaction takes seconds
    fresh = iter(free_ids(codes, sizes, PER_STEP * count, seed=5))
    touched = torch.randperm(n_items, generator=torch.Generator().manual_seed(9)).tolist()
    steps = []
    for step in range(count):
        base, new = step * (half + PER_STEP), n_items + step * half
        items = [{"item_id": new + j, "semantic_id": next(fresh)} for j in range(half)]
        items += [{"item_id": i, "semantic_id": next(fresh)} for i in touched[base:base + half]]
        retired = touched[base + half : base + half + PER_STEP]
        steps.append(Step(json.dumps({"items": items}).encode(),
                          json.dumps({"item_ids": retired}).encode(), retired))
    return steps, trigger


def run_updates(url: str, steps: list[Step], trigger: int
                ) -> tuple[list[tuple[float, int, list[int]]], int]:
    """Run steps until a compaction was installed and two more steps ran; returns each
    update's (answer time, version, retired ids) and the step after which it was installed."""
    updates: list[tuple[float, int, list[int]]] = []
    compacted = 0
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=60, headers=headers) as http:
        for step, todo in enumerate(steps, 1):
            for method, body, gone in (("PUT", todo.upsert, []),
                                       ("DELETE", todo.retire, todo.retired)):
                r = http.request(method, url + "/v1/catalog/items", content=body)
                assert r.status_code == 200, r.text
                updates.append((time.monotonic(), r.json()["catalog_version"], gone))
            if not compacted and step >= trigger:
                text = http.get(url + "/metrics").text
                if metric(text, f"{COMPACTIONS}_count{INSTALLED}"):
                    compacted = step
            if compacted and step >= compacted + 2:
                break
            time.sleep(0.1)
    assert compacted, f"no compaction installed after {len(steps)} steps"
    return updates, compacted


def check_answers(results: list[dict], updates: list[tuple[float, int, list[int]]]) -> None:
    """Every answer a 200; a request sent after an answer (or an update) was received carries
    no older version; no answer holds an item retired at or before its version."""
    bad = [r for r in results if r["status"] != 200]
    assert not bad, bad[:3]
    versions = [v for _, v, _ in updates]
    assert versions == list(range(versions[0], versions[0] + len(versions))), versions
    seen = sorted([(r["t1"], r["json"]["catalog_version"]) for r in results]
                  + [(t, v) for t, v, _ in updates])
    times = torch.tensor([t for t, _ in seen], dtype=torch.float64)
    newest = torch.cummax(torch.tensor([v for _, v in seen]), 0).values
    for r in results:
        k = int(torch.searchsorted(times, torch.tensor(r["t0"], dtype=torch.float64)))
        assert k == 0 or r["json"]["catalog_version"] >= int(newest[k - 1]), r
    retired_at = {i: v for _, v, gone in updates for i in gone}
    for r in results:
        version = r["json"]["catalog_version"]
        assert not [i for i in r["json"]["items"] if retired_at.get(i, version + 1) <= version], r
