"""Static search runners: the catalog's tries and the filter lists in capacity-sized copies.
Results equal the plain runners' across catalog updates, compactions and filter sizes, and a
runner (on a GPU: its graph) is made again only when a capacity grows."""

from __future__ import annotations

import torch

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.engine.static_search import MIN_CAPACITY, grown
from genrec.live_catalog.state import CatalogState
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [6, 5, 4]
PARAMS = BeamParams(12, 6)


def _engines(n_items: int = 70) -> tuple[Engine, Engine]:
    g = torch.Generator().manual_seed(0)
    space = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(space[torch.randperm(space.shape[0], generator=g)[:n_items]], SIZES)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=64)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    vocab = SidVocab(index, max_history=6)
    return tuple(Engine(model, config=EngineConfig(soft_token_id=SOFT_ID, static_search=s),
                        vocab=vocab) for s in (True, False))


def _free(state: CatalogState, n: int, seed: int) -> list[list[int]]:
    taken = {tuple(c) for c in state.codes_of(torch.arange(state.num_items)).tolist()}
    g = torch.Generator().manual_seed(seed)
    space = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    space = space[torch.randperm(space.shape[0], generator=g)].tolist()
    return [c for c in space if tuple(c) not in taken][:n]


def _requests(n: int, excluded: int) -> list[RowRequest]:
    # mixed filters: none, an exclude list of ``excluded`` items, an allow list
    return [RowRequest([3, 17, 8]),
            RowRequest([5, 6], exclude=list(range(excluded))),
            RowRequest([20], allow=[4, 9, 30, 31, n - 1])]


def _run(static: Engine, plain: Engine, state: CatalogState, excluded: int) -> None:
    static.set_catalog(state)
    plain.set_catalog(state)
    requests = _requests(state.num_items, excluded)
    got = static.recommend_rows(requests, PARAMS)
    want = plain.recommend_rows(requests, PARAMS)
    assert [r.items for r in got] == [r.items for r in want]
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(torch.tensor(a.scores), torch.tensor(b.scores), atol=1e-5)


def test_grown_capacities_double() -> None:
    assert grown(3) == MIN_CAPACITY and grown(17) == 32 and grown(20, 32) == 32
    assert grown(33, 32) == 64 and grown(200, 32) == 256


def test_equal_results_across_updates_with_few_runners() -> None:
    static, plain = _engines()
    made = []
    for k in range(12):
        state = static.catalog
        n = state.num_items
        if k % 3 == 1:  # an update: new items, a moved one, a retired one
            fresh = _free(state, 3, seed=k)
            state = state.updated([(n, fresh[0]), (n + 1, fresh[1]), (k, fresh[2])],
                                  retire=[20 + k])
        elif k == 9:  # a compaction: no delta any more
            state = state.compacted()
        _run(static, plain, state, excluded=(0, 4, 9)[k % 3])
        made.append(static.searches.stats().runners_made)
    # plain runners: one per catalog version; static ones: one without a delta (made first,
    # used again after the compaction) and one with a delta, whatever the updates
    assert plain.searches.stats().runners_made >= 5
    assert made == [1] + [2] * 11


def test_capacities_grow_by_doubling() -> None:
    # an exclude list growing by 5 items a call: a runner made again past 16, 32 and 64 items
    static, plain = _engines(n_items=100)
    made = []
    for excluded in range(0, 80, 5):
        _run(static, plain, static.catalog, excluded)
        made.append(static.searches.stats().runners_made)
    assert made == [1] * 4 + [2] * 3 + [3] * 6 + [4] * 3


def test_static_search_reads_nothing_back_to_the_host(monkeypatch) -> None:
    # the path a GPU takes (portable attention), with the catalog's delta and filters: copying
    # the tries and lists into the runner's buffers reads no device value either
    from genrec.model import attention
    from genrec.utils.sync_trap import no_host_sync

    monkeypatch.setattr(attention, "cascade_attention_op", lambda: None)
    static, _ = _engines()
    state = static.catalog
    fresh = _free(state, 2, seed=1)
    static.set_catalog(state.updated([(state.num_items, fresh[0]), (3, fresh[1])], retire=[7]))
    requests = _requests(static.catalog.num_items, 9)
    want = static.recommend_rows(requests, PARAMS)  # warm: the runner made, probes, layouts
    prepared = static.prepare_recommend(requests, PARAMS)
    cat, batch = prepared.catalog, prepared.batch
    args = (cat.parts(), prepared.filters, cat.level_offsets, static.embed(batch),
            batch.layout.prefix_len.tolist(), batch.prefix_last, PARAMS.beam_width)
    with no_host_sync():
        out = static.searches.search(*args)
    for r, rec in enumerate(want):
        assert out.items[r][: len(rec.items)].tolist() == rec.items
    assert static.searches.stats().runners_made == 1
