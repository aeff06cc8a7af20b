"""bench/quality.py: genrec's split as RecBole atomic rows, metrics of returned top-K lists, the
worker's training-time cap, and the ``--smoke`` run (RecBole itself only when its interpreter
is given in GENREC_RECBOLE_PYTHON)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import _quality_data as qd  # noqa: E402
import _recbole_worker as worker  # noqa: E402
import quality  # noqa: E402

from genrec.data.split import leave_one_out  # noqa: E402
from genrec.evaluation.full_catalog import full_histories, split_examples  # noqa: E402

SEQS = [[5, 3, 9, 1, 0], [2, 2, 7], [8, 6, 4, 3, 5, 1, 9, 0, 2, 7, 11, 10]]


def test_atomic_rows_hold_ranks_and_reproduce_the_split(tmp_path: Path) -> None:
    assert qd.atomic_rows([[4, 2], [7]]) == [(0, 4, 0), (0, 2, 1), (1, 7, 0)]
    path = qd.write_atomic(SEQS, tmp_path, "Demo")
    assert path == tmp_path / "Demo" / "Demo.inter"
    lines = path.read_text().splitlines()
    assert lines[0] == "user_id:token\titem_id:token\ttimestamp:float"
    assert lines[1:3] == ["0\t5\t0", "0\t3\t1"] and len(lines) == 1 + sum(map(len, SEQS))
    back = qd.read_atomic(path)  # ordered by the float32 time, as RecBole orders
    assert back == SEQS
    a, b = leave_one_out(back), leave_one_out(SEQS)
    assert (a.val, a.test, a.train) == (b.val, b.test, b.train)


def test_unix_times_would_reorder_in_float32() -> None:
    # why the rank is written: two interactions a second apart become one float32 time
    assert np.float32(1_600_000_001) == np.float32(1_600_000_000)
    assert all(np.float32(r) == r for r in range(100_000))


def test_job_lists_genrec_test_users_with_full_histories(tmp_path: Path) -> None:
    examples = split_examples(SEQS, "test", max_history=3)
    histories = full_histories(SEQS, examples, "test")
    job = qd.make_job(tmp_path, "Demo", examples, histories, 12, ["SASRec", "Pop"], 60.0, 1)
    assert [t["user"] for t in job["test"]] == ["0", "1", "2"]
    assert [t["target"] for t in job["test"]] == [0, 7, 10]
    assert job["test"][2]["history"] == SEQS[2][:-1]  # not cut to max_history
    assert examples[2].history == SEQS[2][-4:-1]
    assert job["data_path"] == str(tmp_path / "recbole-data") and job["n_items"] == 12
    json.dumps(job)


def test_metrics_of_top_lists_use_genrec_metrics() -> None:
    top = [[3, 1, 2], [9, 8, 7, 6, 5, 4], [1], [0, 4, 2, 3, 1, 5]]
    targets = [1, 4, 7, 5]  # ranks 1, 5, miss, 5
    m = qd.metrics_of_top(top, targets, ks=(5, 10))
    assert m["n_users"] == 4
    assert m["recall@5"] == pytest.approx(1 / 4) and m["recall@10"] == pytest.approx(3 / 4)
    assert m["ndcg@5"] == pytest.approx(1 / math.log2(3) / 4)
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3) + 2 / math.log2(7)) / 4)
    assert qd.metrics_of_top([list(range(20))], [15], ks=(10,))["recall@10"] == 0.0


class FakeTrainer:
    """The parts of RecBole's Trainer the cap wraps: one sleep per batch."""

    def __init__(self, config: dict, model: object) -> None:
        self.saved = []

    def _train_epoch(self, train_data, epoch_idx, loss_func=None, show_progress=False):  # noqa: ANN001, ANN202
        for _ in train_data:
            time.sleep(0.01)
        return 1.0

    def _valid_epoch(self, valid_data, show_progress=False):  # noqa: ANN001, ANN202
        return 0.5, {}

    def _save_checkpoint(self, epoch, verbose=True):  # noqa: ANN001, ANN202
        self.saved.append(epoch)

    def fit(self, epochs: int) -> None:
        for e in range(epochs):
            self._train_epoch(range(10), e)
            self._valid_epoch(None)
            self._save_checkpoint(e)


def test_training_time_cap_cuts_an_epoch_then_stops() -> None:
    trainer = worker.capped_trainer(FakeTrainer, budget_s=0.15, clock="wall")({}, None)
    with pytest.raises(worker.TimeUp):
        trainer.fit(100)
    first, *rest = trainer.log
    assert first["batches"] == first["of_batches"] == 10 and not first["cut"]
    assert rest and rest[-1]["cut"] and rest[-1]["batches"] < 10
    assert all("valid_score" in e for e in trainer.log)  # the cut epoch is validated too
    assert trainer.best_epoch == len(trainer.log)
    assert worker.CLOCKS["cpu"] is time.process_time  # the default: compute, not waiting
    assert worker.base_config({"data_path": "d", "checkpoint_dir": "c"}, "SASRec")[
        "train_neg_sample_args"] is None


def test_torch_load_shim_defaults_to_full_unpickling(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pth"
    torch.save({"config": {"a": 1}, "obj": FakeTrainer}, path)  # a class: not weights-only
    original = torch.load
    try:
        worker.shim_torch_load()
        assert torch.load(path)["obj"] is FakeTrainer
    finally:
        torch.load = original


def run_smoke(tmp_path: Path, *extra: str) -> dict:
    threads = torch.get_num_threads()
    try:
        assert quality.main(["--smoke", "--work", str(tmp_path / "work"), "--json",
                             str(tmp_path / "q.json"), *extra]) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads((tmp_path / "q.json").read_text())


def test_smoke_runs_genrec_and_popularity_without_recbole(tmp_path: Path) -> None:
    report = run_smoke(tmp_path)
    assert report["recbole"].startswith("skipped: no --recbole-python")
    assert set(report["results"]) == {"genrec", "Pop"} and report["n_users"] == 60
    for method in report["results"].values():
        for mode in ("unmasked", "masked"):
            assert set(quality.KEYS) <= set(method[mode]) and method[mode]["n_users"] == 60
    assert "genrec_train_seconds" in report["run"]


def test_smoke_with_recbole(tmp_path: Path) -> None:
    python = os.environ.get("GENREC_RECBOLE_PYTHON")
    if not python:
        pytest.skip("RecBole part: set GENREC_RECBOLE_PYTHON to a RecBole 1.2.1 interpreter "
                    "(python bench/quality.py --setup-recbole DIR)")
    report = run_smoke(tmp_path, "--recbole-python", python)
    sasrec = report["results"]["SASRec (RecBole)"]
    assert sasrec["target_mismatch"] == sasrec["history_mismatch"] == 0
    for k in quality.KEYS:  # RecBole's own SASRec metrics (unmasked) agree with genrec's code
        assert sasrec["unmasked"][k] == pytest.approx(sasrec["recbole_test"][k], abs=1e-4)


def test_an_ensemble_with_itself_scores_as_the_model(tmp_path: Path) -> None:
    single = run_smoke(tmp_path)["results"]["genrec"]
    work = tmp_path / "work"
    threads = torch.get_num_threads()
    try:
        assert quality.main(["--data", str(work / "toy"), "--model", str(work / "genrec" /
                             "model"), "--ensemble", str(work / "genrec" / "model"),
                             "--beam-width", "10", "--json", str(tmp_path / "e.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    both = json.loads((tmp_path / "e.json").read_text())["results"]["genrec"]
    assert isinstance(both["model"], list) and len(both["model"]) == 2
    for mode in ("unmasked", "masked"):
        assert {k: both[mode][k] for k in quality.KEYS} == \
            {k: single[mode][k] for k in quality.KEYS}


def test_worker_answers_are_reused_only_for_the_same_job(tmp_path: Path) -> None:
    job = {"models": ["SASRec"], "threads": 1, "test": [{"user": "0", "target": 3}]}
    answer = {"results": {}, "versions": {"recbole": "kept"}}
    (tmp_path / "recbole.in.json").write_text(json.dumps(job))
    (tmp_path / "recbole.out.json").write_text(json.dumps(answer))
    missing = str(tmp_path / "no-python")  # running the worker would fail
    assert qd.run_worker(missing, job, tmp_path, reuse=True) == answer
    with pytest.raises(OSError):  # another job: the worker runs (and cannot here)
        qd.run_worker(missing, {**job, "threads": 2}, tmp_path, reuse=True)
    assert not (tmp_path / "recbole.out.json").exists()  # the stale answer is gone
    (tmp_path / "recbole.out.json").write_text(json.dumps(answer))
    with pytest.raises(OSError):  # without reuse it always runs
        qd.run_worker(missing, job, tmp_path)
