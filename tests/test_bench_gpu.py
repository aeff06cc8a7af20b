"""bench/gpu.py, the GPU device check: end to end at smoke sizes on the CPU, where the captured
path (static buffers, run eagerly) must give the eager path's scores and items and each goal
must read the figure it names; --quick takes the smaller plan; the figures reach the JSON file
after every setting (a cut run keeps them)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_gpu", None)


def test_quick_takes_the_smaller_plan(gpu_bench) -> None:
    full, quick = gpu_bench.parse_args([]), gpu_bench.parse_args(["--quick"])
    assert gpu_bench.plan(full) is gpu_bench.FULL and gpu_bench.plan(quick) is gpu_bench.QUICK
    assert "tests" in full.parts and "tests" not in quick.parts
    big, small = gpu_bench.FULL, gpu_bench.QUICK
    # the real shapes (the 1.7B goal shape at width 256), fewer of them, within 3 minutes
    assert small.beam_shapes == {"qwen3-1.7b": gpu_bench.QWEN3_17B}
    assert small.width == big.width and small.history_items == big.history_items
    assert set(small.score_settings) < set(big.score_settings)
    assert small.catalog_items < big.catalog_items and small.peak_kinds == ("bfloat16",)
    # the budgets leave 2 minutes of the lend for start-up and the last setting running over
    assert small.budget_s <= 180 - 30 and big.budget_s <= 8 * 60 - 120
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["--quick", "--smoke"])


def test_figures_reach_the_json_after_every_setting(gpu_bench, tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    args = gpu_bench.parse_args(["--device", "cpu", "--smoke", "--json", str(out)])
    run = gpu_bench.Run(args, gpu_bench.SMOKE, torch.device("cpu"), torch.float32,
                        time.perf_counter() + 60)
    run.attempt("beam a", lambda: run.out["beam"].append({"model": "a", "batch": 1}))
    assert json.loads(out.read_text())["beam"] == [{"model": "a", "batch": 1}]

    def fails() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    run.attempt("beam b", fails)
    written = json.loads(out.read_text())
    assert written["errors"] == {"beam b": "OutOfMemoryError: CUDA out of memory"}
    assert written["beam"] == [{"model": "a", "batch": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # written whole, then renamed


def test_gpu_bench_smoke_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cpu", "--smoke",
         "--skip-tests", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == {}
    assert report["machine"]["device"] == "cpu"
    assert {"bfloat16", "float32"} <= set(report["matmul_peak_tflops"])
    assert "tests" not in report  # --skip-tests

    scoring = report["scoring"]
    settings = {(r["users"], r["candidates_per_user"]) for r in scoring}
    assert settings == {tuple(s) for s in report["sizes"]["score_settings"]}
    for r in scoring:
        assert r["scores_per_s"] > 0 and r["tflops"] > 0 and r["finite"]

    beam = report["beam"]
    models = set(report["sizes"]["beam_shapes"])
    assert {r["model"] for r in beam} == models
    assert {r["batch"] for r in beam} == set(report["sizes"]["batches"])
    for r in beam:
        assert r["ms_per_request_median"] > 0 and r["requests_per_s"] > 0
        assert r["full_results"]
    # both settings of EngineConfig.cuda_graphs
    assert {r["cuda_graphs"] for r in beam} == {True, False}
    assert {r["cuda_graphs"] for r in scoring} == {True, False}
    # the captured path (static buffers, run eagerly on the CPU) gives the eager path's answers
    comparisons = report["comparisons"]
    scored = [c for c in comparisons if c["part"] == "scoring"]
    assert len(scored) == len(settings)
    assert all(c["max_abs_diff_graphs_vs_eager"] <= 1e-5 for c in scored), scored
    searched = [c for c in comparisons if c["part"] == "beam"]
    assert len(searched) == len(models) * len(report["sizes"]["batches"])
    assert all(c["items_equal_graphs_vs_eager"] == 1.0 for c in searched), searched
    # each goal reads the figure it names (verdicts at smoke sizes are not the GPU's)
    goals = report["goals"]
    assert len(goals) == 2 + len(models)
    one_user = max((s for s in settings if s[0] == 1), key=lambda s: s[1])
    default = next(r for r in scoring if r["cuda_graphs"]
                   and (r["users"], r["candidates_per_user"]) == one_user)
    assert goals[0]["value"] == default["scores_per_s"]
    assert goals[0]["met"] == (default["scores_per_s"] >= goals[0]["target"])
    b1 = {(r["model"], r["cuda_graphs"]): r["ms_per_request_median"] for r in beam
          if r["batch"] == 1}
    for goal, model in zip(goals[2:], report["sizes"]["beam_shapes"], strict=True):
        assert goal["value"] == pytest.approx(b1[(model, False)] / b1[(model, True)])
