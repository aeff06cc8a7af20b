"""ModelConfig validation."""

from __future__ import annotations

import pytest

from genrec.model import ModelConfig


def test_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown config keys.*colour"):
        ModelConfig.from_dict({"hidden_size": 64, "colour": "blue"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, "multiple"),
        ({"head_dim": 15}, "even"),
        ({"user_dim": -1}, "user_dim"),
    ],
)
def test_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


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
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope"),
    ],
)
def test_hf_settings_genrec_cannot_honour(extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**ModelConfig().to_hf_dict(), **extra})
