"""Model configuration: one validated dataclass, read from and written to HF ``config.json``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from genrec.model.rope import rope_scaling_params
from genrec.utils.strict import strict_from_dict

# Keys of an HF config.json that carry no meaning for inference (training, generation or
# bookkeeping settings). They are accepted on load and dropped. ``sliding_window`` and
# ``max_window_layers`` only act with ``use_sliding_window`` (refused when true).
_HF_IGNORED_KEYS = frozenset(
    {
        "transformers_version", "dtype", "torch_dtype",
        "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
        "attention_dropout", "max_window_layers", "sliding_window",
        "_name_or_path", "output_attentions", "output_hidden_states", "return_dict",
        "id2label", "label2id", "problem_type",
        "chunk_size_feed_forward", "is_encoder_decoder", "tie_encoder_decoder",
        "add_cross_attention", "tokenizer_class", "prefix", "task_specific_params",
        "cross_attention_hidden_size", "finetuning_task", "decoder_start_token_id",
        "sep_token_id", "tf_legacy_loss", "use_bfloat16", "pruned_heads", "torchscript",
    }
)
# Keys accepted only at the value that changes nothing genrec computes (or null), with why
# another value is refused.
_HF_FIXED_KEYS: dict[str, tuple[Any, str]] = {
    "hidden_act": ("silu", "only SiLU (SwiGLU) MLPs are supported"),
    "use_sliding_window": (False, "sliding-window attention is not supported"),
    "use_mrope": (False, "multimodal rotary embeddings (mrope) are not supported"),
    "pretraining_tp": (1, "tensor-parallel pretraining slices (pretraining_tp > 1) are not "
                          "supported"),
    "partial_rotary_factor": (1.0, "partial rotary embeddings are not supported"),
}


@dataclass(frozen=True)
class _Layout:
    """What an HF architecture fixes: its ``model_type``, q/k head norms, q/k/v biases that
    do not follow ``attention_bias`` (Qwen2), and which bias switches its config honours."""

    model_type: str
    qk_norm: bool
    qkv_bias: bool
    bias_keys: frozenset[str]


_LAYOUTS = {
    "Qwen3ForCausalLM": _Layout("qwen3", True, False, frozenset({"attention_bias"})),
    # Qwen2: q, k, v always biased, o_proj never (transformers' Qwen2Attention)
    "Qwen2ForCausalLM": _Layout("qwen2", False, True, frozenset()),
    "LlamaForCausalLM": _Layout("llama", False, False,
                                frozenset({"attention_bias", "mlp_bias"})),
}
_ARCH_BY_MODEL_TYPE = {layout.model_type: arch for arch, layout in _LAYOUTS.items()}


# genrec's own config keys, under "genrec" in config.json
_GENREC_KEYS = ("user_dim", "score_head", "sid_normalize", "item_head", "item_inputs",
                "item_compose", "history_bias")


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
        if self.sid_normalize not in ("full", "level"):
            raise ValueError(f"sid_normalize must be 'full' or 'level', got {self.sid_normalize!r}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        self.rope_scaling = rope_scaling_params(self.rope_scaling, self.max_position_embeddings)
        layout = _LAYOUTS.get(self.architecture)
        if layout is None:
            return
        fixed = {"qk_norm": layout.qk_norm, "qkv_bias": layout.qkv_bias}
        fixed.update({k: False for k in ("attention_bias", "mlp_bias")
                      if k not in layout.bias_keys})
        for name, value in fixed.items():
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
        data = dict(data)
        genrec_keys = data.pop("genrec", {})
        arch, layout = _hf_layout(data)
        _check_fixed_keys(data)
        for key in ("attention_bias", "mlp_bias"):
            if key not in layout.bias_keys and data.pop(key, False):
                raise ValueError(f"{key}=true is not part of the {arch} layout "
                                 "(transformers ignores it)")
        theta, scaling = _hf_rope(data)
        layer_types = data.pop("layer_types", None)
        kwargs: dict[str, Any] = {
            "architecture": arch, "rope_theta": theta, "rope_scaling": scaling,
            "qk_norm": layout.qk_norm, "qkv_bias": layout.qkv_bias,
        }
        names = {f.name for f in dataclasses.fields(cls)} - set(kwargs) - set(_GENREC_KEYS)
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
        if kwargs.get("num_key_value_heads") is None:  # absent or null: multi-head attention
            kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads")
        _check_layer_types(layer_types, kwargs.get("num_hidden_layers"))
        for key, value in genrec_keys.items():
            if key not in _GENREC_KEYS:
                raise ValueError(f"unknown genrec config key {key!r}")
            kwargs[key] = value
        return cls(**kwargs)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` transformers reads back (genrec-only fields under ``genrec``)."""
        layout = _LAYOUTS.get(self.architecture) or _layout_like(self)
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": layout.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta,
                                **(self.rope_scaling or {"rope_type": "default"})},
            # the same for transformers 4.x readers (they know no rope_parameters)
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
        }
        for key in sorted(layout.bias_keys):
            out[key] = getattr(self, key)
        if self.user_dim or self.score_head:
            out["genrec"] = {"user_dim": self.user_dim, "score_head": self.score_head}
        if self.sid_normalize != "full":
            out.setdefault("genrec", {})["sid_normalize"] = self.sid_normalize
        if self.item_head:
            out.setdefault("genrec", {})["item_head"] = self.item_head
        if self.item_inputs:
            out.setdefault("genrec", {})["item_inputs"] = self.item_inputs
        if self.item_compose:
            out.setdefault("genrec", {})["item_compose"] = True
        if self.history_bias:
            out.setdefault("genrec", {})["history_bias"] = True
        return out


def _hf_layout(data: dict[str, Any]) -> tuple[str, _Layout]:
    # (architecture, layout) of an HF config; pops architectures and model_type
    model_type = data.pop("model_type", None)
    archs = data.pop("architectures", None) or [_ARCH_BY_MODEL_TYPE.get(model_type, "")]
    arch = archs[0]
    layout = _LAYOUTS.get(arch)
    if layout is not None:
        if model_type is not None and model_type != layout.model_type:
            raise ValueError(f"architecture {arch!r} has model_type {layout.model_type!r}, "
                             f"config says {model_type!r}")
        return arch, layout
    # an out-of-tree architecture (register_architecture): the layout of its model_type
    known = _ARCH_BY_MODEL_TYPE.get(model_type) or (
        "Qwen3ForCausalLM" if arch.startswith("Qwen3") else "LlamaForCausalLM")
    return arch, _LAYOUTS[known]


def _layout_like(cfg: ModelConfig) -> _Layout:
    # an out-of-tree architecture is written as the known layout with its q/k norm and biases
    for layout in _LAYOUTS.values():
        if (layout.qk_norm, layout.qkv_bias) == (cfg.qk_norm, cfg.qkv_bias) and all(
            key in layout.bias_keys or not getattr(cfg, key)
            for key in ("attention_bias", "mlp_bias")
        ):
            return layout
    raise ValueError(f"{cfg.architecture}: no HF layout has qk_norm={cfg.qk_norm}, "
                     f"qkv_bias={cfg.qkv_bias}, attention_bias={cfg.attention_bias}, "
                     f"mlp_bias={cfg.mlp_bias}")


def _check_fixed_keys(data: dict[str, Any]) -> None:
    # pops the keys of _HF_FIXED_KEYS, refusing any value but the inert one
    for key, (inert, why) in _HF_FIXED_KEYS.items():
        value = data.pop(key, None)
        if value is not None and value != inert:
            raise ValueError(f"config key {key!r} is {value!r}: {why}")


def _check_layer_types(layer_types: Any, num_layers: Any) -> None:
    if layer_types is None:
        return
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(f"config key 'layer_types' must list one type per layer "
                         f"({num_layers}), got {layer_types!r}")
    others = sorted({t for t in layer_types if t != "full_attention"}, key=str)
    if others:
        raise ValueError(f"config key 'layer_types': only 'full_attention' layers are "
                         f"supported, got {others}")


def _hf_rope(data: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # (rope_theta, raw scaling dict or None) from rope_scaling / rope_parameters / rope_theta;
    # pops them. transformers 5 keeps rope_theta inside rope_parameters.
    sources = {k: dict(data.pop(k) or {}) for k in ("rope_scaling", "rope_parameters")
               if k in data}
    top_theta = data.pop("rope_theta", None)
    thetas = {k: v.pop("rope_theta") for k, v in sources.items() if "rope_theta" in v}
    if top_theta is not None:
        thetas["rope_theta"] = top_theta
    given = {k: v for k, v in sources.items() if v}
    if len(given) == 2 and given["rope_scaling"] != given["rope_parameters"]:
        raise ValueError(f"config keys 'rope_scaling' {given['rope_scaling']} and "
                         f"'rope_parameters' {given['rope_parameters']} disagree")
    if len({float(t) for t in thetas.values()}) > 1:
        raise ValueError(f"rope_theta is given differently: {thetas}")
    source, rope = next(iter(given.items()), ("rope_scaling", {}))
    partial = rope.pop("partial_rotary_factor", None)
    if partial is not None and partial != 1.0:
        raise ValueError(f"config key {source!r}: partial_rotary_factor {partial!r}, partial "
                         "rotary embeddings are not supported")
    try:  # checked here to name the key; ModelConfig builds the canonical form
        rope_scaling_params(rope or None, None)
    except ValueError as e:
        raise ValueError(f"config key {source!r}: {e}") from None
    theta = next(iter(thetas.values()), 10000.0)
    return float(theta), rope or None
