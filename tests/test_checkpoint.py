"""Strict checkpoint loading and saving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from genrec.model import ModelConfig, build_layout, build_model, load_model, save_model
from genrec.model.checkpoint import CheckpointError


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def test_missing_key_is_named(qwen3_dir, tmp_path) -> None:
    path = _copy(qwen3_dir, tmp_path / "m")
    _edit_weights(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="missing keys.*layers.1.mlp.up_proj"):
        load_model(path)


def test_unexpected_key_is_named(qwen3_dir, tmp_path) -> None:
    path = _copy(qwen3_dir, tmp_path / "m")
    _edit_weights(path, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected keys.*model.extra.weight"):
        load_model(path)


def test_shape_mismatch_is_named(qwen3_dir, tmp_path) -> None:
    path = _copy(qwen3_dir, tmp_path / "m")
    _edit_weights(path, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(CheckpointError, match=r"model.norm.weight has shape \(65,\)"):
        load_model(path)


def test_dtype_mismatch_is_named(qwen3_dir, tmp_path) -> None:
    path = _copy(qwen3_dir, tmp_path / "m")
    _edit_weights(path, lambda t: t.update({"model.norm.weight": torch.ones(64).half()}))
    with pytest.raises(CheckpointError, match="model.norm.weight has dtype torch.float16"):
        load_model(path)


def test_unknown_config_key_rejected(qwen3_dir, tmp_path) -> None:
    path = _copy(qwen3_dir, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["mystery_setting"] = 3
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mystery_setting"):
        load_model(path)


def test_no_weights_or_config(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path)


def test_round_trip_with_extras_and_transformers_reads_it(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, user_dim=8,
                      score_head=True, tie_word_embeddings=True)
    model = build_model(cfg)
    save_model(model, tmp_path / "ck")
    assert not list((tmp_path / "ck").glob(".*.tmp"))  # no temp files left behind
    loaded = load_model(tmp_path / "ck")
    pairs = zip(model.state_dict().items(), loaded.state_dict().items(), strict=True)
    for (k, a), (_, b) in pairs:
        assert torch.equal(a, b), k
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    ids = torch.randint(0, 50, (12,))
    layout = build_layout([12], [], [])
    with torch.no_grad():
        ours = loaded.logits(loaded(loaded.model.embed_tokens(ids), layout.positions, layout))
        assert (ours - hf(ids[None]).logits[0]).abs().max() < 1e-4


def test_bf16_save_declares_dtype(tmp_path) -> None:
    cfg = ModelConfig(vocab_size=20, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    save_model(build_model(cfg).to(torch.bfloat16), tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_model(tmp_path / "b").dtype == torch.bfloat16
    assert load_model(tmp_path / "b", dtype="float32").dtype == torch.float32
