"""The distilled recipe in one run: two teachers from the run's options, then the student."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from generative_run_support import tiny_config

from genrec.data import load_json_dataset
from genrec.training.distilled_run import teacher_configs, train_distilled
from genrec.training.final_model import has_final_model
from genrec.training.generative_run import GenerativeTrainConfig, train_generative


def _config(tmp_path: Path, **options: object) -> GenerativeTrainConfig:
    given: dict = dict(epochs=3, average=0, distill=True)
    return tiny_config(tmp_path, **(given | options))


def test_the_teachers_are_the_measured_pair_under_out(tmp_path: Path) -> None:
    config = _config(tmp_path, dropout=0.3, sid_distill_weight=0.5, distill_temperature=2.0)
    teachers = teacher_configs(config, load_json_dataset(config.data))
    assert list(teachers) == ["defaults", "mask-history"]
    plain, masked = teachers["defaults"], teachers["mask-history"]
    assert plain.out == tmp_path / "run" / "teachers" / "defaults"
    assert masked.out == tmp_path / "run" / "teachers" / "mask-history"
    for t in (plain, masked):  # the run's own options, no distillation of their own
        assert t.dropout == 0.3 and t.hidden == 16 and t.teacher is None
        assert t.distill is False and t.sid_distill_weight == 0.0
        assert t.distill_temperature == 1.0
    assert plain.epochs == 3 and plain.mask_history is False and plain.item_loss_weight == 1.0
    assert masked.mask_history is True and masked.history_bias is False
    assert masked.item_loss_weight == 0.5 and masked.epochs == 2  # two thirds of the run's
    assert plain.history_bias is True


def test_the_teachers_keep_their_own_history_handling_under_a_masked_student(
        tmp_path: Path) -> None:
    config = _config(tmp_path, mask_history=True, history_bias=False)
    teachers = teacher_configs(config, load_json_dataset(config.data))
    plain, masked = teachers["defaults"], teachers["mask-history"]
    assert plain.mask_history is False and plain.history_bias is True
    assert masked.mask_history is True and masked.history_bias is False


def test_one_call_trains_both_teachers_then_the_student_and_resumes(tmp_path: Path) -> None:
    lines: list[str] = []
    config = _config(tmp_path)
    result = train_distilled(config, echo=lines.append)
    run = tmp_path / "run"
    assert result is not None and result.epochs_done == 3
    for name, epochs in (("defaults", 3), ("mask-history", 2)):
        assert has_final_model(run / "teachers" / name)
        history = json.loads((run / "teachers" / name / "history.json").read_text())
        assert len(history) == epochs
    assert has_final_model(run)
    args = json.loads((run / "train_args.json").read_text())
    assert args["distill"] is True and args["distill_weight"] == 0.8
    assert args["teacher"] == [str(run / "teachers" / n / "model")
                               for n in ("defaults", "mask-history")]
    masked = json.loads((run / "teachers" / "mask-history" / "train_args.json").read_text())
    assert masked["mask_history"] is True and masked["history_bias"] is False
    assert masked["teacher"] is None
    assert any(line.startswith("teacher defaults: training") for line in lines)

    # resumed: finished teachers are reused, the finished student is kept as it is
    lines.clear()
    again = train_distilled(replace(config, resume=True), echo=lines.append)
    assert again is not None and again.epochs_done == 3
    assert [line for line in lines if line.startswith("teacher")] == [
        f"teacher defaults: reused ({run / 'teachers' / 'defaults' / 'model'})",
        f"teacher mask-history: reused ({run / 'teachers' / 'mask-history' / 'model'})"]

    # without resume an existing run is not overwritten
    with pytest.raises(FileExistsError):
        train_distilled(config)


def test_options_the_recipe_cannot_take_are_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, teacher=[tmp_path / "t" / "model"])
    with pytest.raises(ValueError, match="--distill or --teacher"):
        train_distilled(config)
    with pytest.raises(ValueError, match="one process"):
        train_distilled(_config(tmp_path / "d", nproc=2))
    with pytest.raises(ValueError, match="--item-head"):
        train_distilled(_config(tmp_path / "b", item_head=False))
    # the single run's entry point does not train teachers by itself
    with pytest.raises(ValueError, match="train_distilled"):
        train_generative(_config(tmp_path / "c"))
