"""The final model of a training run: the best epoch or the mean of the epochs around it,
whichever validates better (``LoopConfig.average``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from loop_support import ScriptedTask, model_for

from genrec.model.checkpoint import load_model
from genrec.training.loop import LoopConfig, fit
from genrec.training.run_layout import BEST, EPOCHS, MODEL, model_folder


def averaged(epochs: list[Path]) -> dict[str, torch.Tensor]:
    states = [load_model(e).state_dict() for e in epochs]
    return {k: torch.stack([s[k].double() for s in states]).mean(0).float() for k in states[0]}


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_model(folder).state_dict()


def run(tmp_path: Path, script: list[float | None], epochs: int, average: int,
        keep_epochs: bool = False, patience: int = 0):
    task = ScriptedTask(script)
    model = model_for(task)
    cfg = LoopConfig(epochs=epochs, lr=1e-2, patience=patience, progress=False,
                     keep_epochs=keep_epochs, average=average)
    return fit(model, task, tmp_path, cfg), task, model


def test_a_better_mean_of_the_epochs_around_the_best_becomes_the_model(tmp_path: Path) -> None:
    # epochs 1-5, best 3; then the means of epochs 2-4 (k=1) and 1-5 (k=2) are validated
    result, task, model = run(tmp_path, [0.1, 0.2, 0.5, 0.3, 0.2, 0.6, 0.55], 5, 2,
                              keep_epochs=True)
    assert task.calls == 7 and result.best_epoch == 3
    assert result.final["chosen"] == "mean of epochs 2-4"
    assert [c["epochs"] for c in result.final["candidates"]] == [[3], [2, 3, 4], [1, 2, 3, 4, 5]]
    assert [c["ndcg@10"] for c in result.final["candidates"]] == [0.5, 0.6, 0.55]
    assert json.loads((tmp_path / "model.json").read_text()) == result.final
    expected = averaged([tmp_path / EPOCHS / f"{e:03d}" for e in (2, 3, 4)])
    final = weights(tmp_path / MODEL)
    for k, v in expected.items():
        torch.testing.assert_close(final[k], v, rtol=0, atol=1e-7, msg=k)
        assert torch.equal(model.state_dict()[k], final[k])  # the model ends with it
    assert model_folder(tmp_path) == tmp_path / MODEL
    assert [p.name for p in tmp_path.glob(".*")] == []  # no candidate left behind


def test_a_separate_final_validation_measures_the_best_epoch_again_and_chooses(
        tmp_path: Path) -> None:
    final_script = iter([0.40, 0.45, 0.38])  # best epoch again, then the means k=1, k=2

    class WithFinal(ScriptedTask):
        final_calls = 0

        @property
        def final_validation(self):  # noqa: ANN202
            def validate(model):  # noqa: ANN001, ANN202
                self.final_calls += 1
                return {"ndcg@10": next(final_script)}
            return validate

    task = WithFinal([0.1, 0.2, 0.5, 0.3, 0.2])
    cfg = LoopConfig(epochs=5, lr=1e-2, progress=False, average=2)
    result = fit(model_for(task), task, tmp_path, cfg)
    assert task.calls == 5 and task.final_calls == 3 and result.best_epoch == 3
    assert [c["ndcg@10"] for c in result.final["candidates"]] == [0.40, 0.45, 0.38]
    assert result.final["chosen"] == "mean of epochs 2-4"
    # one epoch: no mean to compare it with, so it is not measured again
    task = WithFinal([0.3])
    result = fit(model_for(task), task, tmp_path / "one", LoopConfig(
        epochs=1, lr=1e-2, progress=False, average=2))
    assert task.final_calls == 0 and result.final["candidates"][0]["ndcg@10"] == 0.3


def test_the_best_epoch_stays_when_no_mean_validates_better(tmp_path: Path) -> None:
    result, _, model = run(tmp_path, [0.1, 0.4, 0.3, 0.35, 0.4], 3, 2)
    assert result.final["chosen"] == "epoch 2"
    # the best epoch's +-1 and +-2 windows are the same epochs 1-3: validated once
    assert [c["epochs"] for c in result.final["candidates"]] == [[2], [1, 2, 3]]
    best, final = weights(tmp_path / BEST), weights(tmp_path / MODEL)
    assert all(torch.equal(best[k], final[k]) for k in best)
    assert not (tmp_path / MODEL / "train_state.pt").exists()
    assert not (tmp_path / EPOCHS).exists()  # kept for averaging only


def test_only_the_epochs_a_window_can_use_are_kept(tmp_path: Path) -> None:
    # best epoch 3; with average 1 epoch 1 is no longer needed once epoch 3 is the best
    with pytest.raises(KeyboardInterrupt):  # killed while validating epoch 6
        run(tmp_path, [0.1, 0.2, 0.5, 0.3, 0.2, None], 8, 1)
    assert sorted(p.name for p in (tmp_path / EPOCHS).iterdir()) == ["002", "003", "004", "005"]
    assert not (tmp_path / MODEL).exists()


def test_without_validation_the_last_epoch_is_the_model(tmp_path: Path) -> None:
    result, task, _ = run(tmp_path, None, 3, 2)
    assert result.final["chosen"] == "epoch 3" and len(result.final["candidates"]) == 1
    last, final = weights(tmp_path / "last"), weights(tmp_path / MODEL)
    assert all(torch.equal(last[k], final[k]) for k in last)


def test_a_finished_run_resumed_keeps_its_model_and_more_epochs_choose_again(
        tmp_path: Path) -> None:
    first, _, _ = run(tmp_path, [0.1, 0.5, 0.2, 0.7], 3, 1, keep_epochs=True)
    assert first.final["chosen"] == "mean of epochs 1-3"
    again = ScriptedTask([])
    cfg = LoopConfig(epochs=3, lr=1e-2, patience=0, progress=False, keep_epochs=True, average=1)
    assert fit(model_for(again), again, tmp_path, cfg, resume=True).final == first.final
    assert again.calls == 0
    more = ScriptedTask([0.9, 0.1])  # epoch 4 the best; the mean of epochs 3-4 is worse
    cfg = LoopConfig(epochs=4, lr=1e-2, patience=0, progress=False, keep_epochs=True, average=1)
    result = fit(model_for(more), more, tmp_path, cfg, resume=True)
    assert result.final["chosen"] == "epoch 4" and result.final["epoch"] == 4


def test_average_is_checked() -> None:
    with pytest.raises(ValueError, match="average"):
        LoopConfig(average=-1).validate()


def test_a_window_that_cannot_be_averaged_is_skipped(tmp_path: Path) -> None:
    class Varying(ScriptedTask):
        """Writes a file that changes from the third epoch on beside every checkpoint."""

        saves = 0

        def save_extra(self, directory: Path) -> None:
            super().save_extra(directory)
            self.saves += 1
            (Path(directory) / "note.txt").write_text("a" if self.saves < 3 else "b")

    task = Varying([0.1, 0.5, 0.2])
    cfg = LoopConfig(epochs=3, lr=1e-2, patience=0, progress=False, average=2)
    result = fit(model_for(task), task, tmp_path, cfg)
    assert result.final["chosen"] == "epoch 2" and task.calls == 3
    [skipped] = result.final["candidates"][1:]
    assert skipped["epochs"] == [1, 2, 3] and "note.txt" in skipped["error"]
    assert skipped["ndcg@10"] is None
    assert [p.name for p in tmp_path.glob(".*")] == []
