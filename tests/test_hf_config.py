"""A Hugging Face config.json read into a ModelConfig and written back: round trips, published
configs, and the settings genrec cannot honour refused by name."""

from __future__ import annotations

import json

import pytest
from hf_layouts import PUBLISHED, published

from genrec.model import ModelConfig


def test_hf_round_trip() -> None:
    cfg = ModelConfig(user_dim=16, score_head=True)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    llama = ModelConfig(architecture="LlamaForCausalLM", qk_norm=False)
    assert ModelConfig.from_hf_dict(llama.to_hf_dict()) == llama


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "sliding"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
         "rope_parameters.*dynamic"),
    ],
)
def test_hf_settings_genrec_cannot_honour(extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**ModelConfig().to_hf_dict(), **extra})


# ---- published config.json files (tests/hf_layouts.py): every key used, ignored or refused

# per key of a published config: a changed value, and what it must do. "field": a different
# ModelConfig; "ignored": the same one; "refused": ValueError naming the key.
PERTURBED = {
    "architectures": (["MyOwnForCausalLM"], "field"),
    "attention_bias": (True, "field"),
    "attention_dropout": (0.1, "ignored"),
    "bos_token_id": (1, "ignored"),
    "eos_token_id": ([1, 2, 3], "ignored"),
    "head_dim": (32, "field"),
    "hidden_act": ("gelu", "refused"),
    "hidden_size": (128, "field"),
    "initializer_range": (0.5, "ignored"),
    "intermediate_size": (64, "field"),
    "max_position_embeddings": (512, "field"),
    "max_window_layers": (1, "ignored"),
    "mlp_bias": (True, "field"),
    "model_type": ("gemma", "refused"),
    "num_attention_heads": (8, "field"),
    "num_hidden_layers": (3, "field"),
    "num_key_value_heads": (4, "field"),
    "pretraining_tp": (2, "refused"),
    "rms_norm_eps": (1e-3, "field"),
    "rope_scaling": ({"rope_type": "dynamic", "factor": 2.0}, "refused"),
    "rope_theta": (10000.0, "field"),
    "sliding_window": (16, "ignored"),
    "tie_word_embeddings": (None, "field"),  # replaced by its negation below
    "torch_dtype": ("float16", "ignored"),  # the loader's business (see test_checkpoint)
    "transformers_version": ("9.9.9", "ignored"),
    "use_cache": (False, "ignored"),
    "use_mrope": (True, "refused"),
    "use_sliding_window": (True, "refused"),
    "vocab_size": (500, "field"),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_config_loads(name: str) -> None:
    data = published(name)
    cfg = ModelConfig.from_hf_dict(data)
    arch = data["architectures"][0]
    assert cfg.architecture == arch and cfg.head_dim == 16 and cfg.vocab_size == 1000
    assert cfg.qk_norm == (arch == "Qwen3ForCausalLM")
    assert cfg.qkv_bias == (arch == "Qwen2ForCausalLM") and not cfg.attention_bias
    assert cfg.tie_word_embeddings == data["tie_word_embeddings"]
    assert cfg.rope_theta == data["rope_theta"]
    if arch == "LlamaForCausalLM":
        assert cfg.rope_scaling == {"rope_type": "llama3", **data["rope_scaling"]}
    else:
        assert cfg.rope_scaling is None
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_published_key_is_used_ignored_or_refused(name: str) -> None:
    data = published(name)
    base = ModelConfig.from_hf_dict(data)
    assert set(data) <= set(PERTURBED), sorted(set(data) - set(PERTURBED))
    for key in data:
        value, expected = PERTURBED[key]
        if key == "tie_word_embeddings":
            value = not data[key]
        try:
            got = "ignored" if ModelConfig.from_hf_dict({**data, key: value}) == base else "field"
        except ValueError as e:
            assert key in str(e), (key, str(e))
            got = "refused"
        assert got == expected, (key, value)


@pytest.mark.parametrize("name", PUBLISHED)
def test_transformers_resaved_config_reads_the_same(name: str, tmp_path) -> None:
    # transformers 5 writes rope_parameters (theta inside), layer_types, dtype, ...
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(published(name)))
    AutoConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert ModelConfig.from_hf_dict(again) == ModelConfig.from_hf_dict(published(name))


def test_published_variants() -> None:
    instruct = {**published("Llama-3.2-1B"), "eos_token_id": [128001, 128008, 128009]}
    assert ModelConfig.from_hf_dict(instruct) == ModelConfig.from_hf_dict(published("Llama-3.2-1B"))
    # no num_key_value_heads: multi-head attention, as transformers
    mha = {k: v for k, v in published("Qwen2.5-0.5B").items() if k != "num_key_value_heads"}
    assert ModelConfig.from_hf_dict(mha).num_key_value_heads == 4
    # the legacy "type" spelling of a rope scaling, and transformers 5's rope_parameters
    legacy = published("Llama-3.1-8B")
    legacy["rope_scaling"] = {**legacy["rope_scaling"], "type": "llama3"}
    assert ModelConfig.from_hf_dict(legacy) == ModelConfig.from_hf_dict(published("Llama-3.1-8B"))
    five = published("Llama-3.1-8B")
    five["rope_parameters"] = {**five.pop("rope_scaling"), "rope_theta": five.pop("rope_theta")}
    assert ModelConfig.from_hf_dict(five) == ModelConfig.from_hf_dict(published("Llama-3.1-8B"))


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        ("Qwen2.5-0.5B", {"attention_bias": True}, "attention_bias=true is not part of the Qwen2"),
        ("Qwen2.5-0.5B", {"mlp_bias": True}, "mlp_bias"),
        ("Qwen3-8B", {"mlp_bias": True}, "mlp_bias=true is not part of the Qwen3"),
        ("Qwen3-8B", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ("Qwen3-8B", {"layer_types": ["full_attention"]}, "layer_types.*one type per layer"),
        ("Qwen3-8B", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ("Qwen3-8B", {"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                      "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "disagree"),
        ("Qwen3-8B", {"rope_parameters": {"rope_type": "default", "rope_theta": 5.0}},
         "rope_theta"),
        ("Qwen3-8B", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0],
                                       "long_factor": [1.0]}}, "rope_scaling.*longrope"),
        ("Llama-3.1-8B", {"colour": "blue"}, "unknown config keys.*colour"),
        ("Llama-3.1-8B", {"user_dim": 4}, "unknown config keys.*user_dim"),
    ],
)
def test_published_config_with_unsupported_settings(name: str, extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**published(name), **extra})


def test_qwen2_round_trip_and_out_of_tree_layouts() -> None:
    qwen2 = ModelConfig(architecture="Qwen2ForCausalLM", qk_norm=False, qkv_bias=True,
                        tie_word_embeddings=True)
    hf = qwen2.to_hf_dict()
    assert hf["model_type"] == "qwen2" and "attention_bias" not in hf and "mlp_bias" not in hf
    assert ModelConfig.from_hf_dict(hf) == qwen2
    mine = ModelConfig(architecture="MineForCausalLM", qk_norm=False, qkv_bias=True)
    assert mine.to_hf_dict()["model_type"] == "qwen2"
    assert ModelConfig.from_hf_dict(mine.to_hf_dict()) == mine
    with pytest.raises(ValueError, match="no HF layout"):
        ModelConfig(architecture="MineForCausalLM", qkv_bias=True).to_hf_dict()
