"""bench/trees.py: which figures of a benchmark report it compares, keyed by their setting."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _trees():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_trees", ROOT / "bench" / "trees.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_trees"] = module
    spec.loader.exec_module(module)
    return module


def test_figures_are_keyed_by_their_setting() -> None:
    trees = _trees()
    report = {"machine": {"cpu": "x"}, "records": [
        {"method": "genrec", "batch": 1, "requests_per_s": 10.0, "check": [1.0]},
        {"method": "genrec", "batch": 32, "requests_per_s": 100.0, "seconds_median": 0.32},
    ], "results": [{"endpoint": "/v1/recommend", "concurrency": 4, "errors": 0,
                    "p50_ms": 3.5, "ratio": 0.2}]}
    got = trees.figures(report)
    assert got == {
        (("batch", 1), ("method", "genrec"), "requests_per_s"): 10.0,
        (("batch", 32), ("method", "genrec"), "requests_per_s"): 100.0,
        (("batch", 32), ("method", "genrec"), "seconds_median"): 0.32,
        (("concurrency", 4), ("endpoint", "/v1/recommend"), "p50_ms"): 3.5,
    }
    assert trees.label((("batch", 1), "requests_per_s")) == "batch=1 requests_per_s"
