"""Attention over padded grids, returning the log-sum-exp: the building block of the
cascade attention (:mod:`genrec.model.attention`).

:func:`attend` picks the kernel. torch has no public fused attention that returns the
log-sum-exp (``flex_attention(..., return_lse=True)`` materialises the scores unless compiled),
so the fused kernels are torch's private ops (``torch.ops.aten._scaled_dot_product_*``: on the
CPU at inference the flash kernel, on CUDA flash / memory-efficient, checked once against the
math path), used only on the torch releases genrec was tested with (:data:`PRIVATE_OPS_TORCH`).
Elsewhere, under autograd, and for any call where a private op raises, the chunked math path
(:func:`attend_math`, public ops only) serves that call; a failure is logged once per op and
counted (:func:`attention_fallbacks`), the next call tries the fused kernel again. Callers that
need no log-sum-exp use :func:`attend_output` (``F.scaled_dot_product_attention``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F

_NEG_INF = float("-inf")
_log = logging.getLogger(__name__)

PRIVATE_OPS_TORCH = ((2, 6), (2, 13))
"""The torch releases (major, minor; inclusive) whose private attention ops genrec calls: the
oldest the package accepts and the newest it was tested with. Outside, the public paths."""


def private_ops_tested(version: str | None = None) -> bool:
    """Whether ``version`` (default: the running torch's) is within :data:`PRIVATE_OPS_TORCH`."""
    found = re.match(r"(\d+)\.(\d+)", str(version or torch.__version__))
    if found is None:
        return False
    release = (int(found.group(1)), int(found.group(2)))
    return PRIVATE_OPS_TORCH[0] <= release <= PRIVATE_OPS_TORCH[1]


_fallbacks: Counter[str] = Counter()
_fallbacks_lock = threading.Lock()


def attention_fallbacks() -> dict[str, int]:
    """How many calls each private attention op failed in, in this process (each such call
    was answered by the math path)."""
    with _fallbacks_lock:
        return dict(_fallbacks)


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err)


def _guarded(op: str, fused: Callable[[], tuple[torch.Tensor, torch.Tensor]],
             fallback: Callable[[], tuple[torch.Tensor, torch.Tensor]],
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused()``, or ``fallback()`` for this call where it raises (out of memory is not a
    kernel's fault: raised on); the first failure of ``op`` is logged."""
    try:
        return fused()
    except RuntimeError as err:
        if _is_oom(err):
            raise
        with _fallbacks_lock:
            _fallbacks[op] += 1
            first = _fallbacks[op] == 1
        if first:
            _log.warning("%s failed (%s): this call takes the math path; later calls try it "
                         "again (further failures are counted, not logged)", op, err)
        return fallback()


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


_gqa_verdict: dict[str, bool] = {}


def _cpu_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale)[:2]
    return out, lse


def cpu_flash_takes_gqa() -> bool:
    """Whether torch's CPU flash kernel reads grouped key heads correctly (2.13 does, 2.6
    returns garbage): probed on a tiny input against the math path, the verdict kept (a probe
    that raises decides nothing: grouped heads are expanded for that call)."""
    if "cpu" in _gqa_verdict:
        return _gqa_verdict["cpu"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 3, 8, generator=g) for h in (4, 2, 2))
    with torch.inference_mode():
        try:
            out, lse = _cpu_flash(q, k, v, None, False, 0.25)
        except RuntimeError:
            return False
        ref, ref_lse = attend_math(q, k, v, None, False, 0.25)
    verdict = bool(torch.allclose(out, ref, atol=1e-5) and torch.allclose(lse, ref_lse, atol=1e-5))
    return _gqa_verdict.setdefault("cpu", verdict)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention returning (output [B, H, Lq, D], log-sum-exp [B, H, Lq] in fp32).

    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention); ``mask`` is additive
    and broadcastable to [B, 1, Lq, Lk]; ``causal`` aligns query i with key i (top-left).
    Rows whose keys are all masked give an undefined log-sum-exp: callers must mask them.
    """
    def math() -> tuple[torch.Tensor, torch.Tensor]:
        return attend_math(q, k, v, mask, causal, scale)

    # The fused CPU kernel gives no gradient through its log-sum-exp: train on the math path.
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if needs_grad or not private_ops_tested():
        return math()
    if q.device.type == "cpu":
        def cpu() -> tuple[torch.Tensor, torch.Tensor]:
            kk, vv = k, v
            if k.shape[1] != q.shape[1] and not cpu_flash_takes_gqa():
                groups = q.shape[1] // k.shape[1]
                kk, vv = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return _cpu_flash(q, kk, vv, mask, causal, scale)
        return _guarded("cpu flash attention", cpu, math)
    if q.device.type == "cuda" and cuda_fused_ok(q.device, q.dtype):
        return _guarded("cuda fused attention",
                        lambda: attend_cuda(q, k, v, mask, causal, scale), math)
    return math()


def attend_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float,
) -> torch.Tensor:
    """:func:`attend`'s output alone, through the public
    ``F.scaled_dot_product_attention`` (fused where torch has a kernel, with a backward)."""
    if mask is not None and causal:  # both: the causal rule folded into the mask
        above = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        mask = mask.to(q.dtype).masked_fill(above, _NEG_INF)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          is_causal=causal and mask is None, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


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


_cuda_verdicts: dict[tuple[torch.device, torch.dtype], bool] = {}


def cuda_fused_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether PyTorch's fused CUDA kernels agree with the math path on this device and
    dtype (masked and causal, grouped heads), checked once on a torch release within
    :data:`PRIVATE_OPS_TORCH`; where they differ, the math path serves (logged). A check that
    raises decides nothing: logged, False for this call, checked again at the next."""
    key = (torch.device(device), dtype)
    if key in _cuda_verdicts:
        return _cuda_verdicts[key]
    if not private_ops_tested():
        return False
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(2, h, 40, 64, generator=g, device=device, dtype=dtype)
               for h in (4, 2, 2))
    mask = torch.zeros(2, 1, 40, 40, device=device, dtype=dtype)
    mask[1, :, :, 30:] = float("-inf")
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    agree = True
    try:
        with torch.inference_mode():
            for m, causal in ((None, True), (mask, False), (None, False)):
                out, lse = attend_cuda(q, k, v, m, causal, 0.125)
                ref, ref_lse = attend_math(q, k, v, m, causal, 0.125)
                agree = agree and bool(torch.allclose(out.float(), ref.float(), atol=tol)
                                       and torch.allclose(lse, ref_lse, atol=tol))
    except RuntimeError as err:
        if _is_oom(err):
            raise
        _log.warning("PyTorch's fused CUDA attention failed its check (%s): the math path "
                     "for now, checked again at the next call", err)
        return False
    if not agree:
        _log.warning("PyTorch's fused CUDA attention differs from the math path on %s %s: "
                     "using the math path", device, dtype)
    return _cuda_verdicts.setdefault(key, agree)
