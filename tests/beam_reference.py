"""Reference: genrec's beam search before the KV indirection (beams reorder their cached
tails by parent at every level), kept to check the engine's search equals it exactly.

Constrained beam search over Semantic IDs, on the shared-prefix + branches mechanism.

Each request's prefix is computed once into the KV cache; every beam is a branch carrying
only its own few tokens. Each level is one batched forward of R*B single tokens, one gather
of allowed codes from the trie tensors and one top-k over beams x codes per request: no Python
loop over beams or requests, and nothing read back to the host until the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from genrec.catalog.filters import PartFilter
from genrec.catalog.trie import SemanticTrie
from genrec.model.decoder import DecoderLM
from genrec.model.kv_cache import KVCache
from genrec.model.layout import AttentionLayout, Readout, prefix_last_layout, shared_layout

_NEG_INF = float("-inf")


@dataclass
class BeamResult:
    """Per request, best first: ``items`` int64 [R, B] (-1: no item) and ``scores`` [R, B]
    (summed log-probabilities of the item's tokens; -inf where no item)."""

    items: torch.Tensor
    scores: torch.Tensor


def level_logprobs(
    model: DecoderLM, hidden: torch.Tensor, offset: int, size: int
) -> torch.Tensor:
    """Full-vocabulary log-probabilities of the tokens ``offset .. offset+size-1``:
    hidden [N, H] -> [N, size] (fp32)."""
    ids = torch.arange(offset, offset + size, device=hidden.device)
    return model.label_logits(hidden, ids) - model.log_normalizer(hidden)[:, None]


def search_layouts(
    prefix_lens: list[int], prefix_cap: int, beam_width: int, levels: int,
    device: torch.device,
) -> tuple[AttentionLayout, list[AttentionLayout]]:
    """The layouts a search needs besides its prompts', on ``device``: the read-out of each
    prompt's last row, and the decode steps (level 1 .. levels-1: one new token per beam).
    Built through :func:`shared_layout`, so a recurring request shape reuses them."""
    n_beams = len(prefix_lens) * beam_width
    branch_req = [r for r in range(len(prefix_lens)) for _ in range(beam_width)]
    steps = [
        shared_layout(
            [0] * len(prefix_lens), branch_req, [1] * n_beams, prefix_cached=prefix_lens,
            branch_cached=[level - 1] * n_beams, branch_cap=levels - 1,
        ).to(device)
        for level in range(1, levels)
    ]
    return prefix_last_layout(prefix_lens, prefix_cap).to(device), steps


@torch.inference_mode()
def constrained_beam_search(
    model: DecoderLM,
    parts: list[SemanticTrie],
    filters: list[PartFilter],
    level_offsets: list[int],
    embeds: torch.Tensor,
    prefix_layout: AttentionLayout,
    prefix_last: torch.Tensor,
    beam_width: int,
) -> BeamResult:
    """Beam search of width ``beam_width`` over the catalog's tries for a batch of prefixes.

    ``parts``: the tries searched together (a catalog's base and delta; a prefix present in
    both is one beam holding a node of each), ``filters`` what each may return
    (:class:`~genrec.catalog.filters.PartFilter`). ``embeds`` [T, H] and ``prefix_layout``
    (prefixes only, on the model's device) describe the prompts; ``prefix_last`` [R] is each
    prompt's last packed row. Scores are summed full-vocabulary log-probabilities and a code is
    allowed only where some returnable item lies below it, so with ``beam_width`` >= the
    number of allowed items the result is the exact top of all items.
    """
    device = embeds.device
    sizes = parts[0].codebook_sizes
    n_req, width, levels = prefix_layout.num_requests, beam_width, len(sizes)
    readout_layout, layouts = search_layouts(
        prefix_layout.prefix_len.tolist(), prefix_layout.prefix_cap, width, levels, device
    )
    cache = model.new_cache(prefix_layout, num_branches=n_req * width, branch_cap=levels - 1)
    # The last layer runs its attention output and MLP for each prompt's last row only.
    readout = Readout(rows=prefix_last, layout=readout_layout)
    hidden = model(embeds, prefix_layout.positions, prefix_layout, cache, readout=readout)
    rows = torch.arange(n_req, device=device)[:, None] * width  # [R, 1] first beam of each

    # Level 0: every request starts from the root (node 0 of every part) with one live beam.
    logp = level_logprobs(model, hidden, level_offsets[0], sizes[0])
    nodes = [torch.zeros(n_req, 1, dtype=torch.long, device=device) for _ in parts]
    scores = torch.zeros(n_req, 1, device=device)
    for level in range(levels):
        size, beams = sizes[level], scores.shape[1]
        # per part: the edge of each (beam, code), -1 where it leads to no returnable item
        edges = [torch.where(flt.live(part, level, e), e, -1) for part, flt, e in
                 ((p, f, p.expand(level, n)) for p, f, n in zip(parts, filters, nodes,
                                                                strict=True))]
        ok = edges[0] >= 0
        for e in edges[1:]:
            ok = ok | (e >= 0)
        cand = scores[:, :, None] + torch.where(ok, logp.view(n_req, beams, size), _NEG_INF)
        top, idx = cand.view(n_req, -1).topk(min(width, beams * size), dim=1)  # [R, B]
        parent, code = idx // size, idx % size
        dead = torch.isinf(top)
        # edge id at level l == node id at level l + 1 (see catalog.trie)
        nodes = [e.view(n_req, -1).gather(1, idx).to(torch.long).masked_fill(dead, -1)
                 for e in edges]
        scores = top
        if level + 1 == levels:
            break
        if top.shape[1] < width:  # level 0 had fewer codes than beams: pad with dead beams
            pad = width - top.shape[1]
            nodes = [F.pad(n, (0, pad), value=-1) for n in nodes]
            scores = F.pad(scores, (0, pad), value=_NEG_INF)
            parent, code = F.pad(parent, (0, pad)), F.pad(code, (0, pad))
        if level > 0:
            reorder_branches(cache, (rows + parent).reshape(-1))
        tokens = (code + level_offsets[level]).reshape(-1)
        layout = layouts[level]
        hidden = model(model.model.embed_tokens(tokens), layout.positions, layout, cache)
        logp = level_logprobs(model, hidden, level_offsets[level + 1], sizes[level + 1])
    items = parts[0].leaf_items(nodes[0])
    for part, n in zip(parts[1:], nodes[1:], strict=True):
        items = torch.where(n >= 0, part.leaf_items(n), items)
    return BeamResult(items=items, scores=scores)


def reorder_branches(cache: KVCache, order: torch.Tensor) -> None:
    """Branch b takes the cached tail of branch ``order[b]`` (beam reordering)."""
    for store in (cache.branch_k, cache.branch_v):
        for layer in range(len(store)):
            store[layer] = store[layer].index_select(0, order)
