"""Out-of-tree architectures register without editing genrec."""

from __future__ import annotations

import pytest

from genrec.model import (
    DecoderLM,
    ModelConfig,
    build_model,
    register_architecture,
    registered_architectures,
)


class MyDecoder(DecoderLM):
    pass


def test_register_and_build() -> None:
    register_architecture("MyDecoderForCausalLM", MyDecoder)
    assert "MyDecoderForCausalLM" in registered_architectures()
    model = build_model(ModelConfig(architecture="MyDecoderForCausalLM", hidden_size=32,
                                    intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    assert isinstance(model, MyDecoder)


def test_unknown_architecture() -> None:
    with pytest.raises(ValueError, match="unknown architecture 'Nope'"):
        build_model(ModelConfig(architecture="Nope"))
