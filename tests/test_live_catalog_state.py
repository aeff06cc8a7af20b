"""The base + delta catalog: searches over both parts are exact (widths 256 and 1,024, with
filters, retired and moved items), compaction and rebasing change nothing visible, and an
update costs what it changes."""

from __future__ import annotations

import pytest
import torch
from search_reference import exhaustive_top

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.live_catalog.state import CatalogState
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [16, 8, 16]


def _engine(n_items: int, seed: int = 0) -> Engine:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    space = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(space[torch.randperm(space.shape[0], generator=g)[:n_items]], SIZES)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=64)
    model = build_model(cfg)
    with torch.no_grad():  # sharper distributions than the default init
        model.lm_head.weight.mul_(20)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID),
                  vocab=SidVocab(index, max_history=6))


def _free_ids(state: CatalogState, n: int, seed: int = 1) -> list[list[int]]:
    taken = {tuple(c) for c in state.codes_of(torch.arange(state.num_items)).tolist()}
    g = torch.Generator().manual_seed(seed)
    space = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    space = space[torch.randperm(space.shape[0], generator=g)].tolist()
    return [c for c in space if tuple(c) not in taken][:n]


def _changed(engine: Engine) -> CatalogState:
    # a delta with new items, moved items and retired ones (base and delta)
    state = engine.catalog
    n = state.num_items
    fresh = _free_ids(state, 40)
    upsert = [(n + k, fresh[k]) for k in range(30)] + [(k, fresh[30 + k]) for k in range(10)]
    state = state.updated(upsert, retire=[11, 12, n + 3, 5])
    assert state.delta_items.numel() == 40 and state.retired() == [5, 11, 12, n + 3]
    return state


def _assert_exact(engine: Engine, state: CatalogState, requests: list[RowRequest],
                  width: int, n: int) -> None:
    got = engine.recommend_rows(requests, BeamParams(width, n), catalog=state)
    for request, rec in zip(requests, got, strict=True):
        items, scores = exhaustive_top(engine, request, n, catalog=state)
        assert rec.items == items.tolist()
        assert torch.allclose(torch.tensor(rec.scores), scores, atol=1e-4)
        assert not set(rec.items) & set(state.retired())


@pytest.mark.parametrize("width", [256, 1024])
def test_wide_beams_over_base_and_delta_equal_exhaustive_scoring(width: int) -> None:
    # every allowed item fits in the beam: the search must return the exact top of them
    engine = _engine(220 if width == 256 else 900)
    state = _changed(engine)
    n = state.num_items
    requests = [RowRequest([3, 17, 8]),
                RowRequest([1, 2], exclude=[0, 4, 6, n - 1, 13]),
                RowRequest([20], allow=[4, 9, 30, 31, n - 2, 5, 11, 2])]
    _assert_exact(engine, state, requests, width, n=min(width, 200))
    _assert_exact(engine, engine.catalog, requests[:1], width, n=min(width, 200))


def test_compaction_and_rebase_change_nothing_visible() -> None:
    engine = _engine(200)
    state = _changed(engine)
    requests = [RowRequest([3, 17, 8]), RowRequest([7], exclude=[1, 2, 3])]
    params = BeamParams(64, 20)
    want = engine.recommend_rows(requests, params, catalog=state)
    compact = state.compacted()
    assert compact.delta_trie is None and compact.retired() == state.retired()
    assert compact.version == state.version
    assert engine.recommend_rows(requests, params, catalog=compact) == want
    # updates made while the compaction ran are carried onto its result
    n = state.num_items
    later = state.updated([(n, _free_ids(state, 1, seed=9)[0]), (0, None)], retire=[7, 8])
    later = later.updated([(20, _free_ids(later, 1, seed=10)[0])])
    rebased = later.rebased(compact)
    assert rebased.version == later.version and rebased.trie is compact.trie
    assert rebased.delta_items.tolist() == [20, n]
    assert engine.recommend_rows(requests, params, catalog=rebased) == engine.recommend_rows(
        requests, params, catalog=later)
    every = torch.arange(later.num_items)
    assert torch.equal(rebased.codes_of(every), later.codes_of(every))
    assert torch.equal(rebased.lookup(later.codes_of(every)), every)


def test_prompts_lookup_and_vocab_follow_the_delta() -> None:
    engine = _engine(100)
    state = _changed(engine)
    moved = 3  # one of the items given a new ID
    new_codes = state.codes_of([moved])[0]
    base_codes = engine.catalog.codes_of([moved])[0]
    assert not torch.equal(new_codes, base_codes)
    assert state.lookup(new_codes).item() == moved and state.lookup(base_codes).item() == -1
    [prompt] = state.prompts([[moved, 4]], [False])
    assert prompt[1:4] == state.item_tokens([moved])[0].tolist()
    assert torch.equal(state.vocab.index.codes, state.codes_of(torch.arange(state.num_items)))
    assert state.vocab.prompt([moved, 4]) == prompt


def test_an_update_does_not_rebuild_the_base() -> None:
    engine = _engine(300)
    state = _changed(engine)
    nxt = state.updated(retire=[1, 2])
    assert nxt.trie is state.trie and nxt.base_vocab is state.base_vocab
    assert nxt.retired() == sorted({*state.retired(), 1, 2})
    # upserting a retired item brings it back; its own old ID may be taken back too
    back = nxt.updated([(1, engine.catalog.codes_of([1])[0].tolist())])
    assert back.is_active(1) and not back.is_active(2)


def test_search_filters_read_nothing_from_the_device() -> None:
    # the preparing thread builds a batch's filters while the previous batch runs: on a GPU a
    # read of a device value there would wait for that batch (on the CPU the trap emulates it)
    from genrec.utils.sync_trap import no_host_sync

    engine = _engine(220)
    state = _changed(engine)
    n = state.num_items
    allow = [None, [4, 9, 30, 31, n - 2, 5, 11, 2, 9], [n - 1], []]
    exclude = [[0, 4, 6, n - 1, 13, 13, 5], None, [n - 1, 1], [2]]
    with no_host_sync():
        filters = state.search_filters(allow, exclude)
    assert len(filters) == 2  # base and delta
    # the same lists as built outside the trap
    again = state.search_filters(allow, exclude)
    for f, g, trie in zip(filters, again, state.parts(), strict=True):
        for level in range(trie.num_levels):
            for a, b in zip(f.level_lists(trie, level), g.level_lists(trie, level), strict=True):
                assert (a is None and b is None) or torch.equal(a, b)
