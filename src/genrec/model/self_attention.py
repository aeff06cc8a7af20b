"""Self-attention of a Qwen3 / Qwen2 / Llama decoder layer: q, k, v projections (fused), q/k
RMSNorm and rotary embedding, then the layout's attention over the packed batch and cache."""

from __future__ import annotations

import torch
from torch import nn

from genrec.model.attention import QueryTransform, fuses_queries
from genrec.model.config import ModelConfig
from genrec.model.forward_layout import ForwardLayout
from genrec.model.kv_cache import KVCache
from genrec.model.layers import (
    RMSNorm,
    derived,
    fused_linear,
    inv_rms,
    linear,
    mean_square,
    norm_rotary,
    scale_rows,
)
from genrec.model.layout import Readout

# Up to this many rows, q and k heads are normed and rotated in one call (few ops matter more
# than one extra [rows, heads, head_dim] factor).
_FEW_ROWS = 256


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        )
        # attention_bias: q, k, v and o biased (Llama, Qwen3); qkv_bias: q, k, v only (Qwen2)
        bias = cfg.attention_bias or cfg.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size,
                                bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        # q and k are head-normed and unbiased: the input norm's row scale cancels in them
        self.scale_free = cfg.qk_norm and not bias
        self.scale = self.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, norm: RMSNorm, rope: tuple[torch.Tensor, torch.Tensor],
        layout: ForwardLayout, cache: KVCache, layer: int, residual: torch.Tensor | None,
        readout: Readout | None = None,
    ) -> torch.Tensor:
        """x: [T, hidden] (before ``norm``) -> residual + attention output [T, hidden], or only
        the ``readout`` rows [K, hidden] (keys and values are written for all T rows)."""
        n, heads, kvh, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        # norm(x) = x * r * w with r = 1/rms(x) per row: w is folded into the projection
        # weights; r is applied to x, or, when scale_free, to v alone: a head norm of
        # q = r q' equals that of q' under the per-row epsilon eps / r^2.
        ms_eps = mean_square(x, norm.eps)  # [T, 1]
        r = ms_eps.rsqrt()
        x_in = x if self.scale_free else scale_rows(x, r)
        rows = None if readout is None else readout.rows
        # q for the read rows alone pays off when they are few (it costs a second product)
        split = rows is not None and 4 * rows.numel() <= n
        if not split:
            qkv = fused_linear(self, x_in, self.q_proj, self.k_proj, self.v_proj,
                               in_scale=norm.weight).view(n, heads + 2 * kvh, d)
            qk, v = qkv[:, : heads + kvh], qkv[:, heads + kvh :]
            q, k = qk[:, :heads], qk[:, heads:]
        else:  # a read-out layer: q for the read rows only, k and v for every row
            kv = fused_linear(self, x_in, self.k_proj, self.v_proj,
                              in_scale=norm.weight).view(n, 2 * kvh, d)
            qk, k, v = None, kv[:, :kvh], kv[:, kvh:]
            q = fused_linear(self, x_in[rows], self.q_proj,
                             in_scale=norm.weight).view(-1, heads, d)
        if self.scale_free:
            v = scale_rows(v, r[:, :, None])
        q_transform = None
        if fuses_queries(q):  # the kernel norms and rotates q as it reads it
            if rows is not None and not split:
                q = q[rows]
            q_transform = self._query_transform(ms_eps, rope, rows)
            k = self._rotate_keys(k, ms_eps, rope)
        else:
            q, k = self._norm_rotary(q, k, qk, ms_eps, rope, rows if split else None)
            if rows is not None and not split:
                q = q[rows]
        pk, pv, bk, bv = layout.write_cache(cache, layer, k, v)
        if readout is not None:
            layout = readout.layout
            residual = None if residual is None else residual[rows]
        out = layout.attend(q, pk, pv, bk, bv, self.scale, q_transform)
        return linear(out.reshape(q.shape[0], heads * d), self.o_proj, add=residual)

    def _query_transform(
        self, ms_eps: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
        rows: torch.Tensor | None,
    ) -> QueryTransform:
        # q's head norm and rotary for the forward's rows ``rows`` (or all), left to attention
        cos, ssin = rope if rows is None else (rope[0][rows], rope[1][rows])
        if not self.qk_norm:
            return QueryTransform(cos, ssin)
        eps = self.q_norm.eps
        if self.scale_free:
            eps = eps * (ms_eps[:, 0] if rows is None else ms_eps[rows, 0])
        return QueryTransform(cos, ssin, self.q_norm.weight, eps)

    def _head_eps(self, ms_eps: torch.Tensor) -> float | torch.Tensor:
        # the q/k head norms' epsilon: per row ([T, 1, 1]) when the input scale is left out
        return self.q_norm.eps * ms_eps[:, :, None] if self.scale_free else self.q_norm.eps

    def _rotate_keys(
        self, k: torch.Tensor, ms_eps: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        # head norm (Qwen3) and rotary of k [T, Hkv, D] alone
        if not self.qk_norm:
            return norm_rotary(k, None, None, *rope)
        return norm_rotary(k, self.k_norm.weight, inv_rms(k, self._head_eps(ms_eps)), *rope)

    def _norm_rotary(
        self, q: torch.Tensor, k: torch.Tensor, qk: torch.Tensor | None, ms_eps: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head norms (Qwen3) and rotary of q [Tq, H, D] (the forward's rows ``rows``, or all
        of them) and k [T, Hkv, D]; ``qk``: q and k as one [T, H + Hkv, D] view, or None."""
        if not (self.qk_norm and qk is not None):
            return self._query_transform(ms_eps, rope, rows).apply(q), self._rotate_keys(
                k, ms_eps, rope)
        heads, eps = self.heads, self._head_eps(ms_eps)
        if qk.shape[0] <= _FEW_ROWS:
            # one call over q and k heads: fewer ops, a [T, H + Hkv, D] weight factor
            out = norm_rotary(qk, self._qk_weight(), inv_rms(qk, eps), *rope)
            return out[:, :heads], out[:, heads:]
        # one reduction over q and k heads, then [T, 1, D] factors
        head_r = inv_rms(qk, eps)
        return (norm_rotary(q, self.q_norm.weight, head_r[:, :heads], *rope),
                norm_rotary(k, self.k_norm.weight, head_r[:, heads:], *rope))

    def _qk_weight(self) -> torch.Tensor:
        # [heads + kv_heads, D]: q_norm's weight per query head, k_norm's per key head
        def build() -> tuple[torch.Tensor]:
            return (torch.cat([self.q_norm.weight.expand(self.heads, -1),
                               self.k_norm.weight.expand(self.kv_heads, -1)]),)

        return derived(self, "qk_weight", [self.q_norm.weight, self.k_norm.weight], build)[0]
