"""ModelConfig validation: field checks and what a known architecture fixes."""

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

@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"architecture": "LlamaForCausalLM"}, "LlamaForCausalLM has qk_norm=False"),
        ({"architecture": "Qwen2ForCausalLM", "qk_norm": False}, "qkv_bias=True"),
        ({"architecture": "Qwen2ForCausalLM", "qk_norm": False, "qkv_bias": True,
          "attention_bias": True}, "attention_bias=False"),
        ({"qkv_bias": True}, "Qwen3ForCausalLM has qkv_bias=False"),
        ({"mlp_bias": True}, "mlp_bias=False"),
    ],
)
def test_known_architectures_fix_their_layout(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)

