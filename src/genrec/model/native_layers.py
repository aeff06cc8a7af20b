"""Every decoder layer of a CPU inference forward in one native call.

Where it applies (CPU, fp32 weights and inputs, no autograd, the native kernels built, and a
beam step or a prompt-only forward), :func:`native_forward` hands the whole layer stack to
``genrec_cpu::decoder_layers`` (:mod:`genrec.kernels`): the products over packed weights (the
PyTorch path's oneDNN form, or MKL's packed GEMM where :mod:`genrec.model.native_gemm` finds it
faster and batch-independent), the norms, rotary, cache writes and the cascade attention in
plain loops, so a forward is one call instead of ~30 operators per layer. Results match the
PyTorch path to float rounding (the reductions run in another order).
``GENREC_NATIVE_LAYERS=0`` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from genrec.kernels import decoder_layers_op
from genrec.model.forward_layout import ForwardLayout
from genrec.model.kv_cache import KVCache
from genrec.model.layers import derived, packed_linear
from genrec.model.layout import Readout
from genrec.model.native_gemm import gemm_form, gemm_setting


@dataclass(frozen=True)
class LayerArgs:
    """The model's side of the native call, built once per weight version and
    ``GENREC_CPU_GEMM`` setting: per layer the packed q/k/v, o, gate + up and down weights
    (``weights``, 4 per layer) and their biases, the head-norm weights, the read-out layer's
    q and k/v weights apart (``last_qkv``) and the final norm's weight."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    q_norm: list[torch.Tensor | None]
    k_norm: list[torch.Tensor | None]
    last_qkv: list[torch.Tensor | None]
    final_norm: torch.Tensor


def _packed(owner: torch.nn.Module, layers: tuple[torch.nn.Linear, ...],
            in_scale: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    # fp32, in the form native_gemm picks for the concatenated weight's shape
    form = gemm_form(sum(layer.out_features for layer in layers), layers[0].in_features)
    return packed_linear(owner, layers, in_scale, torch.float32, form)


def _layer_args(model: nn.Module) -> LayerArgs:
    def build() -> tuple[LayerArgs]:
        weights, biases, q_norm, k_norm = [], [], [], []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            pre, post = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            for packed in (
                _packed(attn, (attn.q_proj, attn.k_proj, attn.v_proj), pre),
                _packed(attn.o_proj, (attn.o_proj,), None),
                _packed(mlp, (mlp.gate_proj, mlp.up_proj), post),
                _packed(mlp.down_proj, (mlp.down_proj,), None),
            ):
                weights.append(packed[0])
                biases.append(packed[1])
            q_norm.append(attn.q_norm.weight.detach() if attn.qk_norm else None)
            k_norm.append(attn.k_norm.weight.detach() if attn.qk_norm else None)
        last = model.model.layers[-1]
        attn, pre = last.self_attn, last.input_layernorm.weight
        q = _packed(attn, (attn.q_proj,), pre)
        kv = _packed(attn, (attn.k_proj, attn.v_proj), pre)
        return (LayerArgs(weights, biases, q_norm, k_norm, [q[0], q[1], kv[0], kv[1]],
                          model.model.norm.weight.detach()),)

    params = model.__dict__.get("_genrec_layer_params")
    if params is None:  # the module tree is fixed once built: listed once
        params = model.__dict__["_genrec_layer_params"] = [
            *model.model.layers.parameters(), model.model.norm.weight]
    return derived(model, ("native_layers", gemm_setting()), params, build)[0]


def _applies(model: nn.Module, embeds: torch.Tensor) -> bool:
    return (embeds.device.type == "cpu" and embeds.dtype == torch.float32
            and model.dtype == torch.float32 and not model.training
            and not (torch.is_grad_enabled() and (
                embeds.requires_grad or model.lm_head.weight.requires_grad))
            and torch.backends.mkldnn.is_available() and decoder_layers_op() is not None)


def native_forward(
    model: nn.Module, embeds: torch.Tensor, positions: torch.Tensor | None,
    layout: ForwardLayout, cache: KVCache, readout: Readout | None = None,
) -> torch.Tensor | None:
    """The forward of ``model`` (a ``DecoderLM``: final-normed hidden states [T, hidden], or
    [K, hidden] for the ``readout`` rows) in one native call; None where it does not apply
    (the caller runs the PyTorch layers) or the layout has no native tables
    (``ForwardLayout.native_tables``: beam steps, whose positions the kernel derives, and
    forwards of prompts alone)."""
    if not _applies(model, embeds):
        return None
    tables = layout.native_tables(cache.prefix_capacity, readout is not None)
    if tables is None:
        return None
    last_rows = last_tasks = None
    if readout is not None:
        last_tasks = readout.layout.kernel_runs(cache.prefix_capacity)
        if last_tasks is None:
            return None
        last_rows = readout.rows
    args = _layer_args(model)
    caches = [cache.layer_caches(i) for i in range(len(model.model.layers))]
    attn, rotary = model.model.layers[0].self_attn, model.rotary
    eps = model.model.layers[0].input_layernorm.eps
    head_eps = attn.q_norm.eps if attn.qk_norm else 0.0
    return decoder_layers_op()(
        embeds.contiguous(), None if layout.derives_positions else positions,
        rotary.inv_freq(embeds.device), rotary.attention_factor, args.weights, args.biases,
        args.q_norm, args.k_norm, args.final_norm, [c[0] for c in caches],
        [c[1] for c in caches], [c[2] for c in caches], [c[3] for c in caches],
        tables.write_rows, tables.tasks, last_rows, last_tasks, args.last_qkv,
        tables.prefix_len, tables.ancestry, tables.width, tables.level, attn.heads,
        attn.kv_heads, eps, head_eps, attn.scale_free, attn.scale)
