"""The genrec command line: help, `genrec score` on a tiny checkpoint, argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from genrec.cli import app, parse_candidates, parse_ids
from genrec.engine import Engine, ScoreParams
from genrec.model import DecoderLM, ModelConfig, save_model

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )
    path = tmp_path_factory.mktemp("ckpt")
    save_model(DecoderLM(cfg), path)
    return path


def test_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output and "score" in result.output
    for command in ("demo", "score"):
        sub = runner.invoke(app, [command, "--help"])
        assert sub.exit_code == 0, sub.output


def test_demo_help_shows_serving_options() -> None:
    result = runner.invoke(app, ["demo", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--no-serve" in result.output and "--port" in result.output


def test_parse_helpers() -> None:
    assert parse_ids(" 1, 2,3 ", "x") == [1, 2, 3]
    assert parse_candidates("4,5;6") == [[4, 5], [6]]


def test_score_labels_matches_engine(tiny_ckpt: Path) -> None:
    args = ["score", "--model", str(tiny_ckpt), "--prefix", "1,2,3", "--candidates", "4,5;6,7,8",
            "--mode", "labels", "--labels", "0,1", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    expected = Engine.from_pretrained(tiny_ckpt).score(
        [1, 2, 3], [[4, 5], [6, 7, 8]], ScoreParams(mode="labels", label_token_ids=[0, 1])
    )
    assert got["mode"] == "labels" and got["labels"] == [0, 1]
    assert torch.allclose(torch.tensor(got["scores"]), expected, atol=1e-5)


def test_score_loglik_table(tiny_ckpt: Path) -> None:
    args = ["score", "--model", str(tiny_ckpt), "--prefix", "1,2", "--candidates", "4,5;6",
            "--mode", "loglik"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert "loglik" in lines[0] and len(lines) == 3
    expected = Engine.from_pretrained(tiny_ckpt).score([1, 2], [[4, 5], [6]],
                                                      ScoreParams(mode="loglik"))
    values = [float(line.split()[1]) for line in lines[1:]]
    assert values == pytest.approx(expected.tolist(), abs=1e-5)
    assert lines[1].split()[-1] == "4,5"


def test_score_bfloat16(tiny_ckpt: Path) -> None:
    args = ["score", "--model", str(tiny_ckpt), "--prefix", "1,2", "--candidates", "3;4",
            "--mode", "labels", "--labels", "5", "--dtype", "bfloat16", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["scores"]) == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prefix", "1,x", "--candidates", "4"], "comma-separated integers"),
        (["--prefix", "1,,2", "--candidates", "4"], "comma-separated integers"),
        (["--prefix", "1", "--candidates", "4;"], "no token ids"),
        (["--prefix", "1", "--candidates", "4", "--mode", "labels"], "label_token_ids"),
        (["--prefix", "1", "--candidates", "99", "--mode", "loglik"], "candidates[0]"),
        (["--prefix", "1", "--candidates", "4", "--mode", "loglik", "--dtype", "int8"],
         "unknown dtype"),
    ],
)
def test_score_errors(tiny_ckpt: Path, extra: list[str], message: str) -> None:
    result = runner.invoke(app, ["score", "--model", str(tiny_ckpt), *extra])
    assert result.exit_code != 0
    assert message in result.output


def test_score_missing_checkpoint(tmp_path: Path) -> None:
    result = runner.invoke(app, ["score", "--model", str(tmp_path), "--prefix", "1",
                                 "--candidates", "2", "--mode", "loglik"])
    assert result.exit_code == 1
    assert "no config.json" in result.output


def _commands(command: object, path: str = "genrec") -> list[tuple[str, object]]:
    """Every leaf command of the click tree under ``command``, with its path."""
    subs = getattr(command, "commands", None)
    if not subs:
        return [(path, command)]
    return [leaf for name, sub in subs.items() for leaf in _commands(sub, f"{path} {name}")]


def test_every_device_option_defaults_to_auto() -> None:
    import typer

    found = {}
    for path, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            if param.name == "device":
                found[path] = param.default
    assert {"genrec serve", "genrec score", "genrec eval", "genrec recommend"} <= set(found)
    assert {p: d for p, d in found.items() if d != "auto"} == {}


def test_python_m_genrec_runs_the_command_line() -> None:
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "genrec", "serve", "--help"],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert run.returncode == 0, run.stderr
    assert "Usage: genrec serve [OPTIONS] [MODEL]" in " ".join(run.stdout.split())


@pytest.mark.parametrize(("args", "message"), [
    (["serve"], "give the model"),
    (["serve", "a", "--model", "b"], "MODEL a and --model b differ"),
])
def test_serve_takes_the_model_once(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
