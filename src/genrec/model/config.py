"""Model configuration: one validated dataclass, read from and written to HF ``config.json``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from genrec.model.hf_config import fields_from_hf, hf_from_fields, layout_fields
from genrec.model.rope import rope_scaling_params
from genrec.utils.strict import strict_from_dict


@dataclass
class ModelConfig:
    """Shape and numerics of a Qwen3 / Qwen2 / Llama-style decoder.

    ``qk_norm``: RMSNorm on each head's queries and keys (Qwen3). ``attention_bias``: biases
    on the q, k, v and o projections (Llama's and Qwen3's ``attention_bias``); ``qkv_bias``:
    biases on q, k and v only (Qwen2). Known architectures fix ``qk_norm`` and ``qkv_bias``
    (``validate`` checks them), so ``to_hf_dict`` always says what transformers builds.
    ``rope_scaling``: ``None`` (plain rotary) or a dict of ``rope_type`` ('linear', 'llama3',
    'yarn') and its parameters, as in HF's ``rope_scaling`` (see :mod:`genrec.model.rope`).
    ``user_dim`` > 0 adds a soft-token projector (user vector -> hidden size), saved with the
    model. ``score_head`` adds a scalar score head read at a branch's last position.
    ``sid_normalize``: how a Semantic-ID level's log-probabilities are normalised in training
    and beam search: ``"full"`` (softmax over the whole vocabulary) or ``"level"`` (softmax over
    that level's codes only: a text vocabulary's rows are never computed).
    ``item_head`` > 0 adds a dense item head over that many catalog items (one embedding per
    item, scored against the hidden state that predicts an item's first Semantic ID; see
    :mod:`genrec.model.item_head`). ``item_inputs`` > 0 (the number of Semantic-ID levels;
    needs ``item_head``) also adds each item's head embedding to the input at its last
    Semantic-ID token, tied as in SASRec. ``item_compose`` (needs ``item_inputs``): each item's
    head vector is its own row plus the sum of its Semantic-ID tokens' input embeddings.
    ``history_bias`` (needs ``item_head``): a learned scalar added to the head's logit of every
    item already in the user's history (what the data says of taking an item again).
    ``item_dim`` (needs ``item_head``; 0: the hidden size): the size of each item's head row,
    projected to the hidden size by one shared matrix when smaller.
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
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True
    user_dim: int = 0
    score_head: bool = False
    sid_normalize: str = "full"
    item_head: int = 0
    item_inputs: int = 0
    item_compose: bool = False
    history_bias: bool = False
    item_dim: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; ``rope_scaling`` is brought to its canonical form."""
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
        if not isinstance(self.item_head, int) or self.item_head < 0:
            raise ValueError(f"item_head must be an integer >= 0, got {self.item_head!r}")
        if not isinstance(self.item_inputs, int) or self.item_inputs < 0:
            raise ValueError(f"item_inputs must be an integer >= 0, got {self.item_inputs!r}")
        if self.item_inputs and not self.item_head:
            raise ValueError("item_inputs needs an item head (item_head > 0)")
        if not isinstance(self.item_compose, bool):
            raise ValueError(f"item_compose must be true or false, got {self.item_compose!r}")
        if self.item_compose and not self.item_inputs:
            raise ValueError("item_compose needs the items' Semantic IDs (item_inputs > 0)")
        if not isinstance(self.history_bias, bool):
            raise ValueError(f"history_bias must be true or false, got {self.history_bias!r}")
        if self.history_bias and not self.item_head:
            raise ValueError("history_bias needs an item head (item_head > 0)")
        if not isinstance(self.item_dim, int) or isinstance(self.item_dim, bool) \
                or not 0 <= self.item_dim <= self.hidden_size:
            raise ValueError(f"item_dim must be an integer in [0, hidden_size], got "
                             f"{self.item_dim!r}")
        if self.item_dim and not self.item_head:
            raise ValueError("item_dim needs an item head (item_head > 0)")
        if self.sid_normalize not in ("full", "level"):
            raise ValueError(f"sid_normalize must be 'full' or 'level', got {self.sid_normalize!r}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        self.rope_scaling = rope_scaling_params(self.rope_scaling, self.max_position_embeddings)
        fixed = layout_fields(self.architecture)
        for name, value in (fixed or {}).items():
            if getattr(self, name) != value:
                raise ValueError(f"{self.architecture} has {name}={value}, got "
                                 f"{getattr(self, name)}")

    @property
    def num_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from genrec's own keys; unknown keys are an error."""
        return strict_from_dict(cls, data, "config")

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` of a Qwen3, Qwen2 or Llama causal LM.

        Every key is used, ignored because it cannot change what genrec computes, or refused
        with a message naming it: settings genrec cannot honour (sliding windows, dynamic or
        unknown rope scaling, other activations, ...) are never silently ignored. Rope
        settings come from ``rope_scaling`` (+ ``rope_theta``) or transformers 5's
        ``rope_parameters``; a missing ``head_dim`` is hidden_size / num_attention_heads.
        """
        return cls(**fields_from_hf(data, [f.name for f in dataclasses.fields(cls)]))

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` transformers reads back (genrec-only fields under ``genrec``)."""
        return hf_from_fields(self)
