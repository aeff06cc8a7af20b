"""Constrained beam search over Semantic IDs, on the shared-prefix + branches mechanism.

Each request's prefix is computed once into the KV cache (the *prompt forward*); every beam is
a branch carrying only its own few tokens, in fixed tail slots read through an ancestry table
(:mod:`genrec.model.beam_step`): no KV copy when beams take new parents. Each level is one
batched forward of R*B single tokens, one gather of allowed codes from the trie tensors and
one top-k over beams x codes per request: no Python loop over beams or requests, positions
computed on the device, and nothing read back to the host between the prompt forward and the
result. The levels run in a :class:`~genrec.engine.beam_runner.BeamRunner` over static
buffers (replayed as a CUDA graph on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from genrec.catalog.filters import LevelLists, PartFilter, live_edges
from genrec.catalog.trie import SemanticTrie
from genrec.kernels import beam_select_op
from genrec.model.beam_step import BeamStepLayout, advance_ancestry
from genrec.model.decoder import DecoderLM
from genrec.model.kv_cache import KVCache
from genrec.model.layout import Readout, prefix_last_layout, shared_layout

_NEG_INF = float("-inf")


@dataclass
class BeamResult:
    """Per request, best first: ``items`` int64 [R, B] (-1: no item) and ``scores`` [R, B]
    (summed log-probabilities of the item's tokens; -inf where no item)."""

    items: torch.Tensor
    scores: torch.Tensor


@dataclass
class SearchInputs:
    """What the levels of a search read (on the model's device): each request's prompt-final
    hidden state ``hidden`` [R, H], ``prefix_len`` [R] (0: a padding request), per part the
    filter lists of every level and ``restricted`` [R] (requests with an allow list)."""

    hidden: torch.Tensor
    prefix_len: torch.Tensor
    lists: list[list[LevelLists]]
    restricted: list[torch.Tensor | None]


def level_logprobs(
    model: DecoderLM, hidden: torch.Tensor, offset: int, size: int
) -> torch.Tensor:
    """Log-probabilities of a level's tokens ``offset .. offset+size-1``: hidden [N, H] ->
    [N, size] (fp32), normalised as ``model.config.sid_normalize`` says: ``"full"`` over the
    whole vocabulary (minus its log-sum-exp), ``"level"`` over these ``size`` codes alone (a
    log-softmax of their logits: only these rows of the LM head are read, never a text
    vocabulary's)."""
    if model.config.sid_normalize == "level":
        return torch.log_softmax(model.range_logits(hidden, offset, size), dim=-1)
    return model.range_logprobs(hidden, offset, size)


def prompt_forward(
    model: DecoderLM, embeds: torch.Tensor, prefix_lens: list[int], prefix_last: torch.Tensor,
    cache: KVCache,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts' forward into ``cache`` (its first ``len(prefix_lens)`` requests; its
    prefix capacity may exceed the longest prompt): embeds [T, H] packed prompt after prompt,
    ``prefix_last`` [R] each prompt's last row -> the final hidden state of each [R, H] and
    the prefix lengths [R] on the device. The last layer runs its attention output and MLP
    for those rows only."""
    cap = cache.prefix_capacity
    layout = shared_layout(prefix_lens, [], [], prefix_cap=cap).to(embeds.device)
    readout = Readout(prefix_last, prefix_last_layout(prefix_lens, cap).to(embeds.device))
    view = cache.requests(0, len(prefix_lens))
    return model(embeds, layout.positions, layout, view, readout=readout), layout.prefix_len


def select_beams(
    logp: torch.Tensor, scores: torch.Tensor, edges: list[torch.Tensor], width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One level's choice: per request the ``width`` best (beam, code) pairs by score +
    log-probability where some part has an edge. logp [R*B, K], scores [R, B], edges per part
    [R, B, K] (-1: none) -> top scores [R, W] (W = min(width, B*K), best first, -inf past the
    allowed pairs), parent beam and code [R, W], per part the chosen edges [R, W] (-1 where
    the score is -inf). One native pass on the CPU; tensor operations elsewhere."""
    native = beam_select_op() if logp.device.type == "cpu" else None
    if native is not None and logp.dtype == torch.float32:
        top, parent, code, *nodes = native(logp, scores, edges, width)
        return top, parent, code, nodes
    n_req, beams = scores.shape
    size = logp.shape[1]
    ok = edges[0] >= 0
    for e in edges[1:]:
        ok = ok | (e >= 0)
    cand = scores[:, :, None] + torch.where(ok, logp.view(n_req, beams, size), _NEG_INF)
    top, idx = cand.view(n_req, -1).topk(min(width, beams * size), dim=1)  # [R, W]
    dead = torch.isinf(top)
    # edge id at level l == node id at level l + 1 (see catalog.trie)
    nodes = [e.view(n_req, -1).gather(1, idx).to(torch.long).masked_fill(dead, -1)
             for e in edges]
    return top, idx // size, idx % size, nodes


def search_levels(
    model: DecoderLM, parts: list[SemanticTrie], level_offsets: list[int], width: int,
    inputs: SearchInputs, cache: KVCache, ancestry: torch.Tensor,
) -> BeamResult:
    """Every level of a search after the prompt forward, over ``cache`` (prompts written;
    tail part [R * width, levels - 1]) and the identity ``ancestry`` [R * width, levels - 1].

    ``parts``: the tries searched together (a catalog's base and delta; a prefix present in
    both is one beam holding a node of each). Scores are summed full-vocabulary
    log-probabilities and a code is allowed only where some returnable item lies below it, so
    with ``width`` >= the number of allowed items the result is the exact top of all items.
    Static shapes and no host sync: the body of a captured graph."""
    sizes = parts[0].codebook_sizes
    n_req, levels = inputs.hidden.shape[0], len(sizes)
    device = inputs.hidden.device
    rows = torch.arange(n_req, device=device)[:, None] * width  # [R, 1] first beam of each
    # Level 0: every request starts from the root (node 0 of every part) with one live beam.
    logp = level_logprobs(model, inputs.hidden, level_offsets[0], sizes[0])
    nodes = [torch.zeros(n_req, 1, dtype=torch.long, device=device) for _ in parts]
    scores = torch.zeros(n_req, 1, device=device)
    for level in range(levels):
        # per part: the edge of each (beam, code), -1 where it leads to no returnable item
        edges = []
        for p, part in enumerate(parts):
            e = part.expand(level, nodes[p])
            lists = inputs.lists[p][level]
            if any(t is not None for t in lists):  # else every edge leads to live items
                e = torch.where(live_edges(lists, inputs.restricted[p], e), e, -1)
            edges.append(e)
        top, parent, code, nodes = select_beams(logp, scores, edges, width)
        scores = top
        if level + 1 == levels:
            break
        if top.shape[1] < width:  # level 0 had fewer codes than beams: pad with dead beams
            pad = width - top.shape[1]
            nodes = [F.pad(n, (0, pad), value=-1) for n in nodes]
            scores = F.pad(scores, (0, pad), value=_NEG_INF)
            parent, code = F.pad(parent, (0, pad)), F.pad(code, (0, pad))
        if level > 0:  # beams take their parents' tails (the level-0 beams share the root)
            ancestry = advance_ancestry(ancestry, (rows + parent).reshape(-1), level)
        tokens = (code + level_offsets[level]).reshape(-1)
        step = BeamStepLayout(inputs.prefix_len, ancestry, width, level + 1, levels - 1)
        # the embedding rows by index_select (inference: the module call costs more here)
        embeds = model.model.embed_tokens.weight.index_select(0, tokens)
        hidden = model(embeds, None, step, cache)
        logp = level_logprobs(model, hidden, level_offsets[level + 1], sizes[level + 1])
    items = parts[0].leaf_items(nodes[0])
    for part, n in zip(parts[1:], nodes[1:], strict=True):
        items = torch.where(n >= 0, part.leaf_items(n), items)
    if items.shape[1] < width:  # one level with fewer codes than beams
        items = F.pad(items, (0, width - items.shape[1]), value=-1)
        scores = F.pad(scores, (0, width - scores.shape[1]), value=_NEG_INF)
    return BeamResult(items=items, scores=scores)


def filter_inputs(parts: list[SemanticTrie], filters: list[PartFilter]
                  ) -> tuple[list[list[LevelLists]], list[torch.Tensor | None]]:
    """Per part, the filter lists of every level and the ``restricted`` flags."""
    lists = [[f.level_lists(p, level) for level in range(p.num_levels)]
             for p, f in zip(parts, filters, strict=True)]
    return lists, [f.restricted for f in filters]
