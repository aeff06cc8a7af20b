"""``genrec average`` on the command line."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

from genrec.cli import app
from genrec.model import build_model
from genrec.model.checkpoint import load_model, save_model
from genrec.model.config import ModelConfig


def test_average_command_writes_a_loadable_checkpoint_and_reports_errors(tmp_path: Path) -> None:
    cfg = ModelConfig(vocab_size=20, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    for i in range(2):
        torch.manual_seed(i)
        save_model(build_model(cfg), tmp_path / f"e{i}")
    runner = CliRunner()
    result = runner.invoke(app, ["average", str(tmp_path / "e0"), str(tmp_path / "e1"),
                                 "--out", str(tmp_path / "avg")])
    assert result.exit_code == 0, result.output
    assert "mean of 2 checkpoints" in result.output
    assert load_model(tmp_path / "avg").config.hidden_size == 8
    again = runner.invoke(app, ["average", str(tmp_path / "e0"), str(tmp_path / "e1"),
                                "--out", str(tmp_path / "avg")])
    assert again.exit_code == 1 and "already exists" in again.output
