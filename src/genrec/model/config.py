"""Model configuration: one validated dataclass, read from and written to HF ``config.json``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from genrec.utils.strict import strict_from_dict

# Keys of an HF config.json that carry no meaning for inference (training, generation or
# bookkeeping settings). They are accepted on load and dropped.
_HF_IGNORED_KEYS = frozenset(
    {
        "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
        "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
        "attention_dropout", "max_window_layers", "pretraining_tp", "layer_types",
        "_name_or_path", "output_attentions", "output_hidden_states", "return_dict",
        "sliding_window", "use_sliding_window", "hidden_act", "rope_parameters", "rope_theta",
        "rope_scaling", "partial_rotary_factor", "id2label", "label2id", "problem_type",
        "chunk_size_feed_forward", "is_encoder_decoder", "tie_encoder_decoder",
        "add_cross_attention", "tokenizer_class", "prefix", "task_specific_params",
        "cross_attention_hidden_size", "finetuning_task", "decoder_start_token_id",
        "sep_token_id", "tf_legacy_loss", "use_bfloat16", "pruned_heads", "torchscript",
    }
)


@dataclass
class ModelConfig:
    """Shape and numerics of a Qwen3/Llama-style decoder.

    ``qk_norm`` distinguishes Qwen3 (RMSNorm on each head's queries and keys) from Llama.
    ``user_dim`` > 0 adds a soft-token projector (user vector -> hidden size), saved with the
    model. ``score_head`` adds a scalar score head read at a branch's last position.
    """

    architecture: str = "Qwen3ForCausalLM"
    vocab_size: int = 32768
    hidden_size: int = 512
    intermediate_size: int = 1536
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True
    user_dim: int = 0
    score_head: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.user_dim < 0:
            raise ValueError(f"user_dim must be >= 0, got {self.user_dim}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")

    @property
    def num_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from genrec's own keys; unknown keys are an error."""
        return strict_from_dict(cls, data, "config")

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` of a Qwen3 or Llama causal LM.

        Settings genrec cannot honour (sliding windows, rope scaling, other activations) are
        rejected rather than silently ignored.
        """
        data = dict(data)
        archs = data.get("architectures") or [_ARCH_BY_MODEL_TYPE.get(data.get("model_type"), "")]
        arch = archs[0]
        if data.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {data['hidden_act']!r} (only 'silu')")
        if data.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported")
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"unsupported rope type {rope_type!r} (only 'default')")
        theta = rope.get("rope_theta", data.get("rope_theta", 10000.0))
        genrec_keys = data.pop("genrec", {})
        kwargs: dict[str, Any] = {
            "architecture": arch,
            "rope_theta": float(theta),
            "qk_norm": arch.startswith("Qwen3"),
        }
        names = {f.name for f in dataclasses.fields(cls)} - {"architecture", "qk_norm"}
        unknown = []
        for key, value in data.items():
            if key in names:
                kwargs[key] = value
            elif key not in _HF_IGNORED_KEYS:
                unknown.append(key)
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        if kwargs.get("head_dim") is None:
            kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        kwargs.setdefault("num_key_value_heads", kwargs.get("num_attention_heads"))
        for key, value in genrec_keys.items():
            if key not in ("user_dim", "score_head"):
                raise ValueError(f"unknown genrec config key {key!r}")
            kwargs[key] = value
        return cls(**kwargs)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` transformers reads back (genrec-only fields under ``genrec``)."""
        model_type = "qwen3" if self.qk_norm else "llama"
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
        }
        if not self.qk_norm:
            out["mlp_bias"] = self.mlp_bias
        if self.user_dim or self.score_head:
            out["genrec"] = {"user_dim": self.user_dim, "score_head": self.score_head}
        return out


_ARCH_BY_MODEL_TYPE = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
