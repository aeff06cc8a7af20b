"""Building blocks of the decoder: RMSNorm, rotary embeddings, SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight, computed in fp32 and cast back
    before the weight (as HF Qwen3/Llama do). ``weight`` broadcasts against x: [dim], or
    [heads, dim] for one call over several heads' slices with their own weights."""
    dtype = x.dtype
    if dtype == torch.float32 and not (torch.is_grad_enabled() and x.requires_grad):
        # Two passes over x (a fused norm reduction, then one scaling) instead of
        # F.rms_norm's four on the CPU (pow, mean, mul, mul): 30-40% faster from a few
        # hundred rows on; the in-place steps touch only the [..., 1] scale.
        scale = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        scale = scale.square_().mul_(1.0 / x.shape[-1]).add_(eps).rsqrt_()
        return (x * scale).mul_(weight)
    xf = x.float()
    ms = xf.square().mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(ms + eps)).to(dtype) * weight


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

    The frequencies are computed in fp32 at each forward (head_dim / 2 values), never stored
    in the model's dtype: a bf16 copy would make the angles drift with position.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
        return (1.0 / self.theta ** (exponent / self.head_dim)).float()

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [T] -> cos, signed sin: [T, 1, head_dim] (signed: -sin on the first half)."""
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        return (
            torch.cat((cos, cos), dim=-1).to(dtype)[:, None, :],
            torch.cat((-sin, sin), dim=-1).to(dtype)[:, None, :],
        )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = roll(x) * signed_sin.

    x: [T, heads, head_dim]; cos, signed_sin: [T, 1, head_dim].
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (+ residual)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        gate = linear(x, self.gate_proj, silu=True)
        return linear(linear(x, self.up_proj, mul=gate), self.down_proj, add=residual)


def _onednn_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype
        and x.dtype in (torch.float32, torch.bfloat16)
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and torch.backends.mkldnn.is_available()
    )


def _packed(owner: nn.Module, layers: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    # oneDNN-blocked copy of the concatenated weights (and biases), rebuilt whenever a weight
    # changes: in-place updates bump ``_version``, moves change ``data_ptr``.
    key = tuple(
        (p.data_ptr(), p._version, p.dtype)
        for layer in layers for p in (layer.weight, layer.bias) if p is not None
    )
    cached = owner.__dict__.get("_genrec_packed")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            weight = torch.cat([layer.weight for layer in layers]).detach()
            bias = None
            if any(layer.bias is not None for layer in layers):
                bias = torch.cat([
                    layer.bias if layer.bias is not None else weight.new_zeros(layer.out_features)
                    for layer in layers
                ]).detach()
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight, None), bias)
        owner.__dict__["_genrec_packed"] = cached
    return cached[1], cached[2]


def fused_linear(owner: nn.Module, x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor:
    """The outputs of several linear layers over one input, concatenated on the last dim.

    On the CPU at inference the weights are packed once for oneDNN (about twice torch's default
    fp32 matmul speed here) and run as one product; otherwise plain ``F.linear`` per layer
    (training, other devices). ``owner`` holds the packed copy.
    """
    if not _onednn_ok(x, layers[0].weight):
        outs = [F.linear(x, layer.weight, layer.bias) for layer in layers]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    weight, bias = _packed(owner, layers)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear(
    x: torch.Tensor, layer: nn.Linear, *, silu: bool = False,
    mul: torch.Tensor | None = None, add: torch.Tensor | None = None,
) -> torch.Tensor:
    """``layer(x)``, optionally followed by SiLU, ``* mul`` or ``+ add`` in the same pass.

    x: [N, in] -> [N, out]. The epilogue is fused into the oneDNN product at CPU inference.
    """
    if not _onednn_ok(x, layer.weight):
        y = F.linear(x, layer.weight, layer.bias)
        y = F.silu(y) if silu else y
        y = y * mul if mul is not None else y
        return y + add if add is not None else y
    weight, bias = _packed(layer, (layer,))
    if mul is not None and not silu and add is None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, mul, weight, bias, "mul")
    if add is not None and not silu and mul is None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, add, weight, bias, "add")
    y = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "swish" if silu else "none", [], "")
    if mul is not None:
        y = y.mul_(mul)
    return y.add_(add) if add is not None else y
