"""Decoder building blocks: norms, the fused head-norm + rotary, linear layers with a folded
input scale, in inference (in-place, oneDNN) and autograd modes alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from genrec.model import layers
from genrec.model.layers import Rotary, SwiGLU, fused_linear, inv_rms, linear, norm_rotary, rms_norm
from genrec.utils.cpu import detect_cpu

pytestmark = pytest.mark.numerics


def _rotate_half_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    # HF's formulation: x * cos + rotate_half(x) * sin
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = positions.double()[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None].float(), emb.sin()[:, None].float()
    rot = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * cos + rot * sin


@pytest.mark.parametrize("grad", [False, True])
def test_norm_rotary_equals_norm_then_rotary(grad: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 3, 16) * 3
    weight = torch.rand(16) + 0.5
    positions = torch.tensor([0, 1, 2, 5, 9, 100, 300])
    rope = Rotary(16, 10000.0).cos_sin(positions, torch.float32)
    ref = _rotate_half_reference(rms_norm(x, weight, 1e-6), positions, 10000.0)
    if grad:
        x.requires_grad_(True)
        weight.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        out = norm_rotary(x, weight, inv_rms(x, 1e-6), *rope)
    assert (out - ref).abs().max().item() < 1e-5
    plain = norm_rotary(x.detach(), None, None, *rope)
    assert (plain - _rotate_half_reference(x.detach(), positions, 10000.0)).abs().max() < 1e-5
    if grad:
        out.square().sum().backward()
        assert x.grad is not None and weight.grad is not None


def test_inv_rms_takes_a_per_row_epsilon() -> None:
    x = torch.randn(5, 2, 8)
    eps = torch.rand(5, 1, 1)
    ref = 1 / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
    assert torch.allclose(inv_rms(x, eps), ref, atol=1e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_in_scale_is_folded_into_the_weights(grad: bool) -> None:
    torch.manual_seed(1)
    a, b = nn.Linear(12, 5), nn.Linear(12, 3, bias=False)
    owner = nn.Module()
    x, scale = torch.randn(9, 12), torch.rand(12) + 0.5
    ref = torch.cat([a(x * scale), b(x * scale)], dim=-1)
    with torch.set_grad_enabled(grad):
        got = fused_linear(owner, x, a, b, in_scale=scale)
        assert (got - ref).abs().max().item() < 1e-5
        assert (linear(x, a, in_scale=scale) - a(x * scale)).abs().max().item() < 1e-5
    with torch.no_grad():  # the packed copy follows an in-place change of the scale
        scale.mul_(2)
        again = fused_linear(owner, x, a, b, in_scale=scale)
        assert (again - torch.cat([a(x * scale), b(x * scale)], -1)).abs().max().item() < 1e-5


def test_swiglu_in_scale_matches_scaled_input() -> None:
    torch.manual_seed(2)
    mlp = SwiGLU(8, 16, bias=False)
    x, scale, res = torch.randn(4, 8), torch.rand(8) + 0.5, torch.randn(4, 8)
    with torch.no_grad():
        ref = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x * scale))
                            * mlp.up_proj(x * scale)) + res
        assert (mlp(x, residual=res, in_scale=scale) - ref).abs().max().item() < 1e-5


def test_bf16_products_in_fp32_where_the_cpu_lacks_bf16(
    monkeypatch: pytest.MonkeyPatch, cpu_isa
) -> None:
    # bf16 inputs widen exactly, the product accumulates in fp32, the result rounds to bf16
    cpu_isa("avx512")  # AVX-512 without bf16 instructions: oneDNN could, genrec widens
    torch.manual_seed(5)
    lin = nn.Linear(48, 40, bias=True).to(torch.bfloat16).requires_grad_(False)
    x, res = torch.randn(30, 48).to(torch.bfloat16), torch.randn(30, 40).to(torch.bfloat16)
    assert layers.compute_dtype(x) == torch.float32
    with torch.inference_mode():
        y = linear(x, lin, add=res)
        inner = linear(x, lin, silu=True, out_dtype=torch.float32)
    ref = F.linear(x.float(), lin.weight.float(), lin.bias.float()) + res.float()
    assert y.dtype == torch.bfloat16 and inner.dtype == torch.float32
    assert (y.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    assert (y.float() - ref.to(torch.bfloat16).float()).abs().max().item() < 0.02
    silu = F.silu(F.linear(x.float(), lin.weight.float(), lin.bias.float()))
    assert (inner - silu).abs().max().item() < 1e-4
    monkeypatch.setenv("GENREC_BF16_COMPUTE", "native")
    # forced bf16 products where oneDNN has them (AVX-512 hosts), else a warned fallback
    native = detect_cpu().onednn_bf16
    assert layers.compute_dtype(x) == (torch.bfloat16 if native else torch.float32)
    cpu_isa("avx2")  # oneDNN has no bf16 path there: the forced setting falls back
    assert layers.compute_dtype(x) == torch.float32
