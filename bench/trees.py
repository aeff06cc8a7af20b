"""Before and after: one benchmark from two source trees of genrec, runs alternating.

``python bench/trees.py --before REV [--rounds 3] -- score.py --candidates 64 --methods genrec``
exports revision ``REV`` (``git archive``) beside this checkout and runs the named benchmark
script of each tree with that tree's own ``src`` (each tree's script, so a benchmark that
follows an API change still runs), before / after / after / before ..., ``--rounds`` times.
Every run writes its JSON (``--json``, added here); each figure of each record (``records`` or
``results``: throughputs ``*per_s``, latencies ``*_ms`` and median seconds) is reported as the
median over rounds per tree and the after / before ratio (> 1: after is faster for a
throughput, slower for a latency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("per_s", "p50_ms", "p99_ms", "seconds_median")
NOT_SETTINGS = {"errors"}


def export(rev: str, into: Path) -> Path:
    """The files of ``rev`` under ``into`` (no git metadata)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def figures(report: dict) -> dict[tuple, float]:
    """{(setting..., figure name): value} over a benchmark report's records."""
    out = {}
    for rec in report.get("records", []) + report.get("results", []):
        setting = tuple(sorted((k, v) for k, v in rec.items()
                               if isinstance(v, (str, bool, int)) and not isinstance(v, float)
                               and k not in NOT_SETTINGS))
        for k, v in rec.items():
            if isinstance(v, float) and any(f in k for f in FIGURES):
                out[(*setting, k)] = v
    return out


def run_once(tree: Path, script: str, args: list[str], out: Path) -> dict[tuple, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run([sys.executable, str(tree / "bench" / script), *args, "--json",
                           str(out)], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: {script} failed\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return figures(json.loads(out.read_text()))


def label(key: tuple) -> str:
    return " ".join(f"{k}={v}" for k, v in key[:-1]) + f" {key[-1]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="git revision of the 'before' tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the medians and ratios here")
    p.add_argument("script", help="a script of bench/, e.g. score.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    a = p.parse_args(argv)
    args = [x for x in a.args if x != "--"]
    with tempfile.TemporaryDirectory() as tmp:
        before = export(a.before, Path(tmp))
        trees = {"before": before, "after": ROOT}
        seen: dict[str, list[dict[tuple, float]]] = {"before": [], "after": []}
        for r in range(a.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                seen[name].append(run_once(trees[name], a.script, args, Path(tmp) / "out.json"))
                print(f"round {r + 1}: {name} done", flush=True)
    keys = [k for k in seen["after"][0] if all(k in f for f in seen["before"] + seen["after"])]
    rows = []
    for k in keys:
        b = statistics.median(f[k] for f in seen["before"])
        n = statistics.median(f[k] for f in seen["after"])
        rows.append({"figure": label(k), "before": b, "after": n, "after_over_before": n / b})
        print(f"{label(k):70s} before {b:12.4g}  after {n:12.4g}  after/before {n / b:6.3f}")
    if a.json:
        a.json.write_text(json.dumps({"before": a.before, "script": a.script, "args": args,
                                      "rounds": a.rounds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
