"""Data side of bench/quality.py: genrec's leave-one-out split as RecBole atomic files and a
worker job, RecBole's virtual environment, metrics of returned top-K lists by genrec's own
code, and a small generated dataset for ``--smoke``.

RecBole reads the timestamp field as float32, so the file holds each interaction's rank in its
user's sequence (0, 1, 2, ...), exact in float32, instead of a Unix time: ordering by it
reproduces genrec's order, and RecBole's leave-one-out (``LS: valid_and_test``, ``order: TO``)
then holds out the same validation and test items as :func:`genrec.data.leave_one_out`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.data.split import Example
from genrec.evaluation.topk_metrics import ranking_metrics, target_ranks

#: What RecBole 1.2.1 runs with beside genrec here (its newest releases of numpy / pandas break
#: it; torch 2.13 needs only the ``torch.load`` shim of the worker).
RECBOLE_REQUIREMENTS = ("torch==2.13.0", "numpy==1.26.*", "scipy==1.12.*", "pandas<2.2",
                        "recbole==1.2.1")
ATOMIC_HEADER = ("user_id:token", "item_id:token", "timestamp:float")
WORKER = Path(__file__).resolve().parent / "_recbole_worker.py"


def atomic_rows(sequences: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    """``(user, item, rank)`` per interaction: genrec's user and item indices as tokens, and the
    item's position in the user's sequence as the time."""
    return [(u, i, r) for u, seq in enumerate(sequences) for r, i in enumerate(seq)]


def write_atomic(sequences: Sequence[Sequence[int]], folder: Path, name: str) -> Path:
    """Write ``folder/name/name.inter`` (RecBole's atomic format); returns the file."""
    path = Path(folder) / name / f"{name}.inter"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(ATOMIC_HEADER)] + [f"{u}\t{i}\t{r}" for u, i, r in atomic_rows(sequences)]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_atomic(path: Path) -> list[list[int]]:
    """The per-user sequences an atomic file gives when its time field is read as float32 and
    each user's rows are ordered by it (as RecBole does): the round trip of :func:`write_atomic`."""
    rows = [line.split("\t") for line in Path(path).read_text().splitlines()[1:]]
    users = np.array([int(r[0]) for r in rows])
    items = np.array([int(r[1]) for r in rows])
    times = np.array([float(r[2]) for r in rows], dtype=np.float32)
    order = np.lexsort((times, users))
    out: list[list[int]] = [[] for _ in range(int(users.max()) + 1 if len(rows) else 0)]
    for u, i in zip(users[order], items[order], strict=True):
        out[u].append(int(i))
    return out


def make_job(work: Path, name: str, examples: Sequence[Example],
             histories: Sequence[Sequence[int]], num_items: int, models: Sequence[str],
             train_seconds: float, threads: int, k: int = 10, seed: int = 2020,
             overrides: dict[str, dict[str, Any]] | None = None,
             clock: str = "cpu") -> dict[str, Any]:
    """The worker's job: dataset ``work/recbole-data/name``, the models, the training-time cap
    (seconds of ``clock``: cpu or wall), and each test user's token, target and full earlier
    history (the mask)."""
    return {
        "data_path": str(work / "recbole-data"), "dataset": name,
        "checkpoint_dir": str(work / "recbole-saved"), "models": list(models),
        "train_seconds": train_seconds, "clock": clock, "threads": threads, "k": k, "seed": seed,
        "n_items": num_items, "overrides": overrides or {},
        "test": [{"user": str(ex.user), "target": ex.target, "history": list(h)}
                 for ex, h in zip(examples, histories, strict=True)],
    }


def run_worker(python: str, job: dict[str, Any], work: Path,
               reuse: bool = False) -> dict[str, Any]:
    """Run the RecBole worker under ``python`` (cwd ``work``: RecBole writes ``log/`` there);
    RuntimeError with the log's tail if it fails. ``reuse``: return the answer already in
    ``work`` when it answers exactly this job (same data, models, caps and test users), so a
    long training run is done once and compared with several genrec models."""
    work = Path(work).resolve()
    job_in, job_out, log_path = work / "recbole.in.json", work / "recbole.out.json", \
        work / "recbole.log"
    if reuse and job_out.is_file() and job_in.is_file() and \
            json.loads(job_in.read_text()) == json.loads(json.dumps(job)):
        return json.loads(job_out.read_text())
    job_out.unlink(missing_ok=True)
    job_in.write_text(json.dumps(job))
    threads = str(job["threads"])
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "PYTHONWARNINGS": "ignore"}
    with open(log_path, "w") as log:
        rc = subprocess.run([python, str(WORKER), str(job_in), str(job_out)], cwd=work, env=env,
                            stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-20:])
        raise RuntimeError(f"RecBole worker failed (exit {rc}), {log_path}:\n{tail}")
    return json.loads(job_out.read_text())


def setup_recbole(folder: Path, python: str = sys.executable) -> Path:
    """Create a virtual environment at ``folder`` with :data:`RECBOLE_REQUIREMENTS`; returns
    its interpreter (the ``--recbole-python`` to give)."""
    folder = Path(folder)
    subprocess.run([python, "-m", "venv", str(folder)], check=True)
    py = folder / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", *RECBOLE_REQUIREMENTS], check=True)
    return py


def metrics_of_top(top: Sequence[Sequence[int]], targets: Sequence[int],
                   ks: Sequence[int] = (5, 10)) -> dict[str, float]:
    """Recall/NDCG@k of top-K lists (rows best first) by genrec's ``target_ranks`` and
    ``ranking_metrics``, the functions ``genrec eval`` uses."""
    n = max(ks)
    rows = torch.full((len(top), n), -1, dtype=torch.int64)
    for r, items in enumerate(top):
        rows[r, : min(n, len(items))] = torch.tensor(list(items)[:n], dtype=torch.int64)
    metrics = ranking_metrics(target_ranks(rows, torch.tensor(list(targets))), ks)
    metrics["n_users"] = len(top)
    return metrics


def write_toy_dataset(folder: Path, n_users: int = 60, n_items: int = 40,
                      seed: int = 0) -> Path:
    """``Toy.inter.json`` (users walk around a cluster of items, so there is something to
    learn) and ``sid-rqvae/Toy.index.json`` (3-level IDs) in genrec's JSON format."""
    g = np.random.default_rng(seed)
    folder = Path(folder)
    (folder / "sid-rqvae").mkdir(parents=True, exist_ok=True)
    inter = {}
    for u in range(n_users):
        c, start = u % 4, int(g.integers(10))
        inter[str(u)] = [c * 10 + (start + j) % 10 for j in range(int(g.integers(5, 12)))]
    codes = {str(i): [f"<a_{i // 10}>", f"<b_{i % 5}>", f"<c_{(i // 5) % 2}>"]
             for i in range(n_items)}
    (folder / "Toy.inter.json").write_text(json.dumps(inter))
    (folder / "sid-rqvae" / "Toy.index.json").write_text(json.dumps(codes))
    return folder
