"""bench/gpu.py, the GPU device check, runs end to end at smoke sizes on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    # the goals are evaluated (their verdicts mean nothing at smoke sizes)
    assert len(report["goals"]) == 2 + len(models)
    assert all(g["value"] is not None for g in report["goals"])
