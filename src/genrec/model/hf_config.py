"""A Hugging Face ``config.json`` read into :class:`genrec.model.config.ModelConfig`'s fields and
written back from them: which keys mean something, which are ignored, which are refused."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from genrec.model.rope import rope_scaling_params

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
                "item_compose", "history_bias", "item_dim")


def layout_fields(architecture: str) -> dict[str, bool] | None:
    """The fields a known HF architecture fixes (q/k norm, biases), or ``None`` for one
    genrec does not know (registered out of tree)."""
    layout = _LAYOUTS.get(architecture)
    if layout is None:
        return None
    fixed = {"qk_norm": layout.qk_norm, "qkv_bias": layout.qkv_bias}
    fixed.update({k: False for k in ("attention_bias", "mlp_bias") if k not in layout.bias_keys})
    return fixed


def fields_from_hf(data: dict[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """The config fields (of the names ``fields``) an HF ``config.json`` dict gives; see
    :meth:`ModelConfig.from_hf_dict` for what is used, ignored and refused."""
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
    names = set(fields) - set(kwargs) - set(_GENREC_KEYS)
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
    return kwargs


def hf_from_fields(cfg: Any) -> dict[str, Any]:
    """The ``config.json`` transformers reads back from a ``ModelConfig`` (genrec-only fields
    under ``genrec``)."""
    layout = _LAYOUTS.get(cfg.architecture) or _layout_like(cfg)
    out: dict[str, Any] = {
        "architectures": [cfg.architecture],
        "model_type": layout.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": {"rope_theta": cfg.rope_theta,
                            **(cfg.rope_scaling or {"rope_type": "default"})},
        # the same for transformers 4.x readers (they know no rope_parameters)
        "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
    }
    for key in sorted(layout.bias_keys):
        out[key] = getattr(cfg, key)
    if cfg.user_dim or cfg.score_head:
        out["genrec"] = {"user_dim": cfg.user_dim, "score_head": cfg.score_head}
    if cfg.sid_normalize != "full":
        out.setdefault("genrec", {})["sid_normalize"] = cfg.sid_normalize
    if cfg.item_head:
        out.setdefault("genrec", {})["item_head"] = cfg.item_head
    if cfg.item_inputs:
        out.setdefault("genrec", {})["item_inputs"] = cfg.item_inputs
    if cfg.item_compose:
        out.setdefault("genrec", {})["item_compose"] = True
    if cfg.history_bias:
        out.setdefault("genrec", {})["history_bias"] = True
    if cfg.item_dim:
        out.setdefault("genrec", {})["item_dim"] = cfg.item_dim
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


def _layout_like(cfg: Any) -> _Layout:
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
