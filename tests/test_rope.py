"""Rope scaling (linear, llama3, yarn) against transformers; refused types; round trips."""

from __future__ import annotations

import pytest
import torch

from genrec.model import ModelConfig, build_layout, build_model, load_model, save_model
from genrec.model.layers import Rotary
from genrec.model.rope import rope_scaling_params

HEAD_DIM, MAX_POS = 16, 4096

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3-3.2": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "llama3-small": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    # Qwen3's long-context setting
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-options": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                     "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                     "truncate": False},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.3,
                              "original_max_position_embeddings": 2048},
}


def _hf_config(theta: float, scaling: dict | None):
    from transformers import LlamaConfig

    params = {"rope_theta": theta, **(scaling or {"rope_type": "default"})}
    return LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM,
                       max_position_embeddings=MAX_POS, rope_parameters=params)


@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_frequencies_and_cos_sin_match_transformers(name: str, theta: float) -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = rope_scaling_params(SCALINGS[name], MAX_POS)
    hf = LlamaRotaryEmbedding(_hf_config(theta, scaling))
    ours = Rotary(HEAD_DIM, theta, scaling)
    cpu = torch.device("cpu")
    torch.testing.assert_close(ours.inv_freq(cpu), hf.inv_freq, rtol=2e-6, atol=0)
    assert ours.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-12)
    positions = torch.arange(0, 3000, 7)
    cos, signed_sin = ours.cos_sin(positions, torch.float32)
    ref_cos, ref_sin = hf(torch.zeros(1), positions[None])
    # fp32 angles up to 3000 rad: a last-bit difference in a frequency moves them ~1e-4
    torch.testing.assert_close(cos[:, 0], ref_cos[0], rtol=0, atol=5e-4)
    half = HEAD_DIM // 2
    torch.testing.assert_close(signed_sin[:, 0, half:], ref_sin[0, :, half:], rtol=0, atol=5e-4)
    torch.testing.assert_close(signed_sin[:, 0, :half], -ref_sin[0, :, :half], rtol=0, atol=5e-4)


def test_each_llama3_regime_is_exercised() -> None:
    # head_dim 16, theta 5e5, original 64: frequencies kept, blended and divided by factor
    scaling = rope_scaling_params(SCALINGS["llama3-small"], MAX_POS)
    plain = Rotary(HEAD_DIM, 500000.0).inv_freq(torch.device("cpu"))
    ratio = plain / Rotary(HEAD_DIM, 500000.0, scaling).inv_freq(torch.device("cpu"))
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(8.0)
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


def test_canonical_form() -> None:
    canon = rope_scaling_params({"type": "linear", "factor": 2}, MAX_POS)
    assert canon == {"rope_type": "linear", "factor": 2.0}
    assert rope_scaling_params(canon, MAX_POS) == canon
    filled = rope_scaling_params({"rope_type": "yarn", "factor": 4, "beta_fast": None}, MAX_POS)
    assert filled == {"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": MAX_POS}
    assert rope_scaling_params({"rope_type": "default"}, MAX_POS) is None
    assert rope_scaling_params(None, MAX_POS) is None


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "dynamic.*batch"),
        ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]},
         "unsupported rope type 'longrope'"),
        ({"rope_type": "mrope"}, "unsupported rope type 'mrope'"),
        ({"rope_type": "linear"}, r"missing parameters \['factor'\]"),
        ({"rope_type": "linear", "factor": 2.0, "colour": 1}, r"unknown parameters \['colour'\]"),
        ({"rope_type": "linear", "factor": 0.5}, "'factor' must be a number >= 1"),
        ({"rope_type": "linear", "factor": True}, "'factor' must be a number"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
         "high_freq_factor"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10.5},
         "original_max_position_embeddings"),
        ({"rope_type": "yarn", "factor": 2.0, "truncate": 1}, "truncate"),
        ({"rope_type": "yarn", "factor": 2.0, "beta_fast": 0}, "beta_fast"),
        ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, "type 'yarn'"),
        ({"rope_type": "default", "factor": 2.0}, "'default'"),
    ],
)
def test_refused_scalings_are_named(scaling: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(rope_scaling=scaling)
    hf = {**ModelConfig().to_hf_dict(), "rope_parameters": None, "rope_scaling": scaling}
    with pytest.raises(ValueError, match="config key 'rope_scaling'"):
        ModelConfig.from_hf_dict(hf)


def _tiny(scaling: dict | None, theta: float = 10000.0) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", qk_norm=False, vocab_size=96,
                       hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                       max_position_embeddings=MAX_POS, rope_theta=theta, rope_scaling=scaling)


@pytest.mark.parametrize("name", ["linear", "llama3-small", "yarn-options",
                                  "yarn-attention-factor"])
def test_saved_checkpoint_reads_identically_in_transformers(name: str, tmp_path) -> None:
    from hf_layouts import hf_model, randomise

    cfg = _tiny(SCALINGS[name], theta=500000.0)
    model = build_model(cfg)
    randomise(model, seed=3)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config == cfg and ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    hf = hf_model(tmp_path)
    assert hf.config.rope_parameters == {"rope_theta": 500000.0, **cfg.rope_scaling}
    ids = torch.randint(0, 96, (300,), generator=torch.Generator().manual_seed(0))
    layout = build_layout([300], [], [])
    with torch.no_grad():
        ours = loaded.logits(loaded(loaded.model.embed_tokens(ids), layout.positions, layout))
        ref = hf(ids[None]).logits[0]
        assert (ours - ref).abs().max() < 1e-4
        # the scaling matters here: without it the logits are far off
        loaded.rotary = Rotary(HEAD_DIM, 500000.0)
        plain = loaded.logits(loaded(loaded.model.embed_tokens(ids), layout.positions, layout))
    assert (plain - ref).abs().max() > 1e-2
