"""Serving benchmark: throughput and p50/p99 latency of ``genrec serve`` against concurrency,
and the offline engine on the same requests.

- offline: ``Engine.recommend`` (and ``DuoRanker.rank_rows`` with ``--ranker``) called directly on
  the same requests, in batches of ``--max-batch-size`` — the ceiling the server's dynamic
  batching can reach;
- server: ``genrec serve`` in its own process on loopback; ``c`` concurrent clients (httpx,
  one asyncio task each) send requests back to back for ``--duration`` seconds per level.

The server/offline ratio is the share of the engine's throughput that survives HTTP, JSON and
batching. Client and server share the machine's cores.

Quick run: ``python bench/serve.py --duration 3``. ``--overlap compare``: the server without,
then with overlap scheduling (batch k+1 packed while batch k runs), side by side. With a ranker:
``python bench/serve.py --ranker RANKER_DIR --item-store STORE_DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ModelShape,
    build_checkpoint,
    format_table,
    machine_note,
    write_json,
)
from common import start_server as start_genrec  # noqa: E402

from genrec import BeamParams, Engine  # noqa: E402
from genrec.catalog.semantic_ids import SemanticIndex  # noqa: E402
from genrec.engine import RowRequest  # noqa: E402
from genrec.vocab.sid_vocab import NUM_SPECIAL, SidVocab  # noqa: E402


def make_model(work: Path, args: argparse.Namespace) -> Path:
    """A random Qwen3 checkpoint with a random Semantic-ID catalog saved beside it."""
    g = torch.Generator().manual_seed(0)
    sizes = [args.codes] * args.levels
    codes = torch.unique(torch.randint(0, args.codes, (int(args.items * 1.2), args.levels),
                                       generator=g), dim=0)
    codes = codes[torch.randperm(codes.shape[0], generator=g)[: args.items]]
    vocab = SidVocab(SemanticIndex(codes, sizes), max_history=args.history)
    shape = ModelShape(hidden=args.hidden, layers=args.layers, heads=4, kv_heads=2,
                       head_dim=args.hidden // 4, intermediate=3 * args.hidden,
                       vocab=NUM_SPECIAL + sum(sizes))
    ckpt = build_checkpoint(shape, work / "model", max_positions=1024)
    vocab.save(ckpt)
    return ckpt


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def offline_rate(call: Any, payloads: list[Any], batch: int, seconds: float) -> float:
    """Requests per second of ``call(batch of payloads)`` looped for about ``seconds``."""
    call(payloads[:batch])  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        i = done % len(payloads)
        chunk = payloads[i:i + batch]
        call(chunk)
        done += len(chunk)
    return done / (time.perf_counter() - start)


async def _raw_post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> int:
    """One HTTP/1.1 keep-alive request on an open connection; returns the status code."""
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def load(url: str, path: str, bodies: list[dict], concurrency: int,
               seconds: float, client: str = "raw") -> dict[str, float]:
    """``concurrency`` clients sending ``bodies`` round robin for ``seconds``.

    ``raw``: one keep-alive connection per client, requests pre-encoded, a minimal HTTP/1.1
    exchange (the clients share the server's cores, so a cheap client disturbs it least);
    ``httpx``: httpx.AsyncClient.
    """
    latencies: list[float] = []
    errors = 0
    host, port = url.split("//", 1)[1].split(":")
    encoded = []
    for body in bodies:
        data = json.dumps(body).encode()
        encoded.append(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                       f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                       + data)
    if client == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency + 2)
        http = httpx.AsyncClient(base_url=url, timeout=60, limits=limits)

        async def post(i: int, _conn: Any) -> int:
            return (await http.post(path, json=bodies[i % len(bodies)])).status_code
    else:
        http = None

        async def post(i: int, conn: Any) -> int:
            return await _raw_post(*conn, encoded[i % len(encoded)])

    conns = [await asyncio.open_connection(host, int(port)) if http is None else None
             for _ in range(concurrency)]
    for k in range(concurrency):  # warm-up: connections open
        await post(k, conns[k])
    end = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal errors
        i = k
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            if await post(i, conns[k]) == 200:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1
            i += concurrency

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    wall = time.perf_counter() - start
    for conn in conns:
        if conn is not None:
            conn[1].close()
    if http is not None:
        await http.aclose()
    if not latencies:
        return {"requests_per_s": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan"),
                "errors": errors}
    return {"requests_per_s": len(latencies) / wall,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * percentile(latencies, 0.99), "errors": errors}


def start_server(args: argparse.Namespace, model: Path, port: int,
                 overlap: str = "default") -> subprocess.Popen:
    cmd = [sys.executable, "-m", "genrec.cli", "serve", "--model", str(model), "--port",
           str(port), "--max-batch-size", str(args.max_batch_size), "--max-wait-ms",
           str(args.max_wait_ms), "--threads", str(args.threads), "--log-level", "warning",
           "--max-queue", "4096"]
    if args.ranker:
        cmd += ["--ranker", args.ranker, "--item-store", args.item_store]
    if args.engine_process:
        cmd.append("--engine-process")
    if overlap != "default":
        cmd.append(f"--{'' if overlap == 'on' else 'no-'}overlap")
    return start_genrec(cmd, port)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="a generative checkpoint (default: random)")
    p.add_argument("--ranker", default=None, help="DuoLM ranker: also bench /v1/rank")
    p.add_argument("--item-store", default=None, help="the ranker's item store")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per setting")
    p.add_argument("--items", type=int, default=2000, help="random catalog size")
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--codes", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--history", type=int, default=20, help="items per user history")
    p.add_argument("--beam-width", type=int, default=20)
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--candidates", type=int, default=50, help="/v1/rank candidates per user")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (server and offline)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--engine-process", action="store_true",
                   help="genrec serve --engine-process: the engine in its own process")
    p.add_argument("--client", default="raw", choices=["raw", "httpx"],
                   help="load generator: minimal keep-alive HTTP/1.1 (raw) or httpx")
    p.add_argument("--overlap", default="default", choices=["default", "on", "off", "compare"],
                   help="the server's overlap scheduling (compare: off, then on, side by side)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ranker and not args.item_store:
        raise SystemExit("--ranker needs --item-store STORE")
    torch.set_num_threads(args.threads)
    levels = [int(x) for x in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="genrec-serve-bench-"))
    model = Path(args.model) if args.model else make_model(work, args)
    engine = Engine.from_pretrained(model)
    n_items = engine.vocab.index.num_items
    g = torch.Generator().manual_seed(1)
    histories = [torch.randint(0, n_items, (args.history,), generator=g).tolist()
                 for _ in range(256)]
    bodies = {"/v1/recommend": [{"history": h, "n": args.n, "beam_width": args.beam_width}
                                for h in histories]}
    params = BeamParams(beam_width=args.beam_width, n=args.n)
    offline = {"/v1/recommend": offline_rate(
        lambda hs: engine.recommend_rows([RowRequest(h) for h in hs], params), histories,
        args.max_batch_size, args.duration)}
    if args.ranker:
        from genrec.duolm.requests import RowRankRequest
        from genrec.serving.backends import load_ranker

        ranker = load_ranker(args.ranker, args.item_store)
        r_items = ranker.table.num_items if hasattr(ranker, "table") else n_items
        rank_reqs = [RowRankRequest(h[:args.history],
                                    torch.randint(0, r_items, (args.candidates,),
                                                  generator=g).tolist())
                     for h in [[i % r_items for i in h] for h in histories]]
        bodies["/v1/rank"] = [{"history": list(r.history), "candidates": list(r.candidates)}
                              for r in rank_reqs]
        offline["/v1/rank"] = offline_rate(ranker.rank_rows, rank_reqs, args.max_batch_size,
                                           args.duration)
        del ranker
    print("offline: " + ", ".join(f"{k} {v:.1f} req/s" for k, v in offline.items()),
          flush=True)
    from genrec.serving.uvicorn_server import free_port

    settings = ["off", "on"] if args.overlap == "compare" else [args.overlap]
    records = []
    for overlap in settings:
        port = args.port or free_port()
        proc = start_server(args, model, port, overlap)
        try:
            for path, reqs in bodies.items():
                for c in levels:
                    res = asyncio.run(load(f"http://127.0.0.1:{port}", path, reqs, c,
                                           args.duration, args.client))
                    rec = {"endpoint": path, "overlap": overlap, "concurrency": c, **res,
                           "offline_requests_per_s": offline[path],
                           "ratio": res["requests_per_s"] / offline[path]}
                    records.append(rec)
                    print(f"{path} overlap={overlap} c={c}: {res['requests_per_s']:.1f} req/s, "
                          f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    rows = [[r["endpoint"], r["overlap"], str(r["concurrency"]), f"{r['requests_per_s']:.1f}",
             f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['offline_requests_per_s']:.1f}",
             f"{r['ratio']:.2f}", str(r["errors"])] for r in records]
    print()
    print(format_table(["endpoint", "overlap", "clients", "req/s", "p50 ms", "p99 ms",
                        "offline req/s", "server/offline", "errors"], rows))
    if args.json:
        write_json(args.json, {"machine": machine_note(), "settings": vars(args),
                               "results": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
