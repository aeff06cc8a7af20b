"""A load generator for the serving tests, run as a separate process (not a test module).

    python serving_load_client.py URL PLAN.json OUT.json

PLAN: ``{"requests": [{"path": "/v1/rank", "body": {...}}, ...], "concurrency": C,
"until": STOP_FILE or null, "max_seconds": S}``. Without ``until``, every request of the plan
is sent at once (C connections at most) and the client exits when all have answered. With
``until``, C workers cycle through the plan until STOP_FILE exists (or ``max_seconds`` pass);
the client writes ``OUT.json.started`` once its first answer arrived.

OUT: one record per answer, ``{"k": plan index, "status": int, "retry_after": str | null,
"json": body or null, "error": transport error or null, "w": worker (with ``until``), "t0",
"t1": ``time.monotonic()`` when it was sent and answered}`` (on Linux the monotonic clock is
the same in every process, so the test can place each answer in its phases). Only httpx and
the standard library are used, so the process starts fast and shares nothing with the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx


async def one(client: httpx.AsyncClient, url: str, k: int, request: dict) -> dict:
    t0 = time.monotonic()
    try:
        r = await client.post(url + request["path"], json=request["body"])
    except httpx.HTTPError as err:
        return {"k": k, "status": 0, "retry_after": None, "json": None, "error": repr(err),
                "t0": t0, "t1": time.monotonic()}
    t1 = time.monotonic()
    try:
        body = r.json()
    except ValueError:
        body = None
    return {"k": k, "status": r.status_code, "retry_after": r.headers.get("retry-after"),
            "json": body, "error": None, "t0": t0, "t1": t1}


async def run(url: str, plan: dict, out: Path) -> list[dict]:
    requests = plan["requests"]
    concurrency = int(plan.get("concurrency", len(requests)))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: list[dict] = []
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        stop = plan.get("until")
        if stop is None:
            return list(await asyncio.gather(*(one(client, url, k, req)
                                               for k, req in enumerate(requests))))
        end = time.monotonic() + float(plan.get("max_seconds", 60))
        started = Path(str(out) + ".started")

        async def worker(w: int) -> None:
            k = w % len(requests)
            while not os.path.exists(stop) and time.monotonic() < end:
                results.append({**await one(client, url, k, requests[k]), "w": w})
                if not started.exists():
                    started.write_text("1")
                k = (k + 1) % len(requests)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return results


def main() -> None:
    url, plan_file, out_file = sys.argv[1:4]
    plan = json.loads(Path(plan_file).read_text())
    results = asyncio.run(run(url, plan, Path(out_file)))
    tmp = Path(out_file + ".tmp")
    tmp.write_text(json.dumps(results))
    tmp.replace(out_file)


if __name__ == "__main__":
    main()
