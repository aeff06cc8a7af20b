"""The steps of a generative-retrieval search, on what they need (the catalog state, the
request limits, the search runners), never on the engine that calls them.

:meth:`genrec.engine.Engine.prepare_recommend` checks and packs a batch
(:func:`prepare_search`: prompts, packing, filters; host work, so that a server packs the next
batch while the device runs this one) and :meth:`genrec.engine.Engine.run_recommend` runs it:
:func:`run_search` (one batched constrained beam search) and :func:`top_items` (the one copy
back). Items are the catalog's rows here (:class:`RowRequest`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.catalog.filters import PartFilter
from genrec.engine.batch import PackedBatch, RequestLimits, pack_requests
from genrec.engine.inputs import InputError
from genrec.engine.params import BeamParams
from genrec.engine.requests import RowRecommendation, RowRequest
from genrec.engine.runner_pool import RunnerPool
from genrec.live_catalog.state import CatalogState


@dataclass
class PreparedSearch:
    """A batch of requests checked and packed on the host (:func:`prepare_search`), with the
    catalog state it reads."""

    catalog: CatalogState
    params: BeamParams
    batch: PackedBatch
    filters: list[PartFilter]
    requests: list[RowRequest]


def check_requests(requests: Sequence[RowRequest], catalog: CatalogState) -> None:
    """Raise ``InputError`` naming the field of the first bad request (rows outside the
    catalog, bad text tokens, nothing to recommend from)."""
    for r, req in enumerate(requests):
        field = f"requests[{r}]"
        history = list(req.history) if not isinstance(req.history, (str, bytes)) else None
        if history is None:
            raise InputError(f"{field}.history: expected a list of item ids")
        catalog.check_items(history, f"{field}.history")
        if req.text is not None:
            catalog.base_vocab.check_text(list(req.text), f"{field}.text")
        if not history and req.user_vector is None and not req.text:
            raise InputError(f"{field}.history: empty history and no user_vector")
        for name in ("exclude", "allow"):
            items = getattr(req, name)
            if items is not None:
                catalog.check_items(list(items), f"{field}.{name}")


def prompts_of(requests: Sequence[RowRequest], catalog: CatalogState) -> list[list[int]]:
    """Each request's prompt: its text, soft token and history's Semantic IDs."""
    return catalog.prompts([list(q.history) for q in requests],
                           [q.user_vector is not None for q in requests],
                           [q.text for q in requests])


def pack_prompts(requests: Sequence[RowRequest], prompts: Sequence[Sequence[int]],
                 limits: RequestLimits) -> PackedBatch:
    """The prompts packed as prefixes without branches, with the requests' user vectors."""
    return pack_requests(prompts, [[] for _ in prompts], [q.user_vector for q in requests],
                         limits, require_branches=False)


def prepare_search(requests: Sequence[RowRequest], params: BeamParams, catalog: CatalogState,
                   limits: RequestLimits) -> PreparedSearch:
    """Check ``requests`` against ``catalog`` (its vocabulary, trie and retired items) and
    ``limits`` (the model's), and build their prompts, packing and filters (raises
    ``InputError`` naming the field)."""
    check_requests(requests, catalog)
    prompts = prompts_of(requests, catalog)
    n_levels = catalog.num_levels
    for r, prompt in enumerate(prompts):
        if len(prompt) + n_levels > limits.max_positions:
            raise InputError(f"requests[{r}].history: prompt of {len(prompt)} tokens exceeds "
                             f"the model's {limits.max_positions} positions")
    batch = pack_prompts(requests, prompts, limits)
    filters = catalog.search_filters([q.allow for q in requests],
                                     [q.exclude for q in requests])
    return PreparedSearch(catalog, params, batch, filters, list(requests))


def run_search(prepared: PreparedSearch, searches: RunnerPool, embeds: torch.Tensor,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One beam search of a prepared batch whose input embeddings are ``embeds`` [T, H]:
    ``(items, scores)`` [R, beam_width] on the device (-1: no item), best first."""
    batch, catalog = prepared.batch, prepared.catalog
    result = searches.search(
        catalog.parts(), prepared.filters, catalog.level_offsets, embeds,
        batch.layout.prefix_len.tolist(), batch.prefix_last.to(device),
        prepared.params.beam_width,
    )
    return result.items, result.scores


def top_items(items: torch.Tensor, scores: torch.Tensor, n: int) -> list[RowRecommendation]:
    """The first ``n`` items [R, W] (-1 dropped) and scores of each request, in one copy back
    (non-blocking into pinned memory on a GPU, then one wait)."""
    device = items.device
    pinned = device.type == "cuda"
    items = items[:, :n].to("cpu", non_blocking=pinned)
    scores = scores[:, :n].to("cpu", non_blocking=pinned)
    if pinned:
        torch.cuda.current_stream(device).synchronize()
    out = []
    for row_items, row_scores in zip(items.tolist(), scores.tolist(), strict=True):
        keep = [k for k, item in enumerate(row_items) if item >= 0]  # -1: fewer valid items
        out.append(RowRecommendation(items=[row_items[k] for k in keep],
                                     scores=[row_scores[k] for k in keep]))
    return out
