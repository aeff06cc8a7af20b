"""The batch job against the HTTP path: recommendations for the same users on the same model,
once by ``genrec recommend`` (the engine in batches, no HTTP) and once through a real
``genrec serve`` process (one ``/v1/recommend`` per user, ``--clients`` concurrent clients),
both with each user's history excluded; prints users/s of each and their ratio, and how many
users got the same items both ways.

The users: ``--interactions`` [``--items``] (a table over the model's catalog), or, by default,
``--users`` generated users with ``--history`` random items of the model's catalog each. Model
loading and server start are not timed; the batch job's figure is the one it prints itself
(recommendation and writing). Client and server share the machine's cores.

Quick run on the demo's model::

    genrec demo --no-serve --out DEMO
    python bench/batch.py --model DEMO --users 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import format_table, machine_note, write_json  # noqa: E402
from common import start_server as start_genrec  # noqa: E402

from genrec.catalog.semantic_ids import SemanticIndex  # noqa: E402
from genrec.data import load_table_dataset  # noqa: E402
from genrec.serving.uvicorn_server import free_port  # noqa: E402
from genrec.vocab.sid_vocab import INDEX_FILE  # noqa: E402

_RATE = re.compile(r"(\d+) users in ([\d.]+) s \(([\d.]+) users/s\)")


def write_users(work: Path, model: Path, users: int, history: int,
                seed: int) -> tuple[Path, Path]:
    """An interactions table of ``users`` users with ``history`` distinct random items each,
    and an items table of the model's whole catalog (its ids, or row numbers)."""
    index = SemanticIndex.load(model / INDEX_FILE)
    ids = index.item_ids or [str(i) for i in range(index.num_items)]
    g = np.random.default_rng(seed)
    inter, items = work / "interactions.csv", work / "items.csv"
    rows = ["user_id,item_id,timestamp"]
    for u in range(users):
        for t, i in enumerate(g.choice(len(ids), size=min(history, len(ids)), replace=False)):
            rows.append(f"u{u},{ids[i]},{t}")
    inter.write_text("\n".join(rows) + "\n")
    items.write_text("item_id,title\n" + "".join(f"{i},item {i}\n" for i in ids))
    return inter, items


def run_batch(args: argparse.Namespace, inter: Path, items: Path | None,
              out: Path) -> dict[str, Any]:
    """``genrec recommend`` in its own process; its own timing of the job."""
    cmd = [sys.executable, "-m", "genrec", "recommend", "--model", str(args.model),
           "--interactions", str(inter), "--out", str(out), "--n", str(args.n),
           "--beam-width", str(args.beam_width), "--batch-size", str(args.batch_size),
           "--threads", str(args.threads), "--device", args.device, "--no-progress"]
    if items is not None:
        cmd += ["--items", str(items)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = _RATE.search(run.stdout)
    if run.returncode or found is None:
        raise RuntimeError(f"genrec recommend failed:\n{run.stdout}\n{run.stderr}")
    return {"users": int(found[1]), "seconds": float(found[2]),
            "users_per_s": float(found[3])}


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "genrec", "serve", str(args.model), "--port", str(port),
           "--threads", str(args.threads), "--device", args.device, "--max-batch-size",
           str(args.max_batch_size), "--max-queue", "4096", "--volatile-catalog",
           "--log-level", "warning"]
    return start_genrec(cmd, port)


async def run_http(url: str, histories: list[list[str]], args: argparse.Namespace
                   ) -> tuple[dict[str, Any], list[list[str]]]:
    """One ``/v1/recommend`` per user (histories in the table's item ids) from
    ``args.clients`` concurrent clients; the answers' items in user order."""
    answers: list[list[str]] = [[] for _ in histories]
    queue = iter(range(len(histories)))

    async def client(http: httpx.AsyncClient) -> None:
        for u in queue:
            body = {"history": histories[u], "n": args.n, "beam_width": args.beam_width,
                    "exclude": sorted(set(histories[u]))}
            r = await http.post("/v1/recommend", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"user {u}: {r.status_code} {r.text}")
            answers[u] = r.json()["items"]

    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await http.post("/v1/recommend", json={"history": histories[0], "n": args.n,
                                               "beam_width": args.beam_width})  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(args.clients)))
        seconds = time.perf_counter() - start
    return {"users": len(histories), "seconds": round(seconds, 2),
            "users_per_s": round(len(histories) / seconds, 1)}, answers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="generative checkpoint folder")
    p.add_argument("--interactions", type=Path, help="users' table (default: generated)")
    p.add_argument("--items", type=Path, help="items table of --interactions")
    p.add_argument("--users", type=int, default=2000, help="generated users")
    p.add_argument("--history", type=int, default=20, help="items per generated user")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--beam-width", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=128, help="users per engine call (batch)")
    p.add_argument("--max-batch-size", type=int, default=32, help="server's dynamic batches")
    p.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inter, items = ((args.interactions, args.items) if args.interactions is not None
                        else write_users(work, args.model, args.users, args.history, args.seed))
        ds = load_table_dataset(inter, items)
        batch = run_batch(args, inter, items, work / "recs.jsonl")
        lines = [json.loads(line) for line in (work / "recs.jsonl").read_text().splitlines()]
        port = free_port()
        server = start_server(args, port)
        try:
            histories = [[ds.item_ids[i] for i in seq] for seq in ds.sequences]
            http, answers = asyncio.run(run_http(f"http://127.0.0.1:{port}", histories, args))
        finally:
            server.terminate()
            server.wait(timeout=60)
    same = sum(line["items"] == items_ for line, items_ in zip(lines, answers, strict=True))
    ratio = batch["users_per_s"] / http["users_per_s"]
    print(format_table(["path", "users", "seconds", "users/s"], [
        ["genrec recommend (batch job)", str(batch["users"]), f"{batch['seconds']:.2f}",
         f"{batch['users_per_s']:.1f}"],
        [f"genrec serve, {args.clients} clients", str(http["users"]), f"{http['seconds']:.2f}",
         f"{http['users_per_s']:.1f}"]]))
    print(f"\nbatch / HTTP: {ratio:.2f}x; same items both ways for {same} of {len(lines)} users")
    if args.json:
        write_json(args.json, {"machine": machine_note(), "args": {
            k: str(v) for k, v in vars(args).items()}, "batch": batch, "http": http,
            "ratio": round(ratio, 2), "same_items": same, "users": len(lines)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
