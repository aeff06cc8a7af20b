"""The generic training loop: checkpoints, resume, early stopping, LR schedule."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from loop_support import ScriptedTask, config, model_for

from genrec.model.checkpoint import load_model
from genrec.training.checkpoints import BEST, LAST, STATE_FILE
from genrec.training.loop import LoopConfig, fit, warmup_cosine
from genrec.vocab.sid_vocab import SidVocab


def test_checkpoints_are_complete_and_no_temporary_files_remain(tmp_path: Path) -> None:
    task = ScriptedTask([0.1, 0.3])
    result = fit(model_for(task), task, tmp_path, config(2))
    assert result.epochs_done == 2 and result.best_epoch == 2
    for name in (LAST, BEST):
        files = {p.name for p in (tmp_path / name).iterdir()}
        assert {"config.json", "model.safetensors", STATE_FILE, "sid_vocab.json",
                "semantic_index.json"} <= files
    leftovers = [p for p in tmp_path.rglob("*") if ".tmp" in p.name or ".old" in p.name]
    assert leftovers == []
    history = json.loads((tmp_path / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2] and history[1]["val_ndcg@10"] == 0.3
    assert SidVocab.exists(tmp_path / BEST)
    assert load_model(tmp_path / LAST).config.vocab_size == task.vocab.vocab_size


def test_resume_continues_with_identical_state(tmp_path: Path) -> None:
    vectors = torch.randn(16, 3, generator=torch.Generator().manual_seed(2))
    straight_task = ScriptedTask([0.1, 0.2, 0.3], vectors)
    straight = model_for(straight_task, user_dim=3)
    fit(straight, straight_task, tmp_path / "a", config(3))

    first_task = ScriptedTask([0.1, None], vectors)
    with pytest.raises(KeyboardInterrupt):
        fit(model_for(first_task, user_dim=3), first_task, tmp_path / "b", config(3))
    assert torch.load(tmp_path / "b" / LAST / STATE_FILE, weights_only=True)["epoch"] == 1
    with pytest.raises(FileExistsError, match="resume"):
        fit(model_for(first_task, user_dim=3), first_task, tmp_path / "b", config(3))
    resumed_task = ScriptedTask([0.2, 0.3], vectors)
    fresh = model_for(resumed_task, seed=5, user_dim=3)  # other weights: all come from last/
    result = fit(fresh, resumed_task, tmp_path / "b", config(3), resume=True)
    assert result.epochs_done == 3 and resumed_task.calls == 2
    for (name, p), q in zip(straight.state_dict().items(), fresh.state_dict().values(),
                            strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    a = torch.load(tmp_path / "a" / LAST / STATE_FILE, weights_only=True)
    b = torch.load(tmp_path / "b" / LAST / STATE_FILE, weights_only=True)
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]
    torch.testing.assert_close(a["optimizer"]["state"], b["optimizer"]["state"], rtol=0, atol=0)
    assert [h["train_loss"] for h in a["history"]] == [h["train_loss"] for h in b["history"]]


def test_early_stopping_keeps_the_best_epoch(tmp_path: Path) -> None:
    task = ScriptedTask([0.5, 0.4, 0.45, 0.3, 0.9])
    result = fit(model_for(task), task, tmp_path, config(5, patience=2))
    assert result.stopped_early and result.epochs_done == 3 and task.calls == 3
    assert result.best_epoch == 1 and result.best_metric == 0.5
    best = torch.load(tmp_path / BEST / STATE_FILE, weights_only=True)
    assert best["epoch"] == 1
    again = ScriptedTask([0.9])
    assert fit(model_for(again), again, tmp_path, config(5, 2), resume=True).epochs_done == 3
    assert again.calls == 0  # a stopped run stays stopped
    more = ScriptedTask([0.2, 0.6])  # ... unless resumed with a patience it has not used up
    result = fit(model_for(more), more, tmp_path, config(5, patience=0), resume=True)
    assert more.calls == 2 and result.epochs_done == 5 and result.best_epoch == 5


def test_keep_epochs_keeps_each_epochs_weights_without_optimizer_state(tmp_path: Path) -> None:
    task = ScriptedTask([0.1, 0.3, 0.2])
    cfg = LoopConfig(epochs=3, lr=1e-2, patience=0, progress=False, keep_epochs=True)
    model = model_for(task)
    fit(model, task, tmp_path, cfg)
    kept = sorted(p.name for p in (tmp_path / "epochs").iterdir())
    assert kept == ["001", "002", "003"]
    assert not (tmp_path / "epochs" / "002" / STATE_FILE).exists()
    assert SidVocab.exists(tmp_path / "epochs" / "002")
    second = load_model(tmp_path / "epochs" / "002").state_dict()
    best = load_model(tmp_path / BEST).state_dict()
    assert all(torch.equal(second[k], best[k]) for k in best)  # epoch 2 is the best
    # the model ends with the final model's weights: the best epoch, without averaging
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in second.items())


def test_an_interrupted_swap_is_recovered(tmp_path: Path) -> None:
    task = ScriptedTask(None)
    fit(model_for(task), task, tmp_path, config(1))
    os.replace(tmp_path / LAST, tmp_path / f".{LAST}.old")  # crash between the two renames
    (tmp_path / f".{LAST}.tmp").mkdir()
    result = fit(model_for(task), task, tmp_path, config(2), resume=True)
    assert result.epochs_done == 2 and result.best_epoch == 2  # no validation: best = last
    assert not (tmp_path / f".{LAST}.old").exists()


def test_schedule_and_config_checks() -> None:
    assert warmup_cosine(0, 100, 10, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(100, 100, 10, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(55, 100, 10, 0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="warmup_ratio"):
        LoopConfig(warmup_ratio=1.5).validate()


def test_validation_runs_in_eval_mode_and_training_resumes_in_train_mode(tmp_path: Path) -> None:
    modes = []

    class ModeTask(ScriptedTask):
        def validate(self, model):
            modes.append(model.training)
            return super().validate(model)

        def loss(self, model, batch):
            modes.append(model.training)
            return super().loss(model, batch)

    task = ModeTask([0.1, 0.2])
    fit(model_for(task).set_dropout(0.1), task, tmp_path, config(2))
    # per epoch: training steps (True ...), then one validation (False)
    assert modes.count(False) == 2 and modes[-1] is False and modes[0] is True
    first_val = modes.index(False)
    assert all(modes[first_val + 1 : -1])


class Twice(ScriptedTask):
    """Every batch of the task twice in a row."""

    def num_batches(self, epoch: int) -> int:
        return 2 * super().num_batches(epoch)

    def batches(self, epoch: int):  # noqa: ANN201
        for batch in super().batches(epoch):
            yield batch
            yield batch


def test_grad_accum_takes_the_mean_gradient_of_its_batches(tmp_path: Path) -> None:
    # accumulating two copies of each batch is one step on that batch, bit for bit
    once, twice = ScriptedTask(), Twice()
    a, b = model_for(once), model_for(twice)
    fit(a, once, tmp_path / "a", config(2))
    res = fit(b, twice, tmp_path / "b", LoopConfig(epochs=2, lr=1e-2, progress=False,
                                                    grad_accum=2))
    assert res.history[0]["steps"] == once.num_batches(0)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_bf16_autocast_trains_fp32_master_weights(tmp_path: Path) -> None:
    task = ScriptedTask()
    fp32, bf16 = model_for(task), model_for(task)
    h32 = fit(fp32, task, tmp_path / "fp32", config(3)).history
    h16 = fit(bf16, task, tmp_path / "bf16", LoopConfig(epochs=3, lr=1e-2, progress=False,
                                                        precision="bf16")).history
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    assert h16[-1]["train_loss"] < h16[0]["train_loss"]
    assert abs(h16[-1]["train_loss"] - h32[-1]["train_loss"]) < 0.05 * h32[-1]["train_loss"]
    with pytest.raises(ValueError, match="precision"):
        LoopConfig(precision="fp8").validate()
    with pytest.raises(ValueError, match="grad_accum"):
        LoopConfig(grad_accum=0).validate()


def test_a_resume_completes_what_a_crash_after_the_checkpoint_left_undone(
        tmp_path: Path) -> None:
    task = ScriptedTask([0.1, 0.3])
    cfg = LoopConfig(epochs=2, lr=1e-2, patience=0, progress=False, keep_epochs=True)
    fit(model_for(task), task, tmp_path, cfg)
    # a crash right after epoch 2's last/ was swapped in: no copy, best/ and history behind
    shutil.rmtree(tmp_path / "epochs" / "002")
    shutil.rmtree(tmp_path / BEST)
    shutil.copytree(tmp_path / "epochs" / "001", tmp_path / BEST)
    history = json.loads((tmp_path / "history.json").read_text())
    (tmp_path / "history.json").write_text(json.dumps(history[:1]))
    again = ScriptedTask([])
    fit(model_for(again), again, tmp_path, cfg, resume=True)
    assert json.loads((tmp_path / "history.json").read_text()) == history
    assert (tmp_path / "epochs" / "002" / "config.json").is_file()
    best, last = load_model(tmp_path / BEST).state_dict(), load_model(tmp_path / LAST).state_dict()
    assert all(torch.equal(best[k], last[k]) for k in last)
    assert torch.load(tmp_path / BEST / STATE_FILE, weights_only=True)["epoch"] == 2
