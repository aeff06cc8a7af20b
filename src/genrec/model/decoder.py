"""Qwen3 / Qwen2 / Llama decoder in plain PyTorch over a packed batch with an attention layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genrec.model import lm_head
from genrec.model.attention import QueryTransform, fuses_queries
from genrec.model.config import ModelConfig
from genrec.model.forward_layout import ForwardLayout
from genrec.model.item_head import ItemHead
from genrec.model.kv_cache import KVCache
from genrec.model.layers import (
    RMSNorm,
    Rotary,
    SwiGLU,
    compute_dtype,
    derived,
    fused_linear,
    inv_rms,
    linear,
    mean_square,
    norm_rotary,
    scale_rows,
)
from genrec.model.layout import AttentionLayout, Readout
from genrec.model.native_layers import native_forward
from genrec.model.projector import SoftTokenProjector

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


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rope, layout, cache, layer, readout=None, dropout=0.0):  # noqa: ANN001
        # The norms' weights are folded into the next projections (see Attention, SwiGLU).
        post = self.post_attention_layernorm
        if dropout:  # training only: dropout on each residual branch (no fused residual add)
            x = x + F.dropout(self.self_attn(x, self.input_layernorm, rope, layout, cache, layer,
                                             residual=None), dropout, training=True)
            h = scale_rows(x, inv_rms(x, post.eps))
            return x + F.dropout(self.mlp(h, in_scale=post.weight), dropout, training=True)
        x = self.self_attn(x, self.input_layernorm, rope, layout, cache, layer, residual=x,
                           readout=readout)
        return self.mlp(scale_rows(x, inv_rms(x, post.eps)), residual=x, in_scale=post.weight)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(nn.Module):
    """A causal LM whose forward reads input embeddings, explicit positions and a layout.

    Parameter names follow Hugging Face (``model.layers.N.self_attn.q_proj.weight``, ...), so
    checkpoints load without renaming. genrec's additions (soft-token projector, score head)
    live outside ``model.``/``lm_head.`` and are saved to a separate file.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.user_projector = (
            SoftTokenProjector(cfg.user_dim, cfg.hidden_size) if cfg.user_dim else None
        )
        self.score_head = nn.Linear(cfg.hidden_size, 1) if cfg.score_head else None
        self.item_head = (
            ItemHead(cfg.item_head, cfg.hidden_size, cfg.item_inputs,
                     self.model.embed_tokens if cfg.item_compose else None, cfg.history_bias)
            if cfg.item_head else None
        )
        # Training-time regularisation, not part of the checkpoint: applied to the input
        # embeddings and each residual branch while ``self.training`` (see ``set_dropout``).
        self.dropout = 0.0

    def set_dropout(self, p: float) -> DecoderLM:
        """Dropout probability used in training mode (0 disables it); returns self."""
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {p}")
        self.dropout = float(p)
        return self

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def new_cache(
        self, layout: AttentionLayout, num_branches: int | None = None,
        branch_cap: int | None = None, transient: bool = False,
    ) -> KVCache:
        """A cache sized for ``layout``, or for more branches (beam search) when given;
        ``transient``: dropped after the forward(s) of one batch (see :class:`KVCache`)."""
        cfg = self.config
        return KVCache(
            cfg.num_hidden_layers, layout.num_requests, layout.prefix_cap,
            layout.num_branches if num_branches is None else num_branches,
            layout.branch_cap if branch_cap is None else branch_cap,
            cfg.num_key_value_heads, cfg.head_dim, self.dtype, self.device, transient,
        )

    def forward(
        self, embeds: torch.Tensor, positions: torch.Tensor | None, layout: ForwardLayout,
        cache: KVCache | None = None, readout: Readout | None = None,
    ) -> torch.Tensor:
        """embeds [T, hidden], positions [T] -> final-normed hidden states [T, hidden], or
        [K, hidden] for the ``readout`` rows only (the last layer skips the other rows' work).

        ``layout`` must live on the model's device; ``cache`` defaults to a transient one.
        ``positions`` may be None where the layout has its own (``derives_positions``: a beam
        step).
        """
        own = positions is None and layout.derives_positions  # derived if needed
        if layout.num_tokens != embeds.shape[0] or not own and (
                positions is None or positions.shape != (embeds.shape[0],)):
            shape = None if positions is None else tuple(positions.shape)
            raise ValueError(
                f"embeds has {embeds.shape[0]} tokens, positions {shape}, "
                f"layout {layout.num_tokens}"
            )
        if cache is None:
            cache = self.new_cache(layout, transient=True)
        native = native_forward(self, embeds, positions, layout, cache, readout)
        if native is not None:  # every layer in one native call (CPU fp32 inference)
            return native
        if positions is None:  # the layout's own
            positions = layout.own_positions()
        rope = self.rotary.cos_sin(positions, embeds.dtype)
        p = self.dropout if self.training and readout is None else 0.0
        x = F.dropout(embeds, p, training=True) if p else embeds
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, layout, cache, i, readout if i == last else None, p)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits of hidden states [N, hidden] -> [N, vocab] (fp32)."""
        # in the compute dtype: bf16 computed in fp32 keeps its fp32 logits
        return linear(hidden, self.lm_head, out_dtype=compute_dtype(self.lm_head.weight)).float()

    def label_logits(self, hidden: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the given tokens only: [N, hidden], [K] -> [N, K] (fp32)."""
        dtype = compute_dtype(self.lm_head.weight)
        return (hidden.to(dtype) @ self.lm_head.weight[label_ids].to(dtype).T).float()

    def range_logits(self, hidden: torch.Tensor, offset: int, size: int) -> torch.Tensor:
        """Logits of tokens ``offset .. offset + size - 1`` only: [N, hidden] -> [N, size]
        (fp32), from a view of those rows of the LM head (no gather)."""
        dtype = compute_dtype(self.lm_head.weight)
        rows = self.lm_head.weight[offset : offset + size]
        return (hidden.to(dtype) @ rows.to(dtype).T).float()

    def range_logprobs(self, hidden: torch.Tensor, offset: int, size: int) -> torch.Tensor:
        """Full-vocabulary log-probabilities of tokens ``offset .. offset + size - 1``:
        [N, hidden] -> [N, size] (fp32; one tiled pass over the LM head, see
        :mod:`genrec.model.lm_head`)."""
        return lm_head.range_logprobs(self.lm_head, hidden, offset, size)

    def log_normalizer(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary log-sum-exp of the logits of hidden states [N, hidden] -> [N]
        (fp32; tiled, see :mod:`genrec.model.lm_head`)."""
        return lm_head.vocab_logsumexp(self.lm_head, hidden)

    def token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(targets[i] | hidden[i]) over the full vocabulary: [N, hidden], [N] -> [N]
        (fp32)."""
        return lm_head.token_logprobs(self.lm_head, hidden, targets)
