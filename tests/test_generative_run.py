"""A generative training run from a config through the Python API (no command line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from generative_run_support import tiny_config

from genrec.data import load_json_dataset
from genrec.training.generative_run import train_generative


def test_a_config_trains_and_records_its_options(tmp_path: Path) -> None:
    lines: list[str] = []
    result = train_generative(tiny_config(tmp_path, seed=3), echo=lines.append)
    assert result is not None and result.epochs_done == 1
    assert (tmp_path / "run" / "best" / "config.json").is_file()
    args = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert args["seed"] == 3 and args["hidden"] == 16 and args["data"] == str(tmp_path / "toy")
    assert args["item_head"] is True  # from scratch: on by default
    assert any("Toy" in line and "params on cpu" in line for line in lines)


def test_bad_options_raise_value_errors(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, prompt_text="hi")
    with pytest.raises(ValueError, match="--prompt-text needs --extend-vocab"):
        train_generative(config)
    config.prompt_text, config.distill_temperature = None, 2.0
    with pytest.raises(ValueError, match="--distill-temperature distils from the teachers"):
        train_generative(config)
    config.data, config.distill_temperature = None, 1.0
    with pytest.raises(ValueError, match="exactly one of data"):
        train_generative(config)


def test_mask_history_trains_the_head_and_validates_masked(tmp_path: Path) -> None:
    from genrec import Engine
    from genrec.evaluation.full_catalog import evaluate_generative, full_histories, split_examples

    config = tiny_config(tmp_path, mask_history=True, seed=1)
    result = train_generative(config, echo=lambda _: None)
    assert result is not None and result.epochs_done == 1
    args = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert args["mask_history"] is True
    # the recorded validation is the masked one: re-evaluate the saved model both ways
    ds = load_json_dataset(config.data)
    val = split_examples(ds.sequences, "val", None, config.val_users, config.seed)
    engine = Engine.from_pretrained(tmp_path / "run" / "best", device="cpu")
    masked = evaluate_generative(engine, val, beam_width=config.beam_width,
                                 exclude=full_histories(ds.sequences, val, "val"))
    assert result.history[0]["val_ndcg@10"] == pytest.approx(masked["ndcg@10"])
    assert result.history[0]["val_recall@10"] == pytest.approx(masked["recall@10"])
    with pytest.raises(ValueError, match="--mask-history trains the item head"):
        train_generative(tiny_config(tmp_path / "b", mask_history=True, item_head=False))
