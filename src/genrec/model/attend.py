"""Attention over padded grids, returning the log-sum-exp: the building block of the
cascade attention (:mod:`genrec.model.attention`).

:func:`attend` picks the kernel: on the CPU at inference torch's fused flash kernel, on CUDA
PyTorch's flash / memory-efficient kernels (checked once against the math path), elsewhere
and under autograd the chunked math path (:func:`attend_math`).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

_NEG_INF = float("-inf")


def attend_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float, chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Portable reference attention, any device, with autograd: q [B, H, Lq, D], k / v
    [B, Hkv, Lk, D] -> (output, log-sum-exp [B, H, Lq] fp32), queries in chunks. Computed in
    fp32 also under autocast (a bf16 score product would overflow the mask's fp32 floor)."""
    with torch.autocast(q.device.type, enabled=False):
        return _attend_math_fp32(q, k, v, mask, causal, scale, chunk)


def _attend_math_fp32(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1).float()
    v = v.repeat_interleave(groups, dim=1).float()
    outs, lses = [], []
    for start in range(0, q.shape[2], chunk):
        qc = q[:, :, start : start + chunk].float()
        s = torch.matmul(qc, k.transpose(-1, -2)) * scale
        if mask is not None:
            rows = mask if mask.shape[2] == 1 else mask[:, :, start : start + chunk]
            s = s + rows.float()
        if causal:
            rows = torch.arange(start, start + qc.shape[2], device=q.device)[:, None]
            cols = torch.arange(k.shape[2], device=q.device)[None, :]
            s = s.masked_fill(cols > rows, _NEG_INF)
        # a row whose keys are all masked gets p = 0 and a finite, hugely negative lse:
        # no inf - inf anywhere, so its gradients stay finite (zero) too
        top = s.detach().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
        e = torch.exp(s - top)
        total = e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        outs.append(torch.matmul(e / total, v).to(q.dtype))
        lses.append((top + total.log()).squeeze(-1))
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


@functools.cache
def cpu_flash_takes_gqa() -> bool:
    """Whether torch's CPU flash kernel reads grouped key heads correctly (2.13 does, 2.6
    returns garbage): probed once on a tiny input against the math path."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 3, 8, generator=g) for h in (4, 2, 2))
    with torch.inference_mode():
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=None, scale=0.25)[:2]
        ref, ref_lse = attend_math(q, k, v, None, False, 0.25)
    return bool(torch.allclose(out, ref, atol=1e-5) and torch.allclose(lse, ref_lse, atol=1e-5))


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention returning (output [B, H, Lq, D], log-sum-exp [B, H, Lq] in fp32).

    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention); ``mask`` is additive
    and broadcastable to [B, 1, Lq, Lk]; ``causal`` aligns query i with key i (top-left).
    Rows whose keys are all masked give an undefined log-sum-exp: callers must mask them.
    """
    # The fused CPU kernel gives no gradient through its log-sum-exp: train on the math path.
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if q.device.type == "cpu" and not needs_grad:
        if k.shape[1] != q.shape[1] and not cpu_flash_takes_gqa():
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale
        )
        return out, lse
    if q.device.type == "cuda" and not needs_grad and cuda_fused_ok(q.device, q.dtype):
        return attend_cuda(q, k, v, mask, causal, scale)
    return attend_math(q, k, v, mask, causal, scale)


def attend_cuda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attend` through PyTorch's fused CUDA kernels, which return the log-sum-exp:
    flash attention (fp16 / bf16, no mask), else the memory-efficient kernel (fp32 too; an
    additive mask as its bias). Key heads are expanded for grouped queries."""
    if k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    lq = q.shape[2]
    if mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)[:2]
        return out, lse[..., :lq].float()
    bias = None
    lk = k.shape[2]
    if mask is not None:
        bias = mask.to(q.dtype)  # broadcastable to [B, H, Lq, Lk]; kept broadcast (stride 0)
        if causal:  # both: the causal rule folded into the bias (top-left aligned)
            above = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1)
            bias = bias.masked_fill(above, _NEG_INF)
            causal = False
        pad = -lk % 16  # the kernel reads its bias in aligned rows: pad the keys, masked
        if pad:
            k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
            bias = F.pad(bias, (0, pad), value=_NEG_INF)
        bias = bias.expand(q.shape[0], q.shape[1], lq, lk + pad)
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, causal, scale=scale)[:2]
    return out, lse[..., :lq].float()


@functools.cache
def cuda_fused_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether PyTorch's fused CUDA kernels agree with the math path on this device and
    dtype (masked and causal, grouped heads), checked once; where not, the math path
    serves (logged)."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(2, h, 40, 64, generator=g, device=device, dtype=dtype)
               for h in (4, 2, 2))
    mask = torch.zeros(2, 1, 40, 40, device=device, dtype=dtype)
    mask[1, :, :, 30:] = float("-inf")
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    try:
        with torch.inference_mode():
            for m, causal in ((None, True), (mask, False), (None, False)):
                out, lse = attend_cuda(q, k, v, m, causal, 0.125)
                ref, ref_lse = attend_math(q, k, v, m, causal, 0.125)
                if not (torch.allclose(out.float(), ref.float(), atol=tol)
                        and torch.allclose(lse, ref_lse, atol=tol)):
                    raise RuntimeError("results differ from the math path")
    except RuntimeError as err:
        logging.getLogger(__name__).warning(
            "PyTorch's fused CUDA attention unusable here (%s): using the math path", err)
        return False
    return True
