"""Bench-only copy of genrec's previous generative catalog and beam search (git 4cd0c2c:
``CatalogState`` with a full rebuild per update, ``constrained_beam_search`` over the dense
trie, ``recommend_batch``), driving genrec's current model exactly as genrec's search does
(same layouts, KV cache, read-out and level log-probabilities). The baseline of
``bench/catalog.py``; not genrec code.

One deliberate difference from 4cd0c2c: prompts are built by a tensor lookup of the codes (as
genrec now does) instead of ``SidVocab.prompt``'s per-item Python lists, so that the two
sides differ in the trie and the filters only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from _dense_trie import DenseTrie, allowed_codes, build_item_mask, ranked_prefix_counts

from genrec.catalog.semantic_ids import duplicate_groups
from genrec.engine.beam import BeamResult, level_logprobs, prompt_forward
from genrec.engine.engine import Engine
from genrec.engine.params import BeamParams
from genrec.engine.requests import RowRecommendation, RowRequest
from genrec.model.beam_step import BeamStepLayout, advance_ancestry
from genrec.model.decoder import DecoderLM
from genrec.model.kv_cache import KVCache
from genrec.model.layout import AttentionLayout
from genrec.vocab.sid_vocab import BOS_ID

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class DenseCatalog:
    """The old catalog state: ``codes`` [N, L] of every item, its dense ``trie``, ``active``
    bool [N] (``None``: all live) and ``active_counts`` (ranked prefix counts of ``active``)."""

    codes: torch.Tensor
    codebook_sizes: list[int]
    trie: DenseTrie
    active: torch.Tensor | None = None
    active_counts: torch.Tensor | None = None

    @classmethod
    def build(cls, codes: torch.Tensor, sizes: Sequence[int],
              active: torch.Tensor | None = None) -> DenseCatalog:
        """The old ``CatalogState.build``: the dense trie and the live items' prefix counts."""
        trie = DenseTrie.from_codes(codes, sizes)
        counts = None
        if active is not None and not bool(active.all()):
            counts = ranked_prefix_counts(trie, active[None])
        else:
            active = None
        return cls(codes, list(sizes), trie, active, counts)

    @property
    def num_items(self) -> int:
        """Items in the catalog, retired ones included."""
        return int(self.codes.shape[0])

    def nbytes(self) -> int:
        """Bytes of the state's tensors (codes, trie, live mask and its counts)."""
        extra = [t for t in (self.codes, self.active, self.active_counts) if t is not None]
        return self.trie.nbytes() + sum(t.numel() * t.element_size() for t in extra)

    def updated(self, upsert: Sequence[tuple[int, Sequence[int]]] = (),
                retire: Sequence[int] = ()) -> DenseCatalog:
        """The old ``CatalogState.updated``: validation, a new code table, then a full rebuild
        (its field-naming error messages shortened; the work is the same)."""
        n, levels = self.codes.shape
        rows = {}
        for k, (item, sid) in enumerate(upsert):
            codes = list(sid)
            if len(codes) != levels or item in rows:
                raise ValueError(f"upsert[{k}]: bad entry")
            for c, size in zip(codes, self.codebook_sizes, strict=True):
                if not 0 <= c < size:
                    raise ValueError(f"upsert[{k}]: code {c} out of range")
            rows[item] = codes
        new_ids = sorted(i for i in rows if i >= n)
        if new_ids != list(range(n, n + len(new_ids))):
            raise ValueError("new items must take the next ids in order")
        total = n + len(new_ids)
        if any(not 0 <= i < total for i in retire):
            raise ValueError("unknown item id in retire")
        codes = torch.cat([self.codes, torch.zeros(len(new_ids), levels, dtype=torch.int64)])
        changed = torch.zeros(total, dtype=torch.bool)
        if rows:
            ids = torch.tensor(list(rows), dtype=torch.long)
            codes[ids] = torch.tensor(list(rows.values()), dtype=torch.int64)
            changed[ids] = True
        for group in duplicate_groups(codes):
            if any(changed[i] for i in group):
                raise ValueError(f"Semantic ID {codes[group[0]].tolist()} is taken")
        active = torch.ones(total, dtype=torch.bool)
        if self.active is not None:
            active[:n] = self.active
        active[changed] = True
        if len(retire):
            active[torch.tensor(list(retire), dtype=torch.long)] = False
        return DenseCatalog.build(codes, self.codebook_sizes, active)

    def filter_counts(self, allow: Sequence[Sequence[int] | None],
                      exclude: Sequence[Sequence[int] | None]) -> torch.Tensor | None:
        """Ranked prefix counts [R, N + 1] of the requests' item masks (``None``: nothing is
        filtered)."""
        if all(a is None for a in allow) and not any(exclude):
            if self.active_counts is None:
                return None
            return self.active_counts.expand(len(allow), -1)
        mask = build_item_mask(self.num_items, allow, exclude, self.active)
        return ranked_prefix_counts(self.trie, mask)


@torch.inference_mode()
def dense_beam_search(
    model: DecoderLM, trie: DenseTrie, level_offsets: list[int], embeds: torch.Tensor,
    prefix_layout: AttentionLayout, prefix_last: torch.Tensor, beam_width: int,
    item_counts: torch.Tensor | None = None,
) -> BeamResult:
    """The old ``constrained_beam_search`` loop over the dense trie (the engine's own prompt
    forward and beam steps: only the catalog side is the old one)."""
    device = embeds.device
    n_req, width, levels = prefix_layout.num_requests, beam_width, trie.num_levels
    sizes = trie.codebook_sizes
    cfg = model.config
    cache = KVCache(cfg.num_hidden_layers, n_req, prefix_layout.prefix_cap, n_req * width,
                    levels - 1, cfg.num_key_value_heads, cfg.head_dim, model.dtype, device)
    hidden, prefix_len = prompt_forward(model, embeds, prefix_layout.prefix_len.tolist(),
                                        prefix_last, cache)
    ancestry = torch.arange(n_req * width, device=device)[:, None].repeat(1, levels - 1)
    rows = torch.arange(n_req, device=device)[:, None] * width
    logp = level_logprobs(model, hidden, level_offsets[0], sizes[0])
    nodes = torch.zeros(n_req, 1, dtype=torch.long, device=device)
    scores = torch.zeros(n_req, 1, device=device)
    for level in range(levels):
        size = sizes[level]
        ok = allowed_codes(trie, level, nodes, counts=item_counts)  # [R, b, K]
        cand = scores[:, :, None] + torch.where(ok, logp.view(ok.shape), _NEG_INF)
        top, idx = cand.view(n_req, -1).topk(min(width, cand[0].numel()), dim=1)
        parent, code = idx // size, idx % size
        prev = nodes.gather(1, parent).clamp(min=0)
        dead = torch.isinf(top)
        table = trie.child[level] if level + 1 < levels else trie.leaf_item
        nodes = table[prev, code].masked_fill(dead, -1)
        scores = top
        if level + 1 == levels:
            break
        if top.shape[1] < width:
            pad = width - top.shape[1]
            nodes = F.pad(nodes, (0, pad), value=-1)
            scores = F.pad(scores, (0, pad), value=_NEG_INF)
            parent, code = F.pad(parent, (0, pad)), F.pad(code, (0, pad))
        if level > 0:
            ancestry = advance_ancestry(ancestry, (rows + parent).reshape(-1), level)
        tokens = (code + level_offsets[level]).reshape(-1)
        step = BeamStepLayout(prefix_len, ancestry, width, level + 1, levels - 1)
        hidden = model(model.model.embed_tokens(tokens), step.positions(), step, cache)
        logp = level_logprobs(model, hidden, level_offsets[level + 1], sizes[level + 1])
    return BeamResult(items=nodes, scores=scores)


def dense_recommend(engine: Engine, catalog: DenseCatalog, requests: Sequence[RowRequest],
                    params: BeamParams, level_offsets: list[int], max_history: int
                    ) -> list[RowRecommendation]:
    """The old ``recommend_batch`` on a :class:`DenseCatalog` (histories only, no user
    vectors; the request checks are the bench's job)."""
    offsets = torch.tensor(level_offsets, dtype=torch.int64)
    hists = [list(q.history)[-max_history:] for q in requests]
    flat = torch.tensor([i for h in hists for i in h], dtype=torch.int64)
    tokens = (catalog.codes[flat] + offsets).tolist()
    prompts, at = [], 0
    for h in hists:
        prompts.append([BOS_ID] + [t for row in tokens[at : at + len(h)] for t in row])
        at += len(h)
    batch = engine.pack(prompts, [[] for _ in prompts], [None] * len(prompts),
                        require_branches=False)
    counts = catalog.filter_counts([q.allow for q in requests], [q.exclude for q in requests])
    result = dense_beam_search(engine.model, catalog.trie, level_offsets, engine.embed(batch),
                               batch.layout, batch.prefix_last, params.beam_width, counts)
    items, scores = result.items[:, : params.n], result.scores[:, : params.n]
    out = []
    for row_items, row_scores in zip(items.tolist(), scores.tolist(), strict=True):
        keep = [k for k, item in enumerate(row_items) if item >= 0]
        out.append(RowRecommendation(items=[row_items[k] for k in keep],
                                  scores=[row_scores[k] for k in keep]))
    return out

