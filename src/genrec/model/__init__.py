"""Decoder models, their configuration, checkpoints and attention layout."""

from genrec.model.checkpoint import load_model, save_model
from genrec.model.config import ModelConfig
from genrec.model.decoder import DecoderLM
from genrec.model.layout import AttentionLayout, build_layout
from genrec.model.registry import build_model, register_architecture, registered_architectures

register_architecture("Qwen3ForCausalLM", DecoderLM)
register_architecture("Qwen2ForCausalLM", DecoderLM)
register_architecture("LlamaForCausalLM", DecoderLM)

__all__ = [
    "AttentionLayout", "DecoderLM", "ModelConfig", "build_layout", "build_model", "load_model",
    "register_architecture", "registered_architectures", "save_model",
]
