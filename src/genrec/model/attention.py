"""Building blocks of shared-prefix + branch attention (cascade attention).

A branch token attends to its request's prefix and to its own branch; the prefix keys and
values are stored once per request (``kv_cache.KVCache``) and never copied per branch. On the
CPU at inference the native kernel (:mod:`genrec.kernels`, :func:`native_attention`) does both
parts in one pass per run of query rows. The PyTorch paths compute the two parts separately
(:func:`attend_grid`), each returning its log-sum-exp, and merge them exactly
(:func:`merge_attention`):
``o = (e^(lse_a - m) o_a + e^(lse_b - m) o_b) / (e^(lse_a - m) + e^(lse_b - m))``.
Each layout (:mod:`genrec.model.forward_layout`) composes them into its attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from genrec.kernels import cascade_attention_op
from genrec.model.grid_attention import attend
from genrec.model.layers import inv_rms, norm_rotary

# Native kernel: query rows per run, and the most keys a run may see (its score buffer is
# rows x keys floats per thread).
RUN_ROWS = 64
RUN_MAX_KEYS = 16384


@dataclass(frozen=True)
class QueryTransform:
    """What raw queries [Tq, H, D] still need before attention: a head norm when ``weight``
    ([D]) is given, with epsilon ``eps`` (a float, or [Tq] per row), then the rotary
    embedding (``cos``, ``signed_sin``: [Tq, 1, D], see ``layers.Rotary``). The native kernel
    applies it as it reads the queries; the PyTorch path applies :meth:`apply` first."""

    cos: torch.Tensor
    signed_sin: torch.Tensor
    weight: torch.Tensor | None = None
    eps: float | torch.Tensor = 0.0

    def apply(self, q: torch.Tensor) -> torch.Tensor:
        scale = None
        if self.weight is not None:
            eps = self.eps[:, None, None] if isinstance(self.eps, torch.Tensor) else self.eps
            scale = inv_rms(q, eps)
        return norm_rotary(q, self.weight, scale, self.cos, self.signed_sin)


def fuses_queries(q: torch.Tensor) -> bool:
    """Whether a layout's attention (``ForwardLayout.attend``) runs the native kernel for
    queries like ``q`` (CPU, fp32 or bf16, no autograd, kernel built), which then takes raw
    queries and a :class:`QueryTransform` at no extra pass. The kernel computes in fp32: bf16
    queries and keys widen exactly, the output rounds back to bf16 (also where the CPU has
    bf16 products: PyTorch's bf16 attention and the separate norm / rotary passes cost more
    than the widening)."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16)
            and not (torch.is_grad_enabled() and q.requires_grad)
            and cascade_attention_op() is not None)


def _grid(x: torch.Tensor, rows: torch.Tensor, n_rows: int, identity: bool) -> torch.Tensor:
    # rows of x placed at ``rows`` of a zero-padded grid [n_rows, ...]; identity: no copy
    if identity:
        return x
    grid = x.new_zeros((n_rows,) + tuple(x.shape[1:]))
    return grid.index_copy(0, rows, x)


def attend_grid(
    q: torch.Tensor, rows: torch.Tensor, groups: int, width: int, identity: bool,
    k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float,
    need_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Queries q [N, H, D] laid out as ``groups`` padded rows of ``width`` against k/v
    [groups, Hkv, Lk, D]; returns per-query output [N, H, D] and log-sum-exp [N, H]
    (None unless ``need_lse``)."""
    n, heads, dim = q.shape
    grid = _grid(q, rows, groups * width, identity).view(groups, width, heads, dim)
    if need_lse:
        out, lse = attend(grid.transpose(1, 2), k, v, mask, causal, scale)
        lse = lse.transpose(1, 2).reshape(groups * width, heads)
    else:  # fused kernel with a backward on every device
        out, lse = F.scaled_dot_product_attention(
            grid.transpose(1, 2), k, v, attn_mask=mask, is_causal=causal and mask is None,
            scale=scale, enable_gqa=True,
        ), None
    out = out.transpose(1, 2).reshape(groups * width, heads, dim)
    if identity:
        return out, lse
    return out[rows], (lse[rows] if lse is not None else None)


def native_applies(q: torch.Tensor, caches: tuple[torch.Tensor, ...]) -> bool:
    """Whether the native kernel runs queries ``q`` over ``caches`` (see
    :func:`fuses_queries`): caches of q's dtype that need no gradients."""
    return fuses_queries(q) and all(t.dtype == q.dtype for t in caches) and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in caches))


def native_attention(
    q: torch.Tensor, caches: tuple[torch.Tensor, ...], runs: torch.Tensor, scale: float,
    q_transform: QueryTransform | None,
) -> torch.Tensor:
    """The native kernel over ``caches`` (prefix k, prefix v, branch k, branch v) for the
    query ``runs``. An fp32 kernel: bf16 inputs widen to fp32, the output rounds back."""
    rope: dict[str, torch.Tensor | float | None] = {}
    if q_transform is not None:
        tr, rows = q_transform, q.shape[0]
        row_eps = tr.eps.float().reshape(-1) if isinstance(tr.eps, torch.Tensor) else None
        rope = {"cos": tr.cos.float().reshape(rows, -1),
                "sin": tr.signed_sin.float().reshape(rows, -1),
                "weight": None if tr.weight is None else tr.weight.float(),
                "row_eps": row_eps, "eps": 0.0 if row_eps is not None else float(tr.eps)}
    q32 = q.float()
    if q32.stride(-1) != 1 or q32.stride(1) != q.shape[2]:
        q32 = q32.contiguous()
    # [rows, Hkv, D]: views of compact fp32 caches
    flat = [t.float().flatten(0, 1) for t in caches]
    flat = [t if t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] else t.contiguous()
            for t in flat]
    return cascade_attention_op()(q32, *flat, runs, scale, **rope).to(q.dtype)


def merge_attention(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact merge of two attention results over disjoint key sets ([N, H, D], lse [N, H]),
    written into ``out`` when given.

    The weight of part B is e^lse_b / (e^lse_a + e^lse_b) = sigmoid(lse_b - lse_a).
    """
    weight_b = torch.sigmoid(lse_b - lse_a).unsqueeze(-1).to(o_a.dtype)
    if out is None:
        return torch.lerp(o_a, o_b, weight_b)
    return torch.lerp(o_a, o_b, weight_b, out=out)
