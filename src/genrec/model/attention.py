"""Shared-prefix + branch attention (cascade attention) and its KV cache.

A branch token attends to its request's prefix and to its own branch. The two parts are
computed separately, each returning its log-sum-exp, and merged exactly:
``o = (e^(lse_a - m) o_a + e^(lse_b - m) o_b) / (e^(lse_a - m) + e^(lse_b - m))``.
The prefix keys and values are stored once per request and never copied per branch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genrec.model.layout import AttentionLayout

_NEG_INF = float("-inf")


def _attend_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    causal: bool, scale: float, chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Portable reference path, any device. q: [B, H, Lq, D]; k, v: [B, Hkv, Lk, D].
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
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1).clamp_min(torch.finfo(torch.float32).min))
        outs.append(torch.matmul(p.nan_to_num(0.0), v).to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


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
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale
        )
        return out, lse
    return _attend_math(q, k, v, mask, causal, scale)


class KVCache:
    """Keys and values of every layer: one prefix per request, one short tail per branch.

    Shapes per layer: prefix [R, prefix_cap, Hkv, D], branch [NB, branch_cap, Hkv, D].
    A transient cache (scoring) is filled out of place so training can backpropagate through it;
    a persistent one (beam search) is updated in place and its branch part reordered cheaply.
    """

    def __init__(
        self, num_layers: int, num_requests: int, prefix_cap: int, num_branches: int,
        branch_cap: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        def zeros(n: int, cap: int) -> list[torch.Tensor]:
            return [
                torch.zeros(n, cap, kv_heads, head_dim, dtype=dtype, device=device)
                for _ in range(num_layers)
            ]

        self.prefix_k = zeros(num_requests, prefix_cap)
        self.prefix_v = zeros(num_requests, prefix_cap)
        self.branch_k = zeros(num_branches, branch_cap)
        self.branch_v = zeros(num_branches, branch_cap)

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store the new keys/values of ``layer`` (k, v: [T, Hkv, D]); return the layer's cache."""
        n_prefix = layout.prefix_tokens.numel()
        single = layout.single_request  # rows are [0, Tp) then [Tp, T): slices, no gather
        if n_prefix:
            for store, src in ((self.prefix_k, k), (self.prefix_v, v)):
                rows = _take(src, layout.prefix_tokens, 0 if single else None)
                store[layer] = _write(store[layer], layout.prefix_slots, rows)
        if layout.branch_tokens.numel():
            for store, src in ((self.branch_k, k), (self.branch_v, v)):
                rows = _take(src, layout.branch_tokens, n_prefix if single else None)
                store[layer] = _write(store[layer], layout.branch_slots, rows)
        return (
            self.prefix_k[layer], self.prefix_v[layer], self.branch_k[layer], self.branch_v[layer]
        )

    def reset_branches(self, num_branches: int, branch_cap: int) -> None:
        """Fresh (zeroed) branch storage; the cached prefixes stay."""
        for store in (self.branch_k, self.branch_v):
            for layer, t in enumerate(store):
                store[layer] = t.new_zeros((num_branches, branch_cap) + tuple(t.shape[2:]))

    def requests(self, start: int, end: int) -> KVCache:
        """A cache over requests ``start..end-1`` only: their prefixes are views of this
        cache's (shared, not copied); the branch part is empty (see :meth:`reset_branches`)."""
        view = KVCache.__new__(KVCache)
        view.prefix_k = [t[start:end] for t in self.prefix_k]
        view.prefix_v = [t[start:end] for t in self.prefix_v]
        view.branch_k = [t[:0] for t in self.branch_k]
        view.branch_v = [t[:0] for t in self.branch_v]
        return view

    def reorder_branches(self, order: torch.Tensor) -> None:
        """Branch b takes the cached tail of branch ``order[b]`` (beam reordering)."""
        for store in (self.branch_k, self.branch_v):
            for layer, t in enumerate(store):
                store[layer] = t.index_select(0, order)


def _write(cache: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if slots.numel() == 0:
        return cache
    flat = cache.view((-1,) + tuple(cache.shape[2:]))
    if torch.is_grad_enabled() and src.requires_grad:
        return flat.index_copy(0, slots, src.to(cache.dtype)).view(cache.shape)
    flat.index_copy_(0, slots, src.to(cache.dtype))
    return cache


def _take(x: torch.Tensor, index: torch.Tensor, start: int | None) -> torch.Tensor:
    # x[index], or a view when the rows are known to be contiguous from ``start``
    return x[start : start + index.numel()] if start is not None else x[index]


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
    layout: AttentionLayout, scale: float,
) -> torch.Tensor:
    """Attention of the packed queries ``q`` [T, H, D] under ``layout``; returns [T, H, D]."""
    n_req, n_br = layout.num_requests, layout.num_branches
    single = layout.single_request
    n_prefix, n_branch = layout.prefix_tokens.numel(), layout.branch_tokens.numel()
    pk, pv = prefix_k.transpose(1, 2), prefix_v.transpose(1, 2)  # [R, Hkv, P, D]
    # both parts: written into one output (for one request, prefix rows then branch rows)
    out = q.new_empty(q.shape) if n_prefix and n_branch else None

    if n_prefix:
        qp = _take(q, layout.prefix_tokens, 0 if single else None)
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

    qb = _take(q, layout.branch_tokens, n_prefix if single else None)
    # Part B: each branch against its own keys.
    mask = layout.additive_mask("branch_mask", q.dtype)
    o_b, lse_b = _attend_grid(
        qb, layout.branch_rows, n_br, layout.branch_width, layout.uniform_branches,
        branch_k.transpose(1, 2), branch_v.transpose(1, 2), mask, layout.branch_causal, scale,
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
