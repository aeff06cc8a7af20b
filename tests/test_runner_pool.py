"""The runner pool: request buckets pad without changing results; buffers and runners are
reused across calls and bounded in count and bytes."""

from __future__ import annotations

import pytest
import torch
from runner_support import SIZES, add_delta, sample_requests, small_engine

from genrec import BeamParams
from genrec.engine import RowRequest
from genrec.engine.runner_pool import bucket
from genrec.engine.search_buffers import prefix_bucket
from genrec.model import ModelConfig


def test_request_buckets_pad_without_changing_results() -> None:
    exact, padded = small_engine(), small_engine(search_request_buckets=(2, 8))
    params = BeamParams(6, 6)
    for n in (1, 3, 4):
        want = exact.recommend_rows(sample_requests()[:n], params)
        got = padded.recommend_rows(sample_requests()[:n], params)
        assert [r.items for r in got] == [r.items for r in want]
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(torch.tensor(a.scores), torch.tensor(b.scores), atol=1e-6)
    rows = sorted(b.requests for b in padded.searches.kept_buffers())
    assert rows == [2, 8]  # 1 -> 2, 3 and 4 -> 8
    # above the largest bucket: its own size
    many = padded.recommend_rows(sample_requests() * 3, params)
    want = exact.recommend_rows(sample_requests() * 3, params)
    assert [r.items for r in many] == [r.items for r in want]
    assert 12 in {b.requests for b in padded.searches.kept_buffers()}


def test_buffers_are_reused_across_calls() -> None:
    engine = small_engine()
    params = BeamParams(4, 4)
    first = engine.recommend_rows(sample_requests()[:2], params)
    [buffers] = engine.searches.kept_buffers()
    pointers = [t.data_ptr() for t in buffers.cache.prefix_k + buffers.cache.branch_v]
    # other prompts of the same shape bucket: the same buffers and runner
    other = [RowRequest([9, 10, 11]), RowRequest([2, 4])]
    engine.recommend_rows(other, params)
    assert list(engine.searches.kept_buffers()) == [buffers]
    assert len(engine.searches.kept_runners()) == 1
    assert [t.data_ptr() for t in buffers.cache.prefix_k + buffers.cache.branch_v] == pointers
    assert [r.items for r in engine.recommend_rows(sample_requests()[:2], params)] == [
        r.items for r in first]
    # a new catalog version: a new runner (its tries), the same buffers
    add_delta(engine)
    engine.recommend_rows(sample_requests()[:2], params)
    assert list(engine.searches.kept_buffers()) == [buffers]
    assert len(engine.searches.kept_runners()) == 2


def test_runners_are_bounded() -> None:
    engine = small_engine(max_search_runners=2)
    for width in (2, 3, 4):
        engine.recommend_rows(sample_requests()[:1], BeamParams(width, 1))
    assert len(engine.searches.kept_buffers()) == 2 and len(engine.searches.kept_runners()) == 2
    assert {b.width for b in engine.searches.kept_buffers()} == {3, 4}


def test_buckets() -> None:
    assert bucket(3, None) == 3 and bucket(3, (1, 2, 4)) == 4 and bucket(5, (1, 2, 4)) is None
    assert [prefix_bucket(n) for n in (1, 64, 65, 200)] == [64, 64, 128, 256]


def test_buffers_are_bounded_in_bytes() -> None:
    probe = small_engine()
    probe.recommend_rows(sample_requests()[:2], BeamParams(4, 1))
    [two] = probe.searches.kept_buffers()
    # room for the larger set only: it drops the first (and its runner); kept buffers take
    # half the memory budget
    engine = small_engine(memory_budget_bytes=2 * two.nbytes())
    engine.recommend_rows(sample_requests()[:1], BeamParams(4, 1))
    engine.recommend_rows(sample_requests()[:2], BeamParams(4, 1))
    assert [b.requests for b in engine.searches.kept_buffers()] == [2]
    assert all(r.buffers.requests == 2 for r in engine.searches.kept_runners())
    # a set above the bound still runs, and is not kept after its search
    tiny = small_engine(memory_budget_bytes=1)
    assert tiny.recommend_rows(sample_requests(), BeamParams(4, 2))[0].items
    assert not tiny.searches.kept_buffers() and not tiny.searches.kept_runners()


def test_buffer_bytes_are_known_before_allocating() -> None:
    engine = small_engine()
    engine.recommend_rows(sample_requests(), BeamParams(8, 3))
    stats = engine.searches.stats()
    assert stats.buffer_sets == 1 and stats.runners == 1 and stats.runners_made == 1
    longest = max(len(engine.catalog.prompts([r.history], [r.user_vector is not None])[0])
                  for r in sample_requests())
    assert stats.bytes == engine.searches.buffer_bytes(
        len(sample_requests()), 8, prefix_bucket(longest), len(SIZES))


@pytest.mark.parametrize("fits", [True, False])
def test_runner_is_reused_across_calls_within_the_budget(fits: bool) -> None:
    # the runner (on CUDA its captured graph) serves every call of a shape whose buffers fit
    # the budget's share; a shape above it is made again at each call
    probe = small_engine()
    probe.recommend_rows(sample_requests(), BeamParams(8, 3))
    need = probe.searches.stats().bytes
    engine = small_engine(memory_budget_bytes=2 * need if fits else 2 * need - 2)
    assert engine.searches.keeps(len(sample_requests()), 8, 64, len(SIZES)) is fits
    first = engine.recommend_rows(sample_requests(), BeamParams(8, 3))
    for _ in range(2):
        assert [r.items for r in engine.recommend_rows(sample_requests(), BeamParams(8, 3))] == [
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
