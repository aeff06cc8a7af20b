"""Data-parallel training with real processes: ``genrec train generative --nproc 2`` (torchrun,
gloo) reaches the weights of one process on the same global batches, with ``--fsdp`` too (FSDP2
shards); a rank killed mid-run leaves the last checkpoint loadable and ``--resume`` (with one
process) goes on from it; a run resumes with another rank count, with or without FSDP."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_commands_train_generative import invoke, write_dataset

from genrec.engine import Engine
from genrec.model import load_model
from genrec.training.distributed import World, without_option
from genrec.training.generative_task import GenerativeTask
from genrec.training.windows import IGNORE

TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
        "--batch-tokens", "120", "--max-history", "5", "--val-users", "0", "--no-progress",
        "--device", "cpu", "--threads", "1", "--patience", "0", "--user-vectors", "svd",
        "--user-dim", "4"]


# FSDP2 orders its gathers with stream events, which the CPU has from torch 2.7 on
FSDP_ON_CPU = hasattr(torch.cpu.Stream, "record_event")

TEACHER = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1",
           "--max-history", "5", "--negatives", "4", "--users-per-step", "8", "--val-users", "6",
           "--val-negatives", "9", "--no-progress", "--device", "cpu", "--threads", "1",
           "--max-title-tokens", "4", "--max-text-tokens", "8", "--patience", "0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ddp")
    folder = write_dataset(root / "toy")
    invoke("index", "--data", folder, "--out", root / "index.json")
    return folder, root / "index.json"


def _train(data: tuple[Path, Path], out: Path, *extra: str, wait: bool = True,
           kind: str = "generative") -> subprocess.Popen | subprocess.CompletedProcess:
    folder, index = data
    opts = ["--index", str(index), *TINY] if kind == "generative" else TEACHER
    cmd = [sys.executable, "-m", "genrec.cli", "train", kind, "--data", str(folder),
           "--out", str(out), *opts, *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


ACCUM = ("--grad-accum", "2")  # two batches per optimizer step


@pytest.fixture(scope="module")
def one_process(data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 2 epochs in one process (no distribution): the reference of the ranks."""
    out = tmp_path_factory.mktemp("one") / "run"
    _train(data, out, "--epochs", "2", *ACCUM)
    return out


def test_two_ranks_reach_the_weights_of_one_process(data: tuple[Path, Path], one_process: Path,
                                                    tmp_path: Path) -> None:
    two = _train(data, tmp_path / "two", "--epochs", "2", "--nproc", "2", *ACCUM)
    assert two.stdout.count("best epoch") == 1  # rank 0 reports
    a = load_model(one_process / "last").state_dict()
    assert max(float(v.abs().max()) for v in a.values()) > 0
    _assert_same_weights(one_process, tmp_path / "two")
    one = json.loads((one_process / "history.json").read_text())
    two_h = json.loads((tmp_path / "two" / "history.json").read_text())
    assert [e["ranks"] for e in two_h] == [2, 2] and [e["steps"] for e in one] == [
        e["steps"] for e in two_h]
    assert abs(one[-1]["train_loss"] - two_h[-1]["train_loss"]) < 1e-4


def test_two_ranks_train_the_teacher_like_one_process(data: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    # the ranking task: users split across ranks, the loss a mean over users
    _train(data, tmp_path / "one", "--epochs", "1", kind="teacher")
    _train(data, tmp_path / "two", "--epochs", "1", "--nproc", "2", kind="teacher")
    a = load_model(tmp_path / "one" / "last").state_dict()
    b = load_model(tmp_path / "two" / "last").state_dict()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=2e-5, rtol=1e-4), k
    one = json.loads((tmp_path / "one" / "history.json").read_text())
    two = json.loads((tmp_path / "two" / "history.json").read_text())
    assert abs(one[0]["val_ndcg@10"] - two[0]["val_ndcg@10"]) < 1e-4  # rank 0 validated


def test_a_killed_rank_leaves_a_checkpoint_that_resumes(data: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _train(data, out, "--epochs", "400", "--nproc", "2", wait=False)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (out / "history.json").is_file():
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.2)
        assert (out / "history.json").is_file()
        time.sleep(0.5)
        [launcher] = _children(proc.pid)  # torchrun, whose children are the ranks
        ranks = _children(launcher)
        assert len(ranks) == 2
        os.kill(ranks[-1], signal.SIGKILL)  # one rank dies mid-run: torchrun stops the other
        assert proc.wait(timeout=120) != 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_alive(p) for p in ranks):
            time.sleep(0.2)
        assert not any(_alive(p) for p in ranks)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = len(json.loads((out / "history.json").read_text()))
    assert 1 <= done < 400
    load_model(out / "last")  # the last checkpoint is whole
    _train(data, out, "--epochs", str(done + 1), "--resume")  # one process goes on
    history = json.loads((out / "history.json").read_text())
    assert len(history) == done + 1 and history[-1]["ranks"] == 1


@pytest.mark.skipif(not FSDP_ON_CPU, reason="FSDP2 on the CPU needs torch >= 2.7 (CPU stream "
                    "events); genrec refuses --fsdp there with that message")
def test_fsdp_ranks_reach_the_weights_of_one_process_and_resume_across(
        data: tuple[Path, Path], one_process: Path, tmp_path: Path) -> None:
    # the same global batches, two per step: two ranks holding half of every weight, gradient
    # and AdamW state take the steps of one unsharded process
    _train(data, tmp_path / "fsdp", "--epochs", "2", "--nproc", "2", "--fsdp", *ACCUM)
    _assert_same_weights(one_process, tmp_path / "fsdp")
    engine = Engine.from_pretrained(tmp_path / "fsdp" / "last")  # the full weights, HF layout
    assert engine.vocab is not None and engine.model.config.user_dim == 4
    # the FSDP run goes on in one unsharded process, the unsharded one with two FSDP ranks
    shutil.copytree(one_process, tmp_path / "one_then_fsdp")
    _train(data, tmp_path / "fsdp", "--epochs", "3", "--resume", *ACCUM)
    _train(data, tmp_path / "one_then_fsdp", "--epochs", "3", "--resume", "--nproc", "2",
           "--fsdp", *ACCUM)
    _assert_same_weights(tmp_path / "fsdp", tmp_path / "one_then_fsdp")
    ranks = {name: [e["ranks"] for e in json.loads((tmp_path / name / "history.json")
                                                   .read_text())]
             for name in ("fsdp", "one_then_fsdp")}
    assert ranks == {"fsdp": [2, 2, 1], "one_then_fsdp": [1, 1, 2]}


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = (load_model(run / "last").state_dict() for run in (a, b))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=2e-5, rtol=1e-4), k


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _alive(pid: int) -> bool:
    # running (not gone, not a zombie waiting for its parent)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_shards_split_a_batch_and_its_loss_terms() -> None:
    from genrec.catalog.semantic_ids import SemanticIndex
    from genrec.vocab.sid_vocab import SidVocab

    index = SemanticIndex(torch.cartesian_prod(torch.arange(4), torch.arange(5)), [4, 5])
    task = GenerativeTask(SidVocab(index, max_history=4),
                          [[i, (i + 3) % 20, (i + 7) % 20, (i + 1) % 20] for i in range(20)],
                          batch_tokens=200)
    batch = next(iter(task.batches(0)))
    parts = [task.shard(batch, r, 3) for r in range(3)]
    assert abs(sum(share for _, share in parts) - 1) < 1e-9
    assert sorted(n for p, _ in parts for n in p.lengths) == sorted(batch.lengths)
    assert sum(int((p.labels != IGNORE).sum()) for p, _ in parts) == int(
        (batch.labels != IGNORE).sum())
    n = len(batch.lengths)
    assert task.shard(batch, n, n + 1) == (None, 0.0)  # more ranks than windows: nothing
    assert World().main and World(1, 2).main is False
    assert without_option(["a", "--nproc", "2", "--nproc=3", "b"], "--nproc") == ["a", "b"]


def test_one_rank_trains_unsharded_and_unknown_shardings_are_refused() -> None:
    from genrec.training.loop import LoopConfig
    from genrec.training.sharding import train_model

    model = torch.nn.Linear(2, 2)
    train = train_model(model, None, World(), "fsdp")  # nothing to shard across
    assert not train.sharded and train.view is model and train.root.model is model
    assert train.loss_scale(World()) == 1.0
    with pytest.raises(ValueError, match="sharding"):
        LoopConfig(sharding="zero").validate()
    with pytest.raises(ValueError, match="sharding"):
        train_model(model, None, World(), "zero")


def _close_rank(rank: int, store_file: str, results: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=2)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the group works until it is closed
    World(rank, 2).close()
    Path(results, str(rank)).write_text(f"{float(t[0])} {dist.is_initialized()}")


def test_close_leaves_the_process_group_on_every_rank(tmp_path: Path) -> None:
    # a rank exiting with the group open can abort in its teardown (gloo's worker threads)
    import torch.multiprocessing as mp

    mp.spawn(_close_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["3.0 False"] * 2
    World().close()  # one process: nothing to leave
