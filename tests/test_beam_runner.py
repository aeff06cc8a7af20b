"""Beam-search runners: the KV-indirection search equals the reordering search it replaced
(with filters, a soft token and a catalog delta), and reads nothing back to the host."""

from __future__ import annotations

import pytest
import torch
from beam_reference import constrained_beam_search as reordering_search
from runner_support import add_delta, sample_requests, small_engine

from genrec import BeamParams, Engine
from genrec.engine import RowRequest


def _reference(engine: Engine, requests: list[RowRequest], width: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    cat = engine.catalog
    prompts = cat.prompts([list(r.history) for r in requests],
                          [r.user_vector is not None for r in requests])
    batch = engine.pack(prompts, [[] for _ in prompts], [r.user_vector for r in requests],
                        require_branches=False)
    filters = cat.search_filters([r.allow for r in requests], [r.exclude for r in requests])
    out = reordering_search(engine.model, cat.parts(), filters, cat.level_offsets,
                            engine.embed(batch), batch.layout, batch.prefix_last, width)
    return out.items, out.scores


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("width", [1, 5, 32])
def test_search_equals_the_reordering_search(attention_path: str, width: int,
                                             delta: bool) -> None:
    engine = small_engine()
    if delta:
        add_delta(engine)
    requests = sample_requests()
    items, scores = _reference(engine, requests, width)
    got = engine.recommend_rows(requests, BeamParams(width, width))
    for r, rec in enumerate(got):
        keep = items[r] >= 0
        assert rec.items == items[r][keep].tolist()
        # native: the search's layers run in one native call (sums in another order than
        # the reference's PyTorch layers); torch: one softmax over both key sets instead of a
        # log-sum-exp merge
        assert torch.allclose(torch.tensor(rec.scores), scores[r][keep], atol=1e-5)


@pytest.mark.parametrize("graphs_like", [False, True])
def test_search_reads_nothing_back_to_the_host(monkeypatch: pytest.MonkeyPatch,
                                               graphs_like: bool) -> None:
    # the path a GPU takes (portable attention), under the trap from the prompt forward to
    # the [R, width] result; filters and the delta part included
    from genrec.model import attention
    from genrec.utils.sync_trap import HostSyncError, no_host_sync

    monkeypatch.setattr(attention, "cascade_attention_op", lambda: None)
    engine = small_engine(search_request_buckets=(8,) if graphs_like else None)
    add_delta(engine)
    requests = sample_requests()
    want = engine.recommend_rows(requests, BeamParams(8, 8))  # warm: probes, memoised layouts
    prepared = engine.prepare_recommend(requests, BeamParams(8, 8))
    cat, batch = prepared.catalog, prepared.batch
    args = (cat.parts(), prepared.filters, cat.level_offsets, engine.embed(batch),
            batch.layout.prefix_len.tolist(), batch.prefix_last, 8)
    with no_host_sync():
        out = engine.searches.search(*args)
    for r, rec in enumerate(want):
        assert out.items[r][: len(rec.items)].tolist() == rec.items
    with pytest.raises(HostSyncError), no_host_sync():
        out.items.tolist()
