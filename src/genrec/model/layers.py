"""Building blocks of the decoder: RMSNorm, rotary embeddings, SwiGLU MLP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from genrec.model import rope
from genrec.model.native_gemm import pack_weight
from genrec.utils.cpu import bf16_products_native


def _in_place(*xs: torch.Tensor) -> bool:
    # in-place steps are safe unless autograd records them
    return not (torch.is_grad_enabled() and any(x.requires_grad for x in xs))


def mean_square(x: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """mean(x^2 over the last dim) + eps in fp32: [..., 1]. ``eps`` may be a tensor
    broadcasting against [..., 1] (a per-row epsilon)."""
    # one fused reduction pass over x (torch's pow + mean would take two)
    ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    if _in_place(x) and not (isinstance(eps, torch.Tensor) and eps.requires_grad):
        return ms.square_().mul_(1.0 / x.shape[-1]).add_(eps)
    return ms.square() / x.shape[-1] + eps


def inv_rms(x: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """1 / sqrt(mean(x^2 over the last dim) + eps) in fp32: [..., 1] (see :func:`mean_square`)."""
    ms = mean_square(x, eps)
    return ms.rsqrt_() if _in_place(ms) else ms.rsqrt()


def scale_rows(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * scale (scale [..., 1], fp32), computed in fp32 and cast to x's dtype."""
    if x.dtype == torch.float32:
        return x * scale
    return (x.float() * scale).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight, computed in fp32 and cast back
    before the weight (as HF Qwen3/Llama do). ``weight`` broadcasts against x."""
    y = scale_rows(x, inv_rms(x, eps))
    return y.mul_(weight) if _in_place(y, weight) else y * weight


def norm_rotary(
    x: torch.Tensor, weight: torch.Tensor | None, scale: torch.Tensor | None,
    cos: torch.Tensor, signed_sin: torch.Tensor,
) -> torch.Tensor:
    """rotary(x * scale * weight): a head norm's scaling and weight, then the rotary
    embedding (rotate-half convention), in three passes over x.

    x: [T, heads, head_dim]; weight: [head_dim], [heads, head_dim] or None; scale:
    [T, heads, 1] or None; cos, signed_sin: [T, 1, head_dim] (signed: -sin on the first
    half, see ``Rotary``).
    The weight is folded into the [T, 1, head_dim] factors:
    out_lo = x_lo * w_lo cos - x_hi * w_hi sin, out_hi = x_hi * w_hi cos + x_lo * w_lo sin.
    """
    half = x.shape[-1] // 2
    cw, sw = cos, signed_sin
    if weight is not None:
        cw, sw = cos * weight, signed_sin * weight.roll(half, dims=-1)
    lo, hi = x[..., :half], x[..., half:]
    if not _in_place(*(t for t in (x, cw, sw, scale) if t is not None)):
        out = torch.cat((lo * cw[..., :half] + hi * sw[..., :half],
                         hi * cw[..., half:] + lo * sw[..., half:]), dim=-1)
        return out if scale is None else (out * scale).to(x.dtype)
    out = x * cw
    out[..., :half].addcmul_(hi, sw[..., :half])
    out[..., half:].addcmul_(lo, sw[..., half:])
    return out if scale is None else out.mul_(scale)


class RMSNorm(nn.Module):
    """Root-mean-square norm (see :func:`rms_norm`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rotary(nn.Module):
    """Rotary position embedding for explicit integer positions (rotate-half convention).

    ``scaling``: a canonical rope scaling (``ModelConfig.rope_scaling``, see
    :mod:`genrec.model.rope`) or None. The frequencies are computed once in fp64, rounded to
    fp32, and never stored in the model's dtype: a bf16 copy would make the angles drift with
    position. A token's angles depend on its position alone (no batch-dependent scaling).
    """

    def __init__(self, head_dim: int, theta: float,
                 scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        with torch.inference_mode(False):  # normal tensors, usable under autograd too
            self._inv_freq = rope.inv_freq(head_dim, theta, scaling).float()
        self._on_device: dict[torch.device, torch.Tensor] = {}  # copies, no module state
        self.attention_factor = rope.attention_factor(scaling)

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """The inverse frequencies [head_dim / 2], fp32 on ``device`` (copied there once)."""
        cached = self._on_device.get(device)
        if cached is None:
            with torch.inference_mode(False):
                cached = self._on_device[device] = self._inv_freq.to(device)
        return cached

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [T] -> cos, signed sin: [T, 1, head_dim] (signed: -sin on the first half),
        both times the scaling's attention factor (yarn), as transformers applies it."""
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return (
            torch.cat((cos, cos), dim=-1).to(dtype)[:, None, :],
            torch.cat((-sin, sin), dim=-1).to(dtype)[:, None, :],
        )


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (+ residual)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None,
        in_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``in_scale`` [hidden]: multiplies x's columns, folded into gate and up weights."""
        # the intermediate stays in the compute dtype (fp32 for bf16 on CPUs without bf16)
        inner = compute_dtype(self.gate_proj.weight)
        if onednn_inference(x, self.gate_proj.weight):
            # gate and up as one packed product (the copy the native layers read too)
            gate, up = fused_linear(self, x, self.gate_proj, self.up_proj, in_scale=in_scale,
                                    out_dtype=inner).chunk(2, dim=-1)
            up = up * F.silu(gate)
        else:
            gate = linear(x, self.gate_proj, silu=True, in_scale=in_scale, out_dtype=inner)
            up = linear(x, self.up_proj, mul=gate, in_scale=in_scale, out_dtype=inner)
        return linear(up, self.down_proj, add=residual, out_dtype=x.dtype)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype genrec computes products of ``x`` (an activation or a weight) in: bf16 on a
    CPU without bf16 instructions runs in fp32 (inputs widen exactly and bf16 products
    accumulate in fp32 anyway; oneDNN would widen them too, about 5x slower); a layer's
    result is rounded back to bf16 (the residual stream and KV cache stay bf16).
    ``GENREC_BF16_COMPUTE`` overrides the choice (see :mod:`genrec.utils.cpu`)."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not bf16_products_native():
        return torch.float32
    return x.dtype


def onednn_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` runs as a oneDNN product with a packed weight (CPU inference
    in fp32 or bf16, no autograd); x may be the fp32 result of a bf16 layer computed in fp32
    (see :func:`compute_dtype`)."""
    return (
        x.device.type == "cpu"
        and (x.dtype == weight.dtype or x.dtype == compute_dtype(weight))
        and x.dtype in (torch.float32, torch.bfloat16)
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and torch.backends.mkldnn.is_available()
    )


def _weight(layer: nn.Linear, in_scale: torch.Tensor | None) -> torch.Tensor:
    # W diag(in_scale): W (x * in_scale) == (W diag(in_scale)) x
    return layer.weight if in_scale is None else layer.weight * in_scale


def derived(
    owner: nn.Module, slot: object, params: list[torch.Tensor],
    build: Callable[[], tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, ...]:
    """``build()``, kept in ``owner`` under ``slot`` for inference and rebuilt whenever one of
    ``params`` changes (in-place updates bump ``_version``, moves change ``data_ptr``; an
    inference tensor has no version, so only a move is seen). Under autograd with a parameter
    that requires grad it is built afresh (the graph of this call)."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return build()
    # inference tensors (a model loaded under torch.inference_mode) keep no version counter
    key = tuple((p.data_ptr(), -1 if p.is_inference() else p._version, p.dtype)
                for p in params)
    store = owner.__dict__.setdefault("_genrec_derived", {})
    cached = store.get(slot)
    if cached is None or cached[0] != key:
        cached = store[slot] = (key, build())
    return cached[1]


def packed_linear(
    owner: nn.Module, layers: tuple[nn.Linear, ...], in_scale: torch.Tensor | None,
    dtype: torch.dtype, form: str = "onednn",
) -> tuple[torch.Tensor, ...]:
    """The packed weight (and bias, or None) in ``dtype`` of ``layers`` concatenated on
    their outputs, with ``in_scale`` ([in] or None) folded in: kept in ``owner``, one per
    combination of layers it runs (q, k, v fused, or k, v and q apart) and ``form``
    (oneDNN's blocked weight, or MKL's packed GEMM for the native kernels: see
    :mod:`genrec.model.native_gemm`)."""
    def build() -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            weight = torch.cat([_weight(layer, in_scale).to(dtype) for layer in layers])
            bias = None
            if any(layer.bias is not None for layer in layers):
                bias = torch.cat([
                    layer.bias.to(dtype) if layer.bias is not None
                    else weight.new_zeros(layer.out_features) for layer in layers
                ])
            return pack_weight(weight, form), bias

    params = [p for layer in layers for p in (layer.weight, layer.bias, in_scale)
              if p is not None]
    return derived(owner, ("packed", dtype, form, *(id(layer) for layer in layers)), params,
                   build)


def fused_linear(
    owner: nn.Module, x: torch.Tensor, *layers: nn.Linear, in_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The outputs of several linear layers over ``x * in_scale`` (in_scale: [in] or None),
    concatenated on the last dim, in ``out_dtype`` (default: x's).

    On the CPU at inference the weights are packed once for oneDNN (about twice torch's default
    fp32 matmul speed here), with ``in_scale`` folded in, and run as one product; otherwise
    plain ``F.linear`` per layer (training, other devices). ``owner`` holds the packed copy.
    """
    if not onednn_inference(x, layers[0].weight):
        outs = [F.linear(x, _weight(layer, in_scale), layer.bias) for layer in layers]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    dtype = compute_dtype(layers[0].weight)
    weight, bias = packed_linear(owner, layers, in_scale, dtype)
    y = torch.ops.mkldnn._linear_pointwise(x.to(dtype), weight, bias, "none", [], "")
    return y.to(out_dtype or x.dtype)


def linear(
    x: torch.Tensor, layer: nn.Linear, *, silu: bool = False,
    mul: torch.Tensor | None = None, add: torch.Tensor | None = None,
    in_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``layer(x * in_scale)``, optionally followed by SiLU, ``* mul`` or ``+ add`` in the same
    pass, in ``out_dtype`` (default: x's).

    x: [N, in] -> [N, out]; in_scale: [in] or None, folded into the weight. The epilogue is
    fused into the oneDNN product at CPU inference.
    """
    out_dtype = out_dtype or x.dtype
    if not onednn_inference(x, layer.weight):
        y = F.linear(x.to(layer.weight.dtype), _weight(layer, in_scale), layer.bias)
        y = F.silu(y) if silu else y
        y = y * mul if mul is not None else y
        return (y + add if add is not None else y).to(out_dtype)
    dtype = compute_dtype(layer.weight)
    weight, bias = packed_linear(layer, (layer,), in_scale, dtype)
    x, mul, add = (None if t is None else t.to(dtype) for t in (x, mul, add))
    if mul is not None and not silu and add is None:
        y = torch.ops.mkldnn._linear_pointwise.binary(x, mul, weight, bias, "mul")
    elif add is not None and not silu and mul is None:
        y = torch.ops.mkldnn._linear_pointwise.binary(x, add, weight, bias, "add")
    else:
        y = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "swish" if silu else "none",
                                               [], "")
        if mul is not None:
            y = y.mul_(mul)
        if add is not None:
            y = y.add_(add)
    return y.to(out_dtype)
