"""Full-vocabulary log-normalisers of the LM head, tiled so that logits never leave the cache.

A candidate token's log-probability is its logit minus the log-sum-exp of its row's logits
over the whole vocabulary. Materialising ``[rows, vocab]`` logits (16 MB for 128 rows of a 32k
vocabulary) and reading them back in a log-softmax makes that step memory-bound; streaming the
LM-head weight once per small row chunk makes the product memory-bound too. At CPU inference
the rows run in blocks of ``ROW_BLOCK``, the vocabulary in slices of ``VOCAB_SLICE`` (oneDNN-
packed once per slice): each ``[ROW_BLOCK, VOCAB_SLICE]`` tile of logits is reduced into a
running maximum and sum of exponentials while it is still in the cache (online log-sum-exp),
so the weight is read once per row block and no logits are written to memory.
Elsewhere (training, other devices) the plain formulation runs in row chunks.
"""

from __future__ import annotations

import torch
from torch import nn

from genrec.kernels import range_logprobs_op
from genrec.model.layers import compute_dtype, derived, onednn_inference
from genrec.model.native_gemm import gemm_form, gemm_setting, pack_weight

ROW_BLOCK = 1024
VOCAB_SLICE = 4096


def _packed_slices(head: nn.Linear, dtype: torch.dtype, native_forms: bool = False
                   ) -> tuple[torch.Tensor, ...]:
    # the head's weight in row slices of VOCAB_SLICE, each packed in ``dtype`` for oneDNN, or
    # (``native_forms``: for the native kernel) in the form native_gemm picks for its shape
    def build() -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            weight = head.weight.detach().to(dtype)
            return tuple(pack_weight(w, gemm_form(*w.shape) if native_forms else "onednn")
                         for w in weight.split(VOCAB_SLICE))

    forms = gemm_setting() if native_forms else "onednn"
    return derived(head, ("vocab_slices", dtype, forms, VOCAB_SLICE), [head.weight], build)


def vocab_logsumexp(head: nn.Linear, hidden: torch.Tensor, chunk: int | None = None
                    ) -> torch.Tensor:
    """log sum_v exp(hidden @ head.weight[v]) over the whole vocabulary: [N, H] -> [N] fp32.

    ``chunk``: rows per step of the plain path (default: about 4M logits per chunk)."""
    return _logsumexp(head, hidden, chunk, None)[0]


def range_logprobs(head: nn.Linear, hidden: torch.Tensor, offset: int, size: int
                   ) -> torch.Tensor:
    """Full-vocabulary log-probabilities of tokens ``offset .. offset + size - 1``:
    [N, H] -> [N, size] fp32. Their logits come from the same tiles as the log-normaliser
    (one pass over the head's weight; in one native call on the CPU in fp32)."""
    native = range_logprobs_op()
    if (native is not None and hidden.dtype == torch.float32 and head.weight.dtype == hidden.dtype
            and onednn_inference(hidden, head.weight) and hidden.shape[0]):
        return native(hidden.contiguous(), _packed_slices(head, torch.float32, True),
                      VOCAB_SLICE, offset, size)
    lse, logits = _logsumexp(head, hidden, None, (offset, size))
    return logits.sub_(lse[:, None])


def _logsumexp(head: nn.Linear, hidden: torch.Tensor, chunk: int | None,
               keep: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    # the log-normaliser [N] and, for ``keep`` = (offset, size), those columns' logits
    # [N, size] (fp32), copied from each tile before it is reduced
    n, vocab = hidden.shape[0], head.weight.shape[0]
    out = torch.empty(n, dtype=torch.float32, device=hidden.device)
    kept = None if keep is None else torch.empty(n, keep[1], dtype=torch.float32,
                                                 device=hidden.device)
    if not onednn_inference(hidden, head.weight):
        chunk = chunk or max(16, (4 << 20) // vocab)
        parts = []
        for s in range(0, n, chunk):
            logits = _logits(head, hidden[s : s + chunk])
            if kept is not None:
                kept[s : s + chunk] = logits[:, keep[0] : keep[0] + keep[1]]
            parts.append(torch.logsumexp(logits, dim=-1))
        return (torch.cat(parts) if parts else out), kept
    dtype = compute_dtype(head.weight)
    slices = _packed_slices(head, dtype)
    for start in range(0, n, ROW_BLOCK):
        rows = hidden[start : start + ROW_BLOCK].to(dtype)
        top = total = None  # running max and sum of exp(logit - max): [rows] fp32
        for i, weight in enumerate(slices):
            tile = torch.ops.mkldnn._linear_pointwise(rows, weight, None, "none", [], "")
            tile = tile.float() if tile.dtype != torch.float32 else tile  # [rows, slice]
            if kept is not None:  # the kept columns within this slice
                first = i * VOCAB_SLICE
                a, b = max(keep[0], first), min(sum(keep), first + tile.shape[1])
                if a < b:
                    kept[start : start + rows.shape[0], a - keep[0] : b - keep[0]] = tile[
                        :, a - first : b - first]
            tile_top = tile.amax(dim=-1)
            new_top = tile_top if top is None else torch.maximum(top, tile_top)
            tile_sum = tile.sub_(new_top[:, None]).exp_().sum(dim=-1)
            total = tile_sum if total is None else total.mul_((top - new_top).exp_()).add_(
                tile_sum)
            top = new_top
        out[start : start + rows.shape[0]] = total.log_().add_(top)
    return out, kept


def _logits(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    # fp32 logits of the plain path (autograd, other devices): [N, V]
    return nn.functional.linear(hidden.to(head.weight.dtype), head.weight).float()


def target_logits(head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logit of one token per row, in fp32: [N, H], targets [N] -> [N]."""
    weight = head.weight
    dtype = torch.float32 if compute_dtype(weight) == torch.float32 else weight.dtype
    return (hidden.to(dtype) * weight[targets].to(dtype)).sum(dim=-1, dtype=torch.float32)


def token_logprobs(head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[i] | hidden[i]) over the full vocabulary: [N, H], [N] -> [N] fp32."""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    return target_logits(head, hidden, targets) - vocab_logsumexp(head, hidden)
