"""Shared-prefix + branch attention (cascade attention).

A branch token attends to its request's prefix and to its own branch; the prefix keys and
values are stored once per request (``kv_cache.KVCache``) and never copied per branch. On the
CPU at inference the native kernel (:mod:`genrec.kernels`) does both parts in one pass per run
of query rows. The PyTorch path computes the two parts separately, each returning its
log-sum-exp, and merges them exactly:
``o = (e^(lse_a - m) o_a + e^(lse_b - m) o_b) / (e^(lse_a - m) + e^(lse_b - m))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from genrec.kernels import cascade_attention_op
from genrec.model.attend import attend
from genrec.model.beam_step import BeamStepLayout, step_attention_portable
from genrec.model.kv_cache import take_rows
from genrec.model.layers import inv_rms, norm_rotary
from genrec.model.layout import AttentionLayout
from genrec.model.score_grid import ScoreGridLayout, grid_attention_portable

_NEG_INF = float("-inf")
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
    """Whether :func:`prefix_branch_attention` runs the native kernel for queries like ``q``
    (CPU, fp32 or bf16, no autograd, kernel built), which then takes raw queries and a
    :class:`QueryTransform` at no extra pass. The kernel computes in fp32: bf16 queries and
    keys widen exactly, the output rounds back to bf16 (also where the CPU has bf16 products:
    PyTorch's bf16 attention and the separate norm / rotary passes cost more than the
    widening)."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16)
            and not (torch.is_grad_enabled() and q.requires_grad)
            and cascade_attention_op() is not None)


def _grid(x: torch.Tensor, rows: torch.Tensor, n_rows: int, identity: bool) -> torch.Tensor:
    # rows of x placed at ``rows`` of a zero-padded grid [n_rows, ...]; identity: no copy
    if identity:
        return x
    grid = x.new_zeros((n_rows,) + tuple(x.shape[1:]))
    return grid.index_copy(0, rows, x)


def _attend_grid(
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


def prefix_branch_attention(
    q: torch.Tensor,
    prefix_k: torch.Tensor, prefix_v: torch.Tensor,
    branch_k: torch.Tensor, branch_v: torch.Tensor,
    layout: AttentionLayout | BeamStepLayout | ScoreGridLayout, scale: float,
    q_transform: QueryTransform | None = None,
) -> torch.Tensor:
    """Attention of the packed queries ``q`` [T, H, D] under ``layout``; returns [T, H, D].
    With ``q_transform``, ``q`` is raw and the transform is applied first.

    CPU fp32 / bf16 inference runs the native cascade kernel (:mod:`genrec.kernels`) where it is
    built: one pass per run of query rows over its prefix and its own keys. Elsewhere the
    prefix part and the branch part run as separate attention calls merged by log-sum-exp.
    A beam step (:class:`~genrec.model.beam_step.BeamStepLayout`) reads each beam's tail
    through the search's ancestry table."""
    if isinstance(layout, BeamStepLayout):
        return beam_step_attention(q, prefix_k, prefix_v, branch_k, branch_v, layout, scale,
                                   q_transform)
    if isinstance(layout, ScoreGridLayout):
        return score_grid_attention(q, prefix_k, prefix_v, branch_k, branch_v, layout, scale,
                                    q_transform)
    caches = (prefix_k, prefix_v, branch_k, branch_v)
    if _native_applies(q, caches):
        runs, most_keys = layout.query_runs(RUN_ROWS)
        if most_keys <= RUN_MAX_KEYS:
            return _native_attention(q, caches, runs, scale, q_transform)
    if q_transform is not None:
        q = q_transform.apply(q)
    n_req = layout.num_requests
    single = layout.single_request
    n_prefix, n_branch = layout.prefix_tokens.numel(), layout.branch_tokens.numel()
    pk, pv = prefix_k.transpose(1, 2), prefix_v.transpose(1, 2)  # [R, Hkv, P, D]
    # both parts: written into one output (for one request, prefix rows then branch rows)
    out = q.new_empty(q.shape) if n_prefix and n_branch else None

    if n_prefix:
        qp = take_rows(q, layout.prefix_tokens, 0 if single else None)
        mask = layout.additive_mask("prefix_mask", q.dtype)
        o_p, _ = _attend_grid(qp, layout.prefix_rows, n_req, layout.prefix_width,
                              layout.prefix_dense, pk, pv, mask, layout.prefix_causal, scale,
                              need_lse=False)
        if out is None:
            return o_p
        if single:
            out[:n_prefix] = o_p
        else:
            out[layout.prefix_tokens] = o_p

    qb = take_rows(q, layout.branch_tokens, n_prefix if single else None)
    # Part B: each branch against its own keys.
    mask = layout.additive_mask("branch_mask", q.dtype)
    o_b, lse_b = _attend_grid(
        qb, layout.branch_rows, layout.num_branches, layout.branch_width,
        layout.uniform_branches, branch_k.transpose(1, 2), branch_v.transpose(1, 2), mask,
        layout.branch_causal, scale,
    )
    # one request: the merge writes into ``out`` (not under autograd: lerp's out= has none)
    in_place = out is not None and single and not torch.is_grad_enabled()
    if layout.prefix_cap:
        # Part A: all branch queries of a request against its prefix, in one product.
        mask = layout.additive_mask("shared_mask", q.dtype)
        o_a, lse_a = _attend_grid(qb, layout.shared_rows, n_req, layout.shared_width,
                                  layout.shared_dense, pk, pv, mask, False, scale)
        if layout.shared_empty is not None:
            lse_a = lse_a.masked_fill(layout.shared_empty[:, None], _NEG_INF)
        o_b = merge_attention(o_a, lse_a, o_b, lse_b, out=out[n_prefix:] if in_place else None)
    if out is None:
        return o_b
    if single and not in_place:
        out[n_prefix:] = o_b
    elif not single:
        out[layout.branch_tokens] = o_b
    return out


def beam_step_attention(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, tail_k: torch.Tensor,
    tail_v: torch.Tensor, layout: BeamStepLayout, scale: float,
    q_transform: QueryTransform | None = None,
) -> torch.Tensor:
    """One beam step's attention (q [NB, H, D]; prefix caches [R, P, Hkv, D], tail caches
    [NB, cap, Hkv, D]): the native kernel over the gathered tails on the CPU, else the
    portable batched products (:func:`~genrec.model.beam_step.step_attention_portable`)."""
    caches = (prefix_k, prefix_v, tail_k, tail_v)
    if _native_applies(q, caches) and prefix_k.shape[1] + layout.level <= RUN_MAX_KEYS:
        gathered = (prefix_k, prefix_v, layout.tails(tail_k), layout.tails(tail_v))
        return _native_attention(q, gathered, layout.runs(prefix_k.shape[1]), scale,
                                 q_transform)
    if q_transform is not None:
        q = q_transform.apply(q)
    return step_attention_portable(q, prefix_k, prefix_v, tail_k, tail_v, layout, scale)


def score_grid_attention(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, own_k: torch.Tensor,
    own_v: torch.Tensor, layout: ScoreGridLayout, scale: float,
    q_transform: QueryTransform | None = None,
) -> torch.Tensor:
    """A score grid's attention (:mod:`genrec.model.score_grid`): the native kernel on the
    CPU, else the portable products."""
    caches = (prefix_k, prefix_v, own_k, own_v)
    if _native_applies(q, caches) and layout.most_keys() <= RUN_MAX_KEYS:
        return _native_attention(q, caches, layout.runs(), scale, q_transform)
    if q_transform is not None:
        q = q_transform.apply(q)
    return grid_attention_portable(q, prefix_k, prefix_v, own_k, own_v, layout, scale)


def _native_applies(q: torch.Tensor, caches: tuple[torch.Tensor, ...]) -> bool:
    # see fuses_queries; caches of q's dtype that need no gradients
    return fuses_queries(q) and all(t.dtype == q.dtype for t in caches) and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in caches))


def _native_attention(
    q: torch.Tensor, caches: tuple[torch.Tensor, ...], runs: torch.Tensor, scale: float,
    q_transform: QueryTransform | None,
) -> torch.Tensor:
    # the native kernel over (prefix_k, prefix_v, branch_k, branch_v) for the query runs
    # ``runs``. An fp32 kernel: bf16 inputs widen to fp32 and the output rounds back to bf16
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
