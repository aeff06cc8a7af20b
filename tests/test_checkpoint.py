"""Strict checkpoint loading and saving."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from genrec.model import ModelConfig, build_layout, build_model, load_model, save_model
from genrec.model.checkpoint import INDEX_FILE, CheckpointError


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


def test_stored_dtypes_are_cast_and_said_once(qwen3_dir, tmp_path, caplog) -> None:
    # as transformers: floating tensors in another dtype than declared are cast on load
    path = _copy(qwen3_dir, tmp_path / "m")
    half = torch.rand(64).half() + 0.5
    _edit_weights(path, lambda t: t.update({"model.norm.weight": half,
                                            "model.layers.0.mlp.up_proj.weight":
                                            t["model.layers.0.mlp.up_proj.weight"].bfloat16()}))
    with caplog.at_level(logging.INFO, logger="genrec.model.checkpoint"):
        model = load_model(path)
    assert model.dtype == torch.float32 and torch.equal(model.model.norm.weight, half.float())
    said = [r for r in caplog.records if "cast on load" in r.getMessage()]
    assert len(said) == 1 and "torch.bfloat16, torch.float16" in said[0].getMessage()
    assert load_model(path, dtype="bfloat16").model.norm.weight.dtype == torch.bfloat16


def test_non_floating_tensor_is_named(qwen3_dir, tmp_path) -> None:
    path = _copy(qwen3_dir, tmp_path / "m")
    ints = torch.ones(64, dtype=torch.int32)
    _edit_weights(path, lambda t: t.update({"model.norm.weight": ints}))
    with pytest.raises(CheckpointError,
                       match="model.norm.weight has dtype torch.int32, model expects a floating"):
        load_model(path)


@pytest.fixture(scope="module")
def sharded_dir(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("sharded")
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir)
    hf.save_pretrained(path, max_shard_size="100KB")
    assert len(list(path.glob("model-*-of-*.safetensors"))) > 1
    return path


def _shard_copy(sharded_dir: Path, tmp_path: Path) -> tuple[Path, dict]:
    path = _copy(sharded_dir, tmp_path / "s")
    return path, json.loads((path / INDEX_FILE).read_text())


def test_sharded_checkpoint_loads_by_its_index(sharded_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    model = load_model(sharded_dir)
    hf = AutoModelForCausalLM.from_pretrained(sharded_dir).eval()
    for key, value in hf.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    # without the index: every model*.safetensors shard, as before
    path, _ = _shard_copy(sharded_dir, tmp_path)
    (path / INDEX_FILE).unlink()
    assert torch.equal(load_model(path).lm_head.weight, model.lm_head.weight)


def test_index_naming_a_missing_shard(sharded_dir, tmp_path) -> None:
    path, index = _shard_copy(sharded_dir, tmp_path)
    shard = sorted(set(index["weight_map"].values()))[-1]
    (path / shard).unlink()
    with pytest.raises(CheckpointError, match=f"shard '{shard}' does not exist"):
        load_model(path)


def test_tensor_in_another_shard_than_its_index_says(sharded_dir, tmp_path) -> None:
    path, index = _shard_copy(sharded_dir, tmp_path)
    shards = sorted(set(index["weight_map"].values()))
    # a tensor of a shard that keeps others (so the shard is still read)
    counts = {v: list(index["weight_map"].values()).count(v) for v in shards}
    key = next(k for k, v in index["weight_map"].items() if counts[v] > 1)
    other = next(v for v in shards if v != index["weight_map"][key])
    index["weight_map"][key] = other
    (path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"tensor '{key}' is mapped to '{other}'"):
        load_model(path)


def test_index_lists_a_tensor_no_shard_holds(sharded_dir, tmp_path) -> None:
    path, index = _shard_copy(sharded_dir, tmp_path)
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = next(
        iter(index["weight_map"].values()))
    (path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="tensor 'model.layers.9.mlp.up_proj.weight' to"):
        load_model(path)


def test_shard_tensor_missing_from_the_index(sharded_dir, tmp_path) -> None:
    path, index = _shard_copy(sharded_dir, tmp_path)
    del index["weight_map"]["model.norm.weight"]
    (path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="'model.norm.weight' is not in .*weight_map"):
        load_model(path)


@pytest.mark.parametrize("content", ["{}", "not json", '{"weight_map": {"a": 1}}',
                                     '{"weight_map": {"a": "../model.safetensors"}}'])
def test_malformed_index(sharded_dir, tmp_path, content: str) -> None:
    path, _ = _shard_copy(sharded_dir, tmp_path)
    (path / INDEX_FILE).write_text(content)
    with pytest.raises(CheckpointError, match=INDEX_FILE):
        load_model(path)


def test_index_beside_a_single_file_is_ambiguous(sharded_dir, qwen3_dir, tmp_path) -> None:
    path, _ = _shard_copy(sharded_dir, tmp_path)
    shutil.copy(qwen3_dir / "model.safetensors", path / "model.safetensors")
    with pytest.raises(CheckpointError, match="both model.safetensors and"):
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


def test_saving_over_a_sharded_checkpoint_replaces_it(sharded_dir, tmp_path) -> None:
    path, index = _shard_copy(sharded_dir, tmp_path)
    model = load_model(path)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    save_model(model, path)  # one model.safetensors: the index and its shards go
    assert not (path / INDEX_FILE).exists()
    assert not any((path / name).exists() for name in set(index["weight_map"].values()))
    assert torch.equal(load_model(path).lm_head.weight, model.lm_head.weight)
