"""Catalog-scale benchmark: genrec's generative catalog (sparse trie + delta updates + rank
filters) at 10k to 10M items, against the previous dense trie in the same run.

Catalog: random 3 x 256 Semantic IDs plus a dedup level (a counter within collisions; its
size is the largest collision count). Model: a tiny random Qwen3 (hidden 64, 2 layers), one
history of 20 items per request. Per size, in its own process (so that peak RSS is the
size's own; a separate process for the baseline):

- build (``CatalogState.build``), trie bytes and bytes per item, the whole state's tensors;
- updates (``updated`` + ``Engine.set_catalog``): one retire, and k upserts (half new items,
  half existing items given fresh free IDs) + k retires for k = 1, 1,000, 100,000, then one
  such change on top of the largest delta; whether the 1,000 update is visible; compaction;
- recommend latency (median after a warm-up) at batch 1 and 32, without filters, with a
  100-item exclude list and with a 1,000-item allow list per request, at beam widths 32, 256
  and 1,024, on the fresh catalog and on one with a live delta (after 1,000 + 1,000 changes),
  and the filters' own cost;
- peak RSS of the process (``ru_maxrss``).

The dense baseline (``_dense_trie.py``, ``_dense_engine.py``: the old trie, item mask and beam
loop, bench-only copies) runs the same steps where it fits (``--baseline-max``); an update is
a full rebuild there. A spot check first runs both on a small catalog and compares their
items and scores. Goals at the largest size are printed as PASS/FAIL.

Quick run: ``python bench/catalog.py --sizes 10000,100000 --widths 32 --batches 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _catalog_report import goal_checks, size_tables, summary_tables  # noqa: E402
from common import machine_note, write_json  # noqa: E402

WORKER = Path(__file__).resolve().parent / "_catalog_worker.py"


def ints(text: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]``."""
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=ints, default=ints("10000,100000,1000000,10000000"))
    p.add_argument("--widths", type=ints, default=ints("32,256,1024"))
    p.add_argument("--batches", type=ints, default=ints("1,32"))
    p.add_argument("--changes", type=ints, default=ints("1,1000,100000"),
                   help="k upserts + k retires per measured update (k > N/3 is skipped)")
    p.add_argument("--repeats", type=int, default=5, help="timed recommend calls per setting")
    p.add_argument("--baseline-max", type=int, default=1_000_000,
                   help="largest size the dense baseline runs at (it needs O(N x K) memory "
                        "and minutes per build or update above 1M)")
    p.add_argument("--check-items", type=int, default=20000,
                   help="catalog size of the sparse-vs-dense exactness check (0: skip)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quiet-wait", type=float, default=30.0,
                   help="before each timed setting, wait up to this many seconds for other "
                        "processes to leave the CPUs (under half a core busy); the reading "
                        "is recorded per setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def run_worker(args: argparse.Namespace, impl: str, items: int, work: Path,
               widths: list[int] | None = None, paired: int = 0) -> dict[str, Any]:
    """One worker process; its JSON record (``error`` set when it failed). ``paired``: a
    small catalog size timed alternately with this one (batch 1)."""
    out = work / f"{impl}-{items}.json"
    cmd = [sys.executable, str(WORKER), "--impl", impl, "--items", str(items),
           "--paired-items", str(paired), "--quiet-wait", str(args.quiet_wait),
           "--widths", ",".join(map(str, widths or args.widths)),
           "--batches", ",".join(map(str, args.batches)),
           "--changes", ",".join(map(str, args.changes)), "--repeats", str(args.repeats),
           "--threads", str(args.threads), "--seed", str(args.seed), "--out", str(out)]
    print(f"\n== {impl} at {items:,} items (load {os.getloadavg()[0]:.2f})", flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0 or not out.is_file():
        return {"impl": impl, "items": items, "error": f"worker exited {rc}"}
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    note = machine_note()
    note["threads"] = args.threads
    print(f"machine: {note['cpu']}; {args.threads} threads; load {note['load_avg_1m']}; "
          f"genrec {note['genrec']}")
    work = Path(tempfile.mkdtemp(prefix="genrec-catalog-"))
    check = None
    if args.check_items:
        check = run_worker(args, "check", args.check_items, work, widths=[32, 256])
        ok = check.get("items_equal", False)
        print(f"exactness check at {args.check_items:,} items: {check.get('cases', 0)} "
              f"requests (fresh and live-delta catalogs, 3 filter kinds, widths 32 and 256): "
              f"items {'EQUAL' if ok else 'DIFFER'}, largest score difference "
              f"{check.get('max_score_diff', float('nan')):.2e}")
    results: dict[int, dict[str, Any]] = {}
    for n in args.sizes:
        small = min(args.sizes)
        paired = small if n == max(args.sizes) and n > small else 0
        results[n] = {"sparse": run_worker(args, "sparse", n, work, paired=paired)}
        if n <= args.baseline_max:
            results[n]["dense"] = run_worker(args, "dense", n, work)
        else:
            print(f"dense baseline skipped at {n:,} items (--baseline-max {args.baseline_max:,})")
        print(size_tables(n, results[n]), flush=True)
    print(summary_tables(results, args.baseline_max))
    goals = goal_checks(results)
    print("\nGoals (largest size against the smallest):")
    for g in goals:
        print(f"  {'PASS' if g['pass'] else 'FAIL'}  {g['goal']}: {g['measured']}")
    ok = check is None or bool(check.get("items_equal"))
    if args.json:
        write_json(args.json, {"machine": note, "args": vars(args), "check": check,
                               "results": {str(k): v for k, v in results.items()},
                               "goals": goals})
        print(f"\nwrote {args.json}")
    if not ok:
        print("\nSPARSE AND DENSE ANSWERS DIFFER: the timings compare different answers.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
