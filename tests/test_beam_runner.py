"""Beam-search runners: the KV-indirection search equals the reordering search it replaced,
request buckets pad without changing results, buffers are reused across calls, bounded."""

from __future__ import annotations

import pytest
import torch
from beam_reference import constrained_beam_search as reordering_search

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.engine.beam_runner import bucket
from genrec.engine.search_buffers import prefix_bucket
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [6, 5, 4]
N_ITEMS = 60


def _engine(**config: object) -> Engine:
    g = torch.Generator().manual_seed(0)
    ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(ids[torch.randperm(ids.shape[0], generator=g)[:N_ITEMS]], SIZES)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, user_dim=3, max_position_embeddings=128)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID, **config),
                  vocab=SidVocab(index, max_history=12))


def _requests() -> list[RowRequest]:
    return [
        RowRequest([3, 17, 8]),
        RowRequest([1], user_vector=[0.5, -1.0, 0.2]),
        RowRequest([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], exclude=[0, 1, 2, 40]),
        RowRequest([20, 21], allow=[4, 9, 30, 31, 55]),
    ]


def _with_delta(engine: Engine) -> None:
    # retired items and moved / new items in the catalog's delta part
    cat = engine.catalog
    free = [c for c in torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
            if int(cat.lookup(torch.tensor(c))) < 0]
    engine.set_catalog(cat.updated([(N_ITEMS, free[0]), (7, free[1])], retire=[3, 26]))


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
    engine = _engine()
    if delta:
        _with_delta(engine)
    requests = _requests()
    items, scores = _reference(engine, requests, width)
    got = engine.recommend_rows(requests, BeamParams(width, width))
    for r, rec in enumerate(got):
        keep = items[r] >= 0
        assert rec.items == items[r][keep].tolist()
        # native: the search's layers run in one native call (sums in another order than
        # the reference's PyTorch layers); torch: one softmax over both key sets instead of a
        # log-sum-exp merge
        assert torch.allclose(torch.tensor(rec.scores), scores[r][keep], atol=1e-5)


def test_request_buckets_pad_without_changing_results() -> None:
    exact, padded = _engine(), _engine(search_request_buckets=(2, 8))
    params = BeamParams(6, 6)
    for n in (1, 3, 4):
        want = exact.recommend_rows(_requests()[:n], params)
        got = padded.recommend_rows(_requests()[:n], params)
        assert [r.items for r in got] == [r.items for r in want]
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(torch.tensor(a.scores), torch.tensor(b.scores), atol=1e-6)
    rows = sorted(b.requests for b in padded.searches.kept_buffers())
    assert rows == [2, 8]  # 1 -> 2, 3 and 4 -> 8
    # above the largest bucket: its own size
    many = padded.recommend_rows(_requests() * 3, params)
    want = exact.recommend_rows(_requests() * 3, params)
    assert [r.items for r in many] == [r.items for r in want]
    assert 12 in {b.requests for b in padded.searches.kept_buffers()}


def test_buffers_are_reused_across_calls() -> None:
    engine = _engine()
    params = BeamParams(4, 4)
    first = engine.recommend_rows(_requests()[:2], params)
    [buffers] = engine.searches.kept_buffers()
    pointers = [t.data_ptr() for t in buffers.cache.prefix_k + buffers.cache.branch_v]
    # other prompts of the same shape bucket: the same buffers and runner
    other = [RowRequest([9, 10, 11]), RowRequest([2, 4])]
    engine.recommend_rows(other, params)
    assert list(engine.searches.kept_buffers()) == [buffers]
    assert len(engine.searches.kept_runners()) == 1
    assert [t.data_ptr() for t in buffers.cache.prefix_k + buffers.cache.branch_v] == pointers
    assert [r.items for r in engine.recommend_rows(_requests()[:2], params)] == [
        r.items for r in first]
    # a new catalog version: a new runner (its tries), the same buffers
    _with_delta(engine)
    engine.recommend_rows(_requests()[:2], params)
    assert list(engine.searches.kept_buffers()) == [buffers]
    assert len(engine.searches.kept_runners()) == 2


def test_runners_are_bounded() -> None:
    engine = _engine(max_search_runners=2)
    for width in (2, 3, 4):
        engine.recommend_rows(_requests()[:1], BeamParams(width, 1))
    assert len(engine.searches.kept_buffers()) == 2 and len(engine.searches.kept_runners()) == 2
    assert {b.width for b in engine.searches.kept_buffers()} == {3, 4}


def test_buckets() -> None:
    assert bucket(3, None) == 3 and bucket(3, (1, 2, 4)) == 4 and bucket(5, (1, 2, 4)) is None
    assert [prefix_bucket(n) for n in (1, 64, 65, 200)] == [64, 64, 128, 256]


@pytest.mark.parametrize("graphs_like", [False, True])
def test_search_reads_nothing_back_to_the_host(monkeypatch: pytest.MonkeyPatch,
                                               graphs_like: bool) -> None:
    # the path a GPU takes (portable attention), under the trap from the prompt forward to
    # the [R, width] result; filters and the delta part included
    from genrec.model import attention
    from genrec.utils.sync_trap import HostSyncError, no_host_sync

    monkeypatch.setattr(attention, "cascade_attention_op", lambda: None)
    engine = _engine(search_request_buckets=(8,) if graphs_like else None)
    _with_delta(engine)
    requests = _requests()
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


def test_buffers_are_bounded_in_bytes() -> None:
    probe = _engine()
    probe.recommend_rows(_requests()[:2], BeamParams(4, 1))
    [two] = probe.searches.kept_buffers()
    # room for the larger set only: it drops the first (and its runner); kept buffers take
    # half the memory budget
    engine = _engine(memory_budget_bytes=2 * two.nbytes())
    engine.recommend_rows(_requests()[:1], BeamParams(4, 1))
    engine.recommend_rows(_requests()[:2], BeamParams(4, 1))
    assert [b.requests for b in engine.searches.kept_buffers()] == [2]
    assert all(r.buffers.requests == 2 for r in engine.searches.kept_runners())
    # a set above the bound still runs, and is not kept after its search
    tiny = _engine(memory_budget_bytes=1)
    assert tiny.recommend_rows(_requests(), BeamParams(4, 2))[0].items
    assert not tiny.searches.kept_buffers() and not tiny.searches.kept_runners()


def test_buffer_bytes_are_known_before_allocating() -> None:
    engine = _engine()
    engine.recommend_rows(_requests(), BeamParams(8, 3))
    stats = engine.searches.stats()
    assert stats.buffer_sets == 1 and stats.runners == 1 and stats.runners_made == 1
    longest = max(len(engine.catalog.prompts([r.history], [r.user_vector is not None])[0])
                  for r in _requests())
    assert stats.bytes == engine.searches.buffer_bytes(
        len(_requests()), 8, prefix_bucket(longest), len(SIZES))


@pytest.mark.parametrize("fits", [True, False])
def test_runner_is_reused_across_calls_within_the_budget(fits: bool) -> None:
    # the runner (on CUDA its captured graph) serves every call of a shape whose buffers fit
    # the budget's share; a shape above it is made again at each call
    probe = _engine()
    probe.recommend_rows(_requests(), BeamParams(8, 3))
    need = probe.searches.stats().bytes
    engine = _engine(memory_budget_bytes=2 * need if fits else 2 * need - 2)
    assert engine.searches.keeps(len(_requests()), 8, 64, len(SIZES)) is fits
    first = engine.recommend_rows(_requests(), BeamParams(8, 3))
    for _ in range(2):
        assert [r.items for r in engine.recommend_rows(_requests(), BeamParams(8, 3))] == [
            r.items for r in first]
    assert engine.searches.stats().runners_made == (1 if fits else 3)


def test_benchmark_shapes_keep_their_buffers_on_an_h200() -> None:
    # bench/gpu.py's beam search: Qwen3-1.7B shape (28 layers, 8 KV heads of 128, bf16), 32
    # requests of 1,001-token prompts (prefix bucket 1024), width 256, 4 levels: ~6.1 GiB of
    # buffers, over the 2 GiB a fixed bound allowed; within the budget an H200 gives (0.8 of
    # ~135 GiB free after the weights)
    from genrec.engine.memory import GIB, MemoryBudget
    from genrec.engine.search_buffers import SearchBuffers

    cfg = ModelConfig(vocab_size=1027, hidden_size=2048, intermediate_size=6144,
                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, max_position_embeddings=4096)
    need = SearchBuffers.bytes_for(cfg, torch.bfloat16, 32, 256, prefix_bucket(1001), 4)
    assert 6 * GIB < need < 6.5 * GIB
    h200 = MemoryBudget(int(0.8 * 135 * GIB), 135 * GIB, 0.8, "cuda:0 free")
    assert need <= h200.search_buffers
