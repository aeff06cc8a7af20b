"""Checkpoint averaging: the mean of several checkpoints' weights, strict about what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from genrec.model import build_model
from genrec.model.checkpoint import load_model, save_model
from genrec.model.config import ModelConfig
from genrec.training.averaging import SOURCES_FILE, AveragingError, average_checkpoints
from genrec.training.checkpoints import STATE_FILE


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=8, user_dim=3)
    return ModelConfig(**{**base, **overrides})


def checkpoint(path: Path, seed: int, cfg: ModelConfig | None = None) -> Path:
    torch.manual_seed(seed)
    save_model(build_model(cfg or tiny_config()), path)
    (path / "vocab.json").write_text('{"levels": 3}\n')  # a non-weight file of the run
    (path / "extra").mkdir()
    save_file({"user_vectors": torch.arange(6.0).view(2, 3) / 7,
               "ids": torch.arange(4)}, path / "extra" / "table.safetensors")
    torch.save({"optimizer": seed}, path / STATE_FILE)
    return path


def test_average_is_the_elementwise_mean_and_loads(tmp_path: Path) -> None:
    dirs = [checkpoint(tmp_path / f"e{i}", seed=i) for i in range(3)]
    out = average_checkpoints(dirs, tmp_path / "avg")
    states = [load_model(d).state_dict() for d in dirs]
    averaged = load_model(out).state_dict()
    for key, value in averaged.items():
        expected = (states[0][key].double() + states[1][key].double()
                    + states[2][key].double()) / 3
        assert torch.allclose(value.double(), expected, atol=1e-7), key
    assert not torch.equal(averaged["model.embed_tokens.weight"],
                           states[0]["model.embed_tokens.weight"])
    extra = load_file(out / "extra" / "table.safetensors")
    assert torch.equal(extra["user_vectors"], torch.arange(6.0).view(2, 3) / 7)  # bit for bit
    assert torch.equal(extra["ids"], torch.arange(4))
    assert (out / "vocab.json").read_text() == '{"levels": 3}\n'
    assert not (out / STATE_FILE).exists()
    assert json.loads((out / SOURCES_FILE).read_text()) == [str(d) for d in dirs]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_refuses_what_cannot_be_averaged(tmp_path: Path) -> None:
    a, b = checkpoint(tmp_path / "a", 0), checkpoint(tmp_path / "b", 1)
    with pytest.raises(AveragingError, match="at least two"):
        average_checkpoints([a], tmp_path / "o")
    with pytest.raises(AveragingError, match="twice"):
        average_checkpoints([a, tmp_path / "a"], tmp_path / "o")
    with pytest.raises(AveragingError, match="no config.json"):
        average_checkpoints([a, tmp_path], tmp_path / "o")
    (tmp_path / "o").mkdir()
    with pytest.raises(AveragingError, match="already exists"):
        average_checkpoints([a, b], tmp_path / "o")
    other = checkpoint(tmp_path / "wide", 2, tiny_config(hidden_size=24, intermediate_size=48))
    with pytest.raises(AveragingError, match="config.json differs"):
        average_checkpoints([a, other], tmp_path / "o2")
    (b / "vocab.json").write_text('{"levels": 4}\n')
    with pytest.raises(AveragingError, match="vocab.json differs"):
        average_checkpoints([a, b], tmp_path / "o2")
    (b / "vocab.json").write_text('{"levels": 3}\n')
    save_file({"user_vectors": torch.zeros(2, 3), "ids": torch.arange(1, 5)},
              b / "extra" / "table.safetensors")
    with pytest.raises(AveragingError, match="integer tensor 'ids'"):
        average_checkpoints([a, b], tmp_path / "o2")
    (b / "extra" / "table.safetensors").unlink()
    with pytest.raises(AveragingError, match="other files"):
        average_checkpoints([a, b], tmp_path / "o2")
    assert not (tmp_path / "o2").exists()
