"""Rotary frequency scaling (HF ``rope_type``), computed exactly as transformers does.

A scaling is a plain dict (``ModelConfig.rope_scaling``): ``rope_type`` plus that type's
parameters, as in a ``config.json``'s ``rope_scaling`` / ``rope_parameters`` without
``rope_theta`` (a field of its own). ``None`` is the unscaled ("default") rotary embedding.

Supported: ``linear`` (all frequencies / factor), ``llama3`` (Llama 3.1+: low frequencies /
factor, high ones kept, a smooth blend between), ``yarn`` (per-dimension blend of interpolated
and extrapolated frequencies, and an attention factor multiplying cos and sin). ``dynamic``
(NTK) is refused: it rescales every token's frequencies by the batch's longest sequence, so a
candidate's score would depend on what it is batched with.

Frequencies are computed here in fp64 (transformers computes them in fp32; the results agree
to fp32 rounding) and rounded to fp32 once.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# rope_type -> (required parameters, optional parameters); rope_theta lives beside them.
# ``original_max_position_embeddings`` defaults to the model's max_position_embeddings (as
# transformers' standardize_rope_params does) and is then stored explicitly.
_PARAMETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "linear": (frozenset({"factor"}), frozenset()),
    "llama3": (
        frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
        frozenset({"original_max_position_embeddings"}),
    ),
    "yarn": (
        frozenset({"factor"}),
        frozenset({
            "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim", "truncate",
        }),
    ),
}
_NEEDS_ORIGINAL = ("llama3", "yarn")
_DYNAMIC_MESSAGE = (
    "rope type 'dynamic' (dynamic NTK scaling) is not supported: it rescales every token's "
    "frequencies by the longest sequence in the batch, so a candidate's score would depend on "
    "what it is batched with"
)


def _number(params: dict[str, Any], key: str, low: float, strict: bool = True) -> float:
    # a finite real number above ``low`` (at least ``low`` when not strict)
    value = params[key]
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > low if strict else value >= low))
    if not ok:
        bound = f"> {low}" if strict else f">= {low}"
        raise ValueError(f"rope parameter {key!r} must be a number {bound}, got {value!r}")
    return float(value)


def rope_scaling_params(
    raw: dict[str, Any] | None, max_position_embeddings: int | None
) -> dict[str, Any] | None:
    """The validated, canonical form of a rope scaling dict (``None`` for the default rope).

    Accepts HF's spellings (``rope_type`` or the legacy ``type``; ``rope_theta`` and
    ``partial_rotary_factor`` are read by the caller, see ``ModelConfig.from_hf_dict``).
    A missing ``original_max_position_embeddings`` becomes ``max_position_embeddings`` (left
    out when that is None: validation only). Unknown rope types and unknown parameters raise
    ``ValueError`` naming them. Idempotent: a canonical dict comes back equal.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"rope scaling must be a dict or null, got {raw!r}")
    params = dict(raw)
    legacy = params.pop("type", None)
    rope_type = params.pop("rope_type", legacy)
    if legacy is not None and legacy != rope_type:
        raise ValueError(f"rope scaling has rope_type {rope_type!r} but type {legacy!r}")
    rope_type = "default" if rope_type is None else rope_type
    if rope_type == "default":
        if params:
            raise ValueError(f"unknown rope parameters for rope type 'default': {sorted(params)}")
        return None
    if rope_type == "dynamic":
        raise ValueError(_DYNAMIC_MESSAGE)
    if rope_type not in _PARAMETERS:
        raise ValueError(
            f"unsupported rope type {rope_type!r} (supported: 'default', "
            f"{', '.join(repr(t) for t in _PARAMETERS)})"
        )
    required, optional = _PARAMETERS[rope_type]
    # an optional parameter given as null means "not set", as in transformers
    params = {k: v for k, v in params.items() if not (k in optional and v is None)}
    missing, unknown = sorted(required - set(params)), sorted(set(params) - required - optional)
    if missing or unknown:
        raise ValueError(
            f"rope type {rope_type!r}: missing parameters {missing}, unknown parameters {unknown}"
        )
    if rope_type in _NEEDS_ORIGINAL and max_position_embeddings is not None:
        params.setdefault("original_max_position_embeddings", max_position_embeddings)
    out: dict[str, Any] = {"rope_type": rope_type}
    for key in sorted(params):
        if key == "original_max_position_embeddings":
            value = params[key]
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"rope parameter {key!r} must be a positive integer, got {value!r}")
            out[key] = value
        elif key == "truncate":
            if not isinstance(params[key], bool):
                raise ValueError(f"rope parameter 'truncate' must be true or false, got "
                                 f"{params[key]!r}")
            out[key] = params[key]
        elif key == "factor":
            out[key] = _number(params, key, 1.0, strict=False)
        elif key in ("mscale", "mscale_all_dim"):
            out[key] = _number(params, key, 0.0, strict=False)
        else:  # low/high_freq_factor, attention_factor, beta_fast, beta_slow
            out[key] = _number(params, key, 0.0)
    if rope_type == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise ValueError("rope parameter 'high_freq_factor' must exceed 'low_freq_factor', got "
                         f"{out['high_freq_factor']} and {out['low_freq_factor']}")
    return out


def _llama3(inv: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    # transformers' _compute_llama3_parameters: wavelengths above original / low_freq_factor
    # are divided by factor, those below original / high_freq_factor kept, a blend between
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(inv: torch.Tensor, p: dict[str, Any], head_dim: int, theta: float) -> torch.Tensor:
    # transformers' _compute_yarn_parameters: dimensions below the correction range keep
    # their (extrapolated) frequency, those above it are interpolated (/ factor), a linear
    # ramp between
    factor, original = p["factor"], p["original_max_position_embeddings"]
    beta_fast, beta_slow = p.get("beta_fast", 32.0), p.get("beta_slow", 1.0)

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the extrapolation weight of each dimension
    return inv / factor * (1 - keep) + inv * keep


def inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """The rotary inverse frequencies [head_dim / 2] (fp64, CPU) of a canonical scaling."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv = 1.0 / theta**exponent
    rope_type = "default" if scaling is None else scaling["rope_type"]
    if rope_type == "linear":
        return inv / scaling["factor"]
    if rope_type == "llama3":
        return _llama3(inv, scaling)
    if rope_type == "yarn":
        return _yarn(inv, scaling, head_dim, theta)
    return inv


def attention_factor(scaling: dict[str, Any] | None) -> float:
    """The factor multiplying cos and sin (so q.k scales by its square): yarn's, else 1."""
    if scaling is None or scaling["rope_type"] != "yarn":
        return 1.0
    if "attention_factor" in scaling:
        return scaling["attention_factor"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor, m, m_all = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:  # as transformers: both set and non-zero
        return mscale(factor, m) / mscale(factor, m_all)
    return mscale(factor)
