"""Qwen3 / Qwen2 / Llama decoder in plain PyTorch over a packed batch with an attention layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genrec.model import lm_head
from genrec.model.config import ModelConfig
from genrec.model.forward_layout import ForwardLayout
from genrec.model.item_head import ItemHead
from genrec.model.kv_cache import KVCache
from genrec.model.layers import (
    RMSNorm,
    Rotary,
    SwiGLU,
    compute_dtype,
    inv_rms,
    linear,
    scale_rows,
)
from genrec.model.layout import AttentionLayout, Readout
from genrec.model.native_layers import native_forward
from genrec.model.projector import SoftTokenProjector
from genrec.model.self_attention import Attention


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
                     self.model.embed_tokens if cfg.item_compose else None, cfg.history_bias,
                     cfg.item_dim)
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
