"""Constrained beam search: exact when wide enough, batch-independent, filtered, validated."""

from __future__ import annotations

import pytest
import torch
from search_reference import exhaustive_top

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [5, 4, 3]


def _catalog(n_items: int = 40, seed: int = 0) -> SemanticIndex:
    g = torch.Generator().manual_seed(seed)
    all_ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    pick = torch.randperm(all_ids.shape[0], generator=g)[:n_items]
    return SemanticIndex(all_ids[pick], SIZES)


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.manual_seed(0)
    vocab = SidVocab(_catalog(), max_history=6)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, user_dim=5, max_position_embeddings=64)
    model = build_model(cfg)
    with torch.no_grad():  # sharper distributions than the default init
        model.lm_head.weight.mul_(40)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


def _requests() -> list[RowRequest]:
    return [
        RowRequest(history=[3, 17, 8]),
        RowRequest(history=[1], user_vector=torch.linspace(-1, 1, 5)),
        RowRequest(history=[5, 6, 7, 8, 9, 10, 11, 12], exclude=[0, 1, 2]),
        RowRequest(history=[20], allow=[4, 9, 30, 31]),
    ]


@pytest.mark.parametrize("index", range(4))
def test_wide_beam_equals_exhaustive_top(engine: Engine, index: int) -> None:
    request = _requests()[index]
    got = engine.recommend_rows([request], BeamParams(beam_width=40, n=10))[0]
    items, scores = exhaustive_top(engine, request, 10)
    assert got.items == items.tolist()
    assert torch.allclose(torch.tensor(got.scores), scores, atol=1e-4)


def test_batched_equals_alone(engine: Engine) -> None:
    params = BeamParams(beam_width=8, n=5)
    together = engine.recommend_rows(_requests(), params)
    for request, rec in zip(_requests(), together, strict=True):
        alone = engine.recommend_rows([request], params)[0]
        assert alone.items == rec.items
        assert torch.allclose(torch.tensor(alone.scores), torch.tensor(rec.scores), atol=1e-5)


def test_outputs_are_catalog_items_and_filters_hold(engine: Engine) -> None:
    recs = engine.recommend_rows(_requests(), BeamParams(beam_width=6, n=6))
    for rec in recs:
        assert len(rec.items) == len(set(rec.items)) and all(0 <= i < 40 for i in rec.items)
        assert rec.scores == sorted(rec.scores, reverse=True)
    assert not set(recs[2].items) & {0, 1, 2}
    assert set(recs[3].items) <= {4, 9, 30, 31} and len(recs[3].items) == 4


def test_filters_that_remove_everything_give_an_empty_result(engine: Engine) -> None:
    rec = engine.recommend_rows([RowRequest([1], exclude=list(range(40)))])[0]
    assert rec.items == [] and rec.scores == []
    rec = engine.recommend_rows([RowRequest([1], allow=[])], BeamParams(4, 2))[0]
    assert rec.items == []


@pytest.mark.parametrize(
    ("request_", "params", "message"),
    [
        (RowRequest([1, 99]), BeamParams(), r"requests\[0\].history: unknown item id 99"),
        (RowRequest([]), BeamParams(), "empty history"),
        (RowRequest([1], exclude=[-1]), BeamParams(), "exclude: unknown item id -1"),
        (RowRequest([1]), BeamParams(beam_width=4, n=5), "must not exceed beam_width"),
        (RowRequest([1]), BeamParams(beam_width=1100, n=5), "over the limit of 1024"),
        (RowRequest([1], user_vector=[1.0, 2.0]), BeamParams(), "dimension 5"),
    ],
)
def test_bad_requests(engine: Engine, request_, params, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine.recommend_rows([request_], params)
    assert engine.recommend_rows([RowRequest([2])], BeamParams(4, 2))[0].items


def test_engine_without_vocabulary_refuses(engine: Engine) -> None:
    with pytest.raises(ValueError, match="no Semantic-ID vocabulary"):
        Engine(engine.model).recommend_rows([RowRequest([1])])


@pytest.mark.parametrize(("requests", "beams", "codes", "width", "parts"),
                         [(3, 6, 9, 8, 1), (2, 1, 5, 8, 2), (4, 8, 16, 32, 2), (1, 3, 2, 4, 1)])
def test_native_level_choice_equals_the_tensor_path(
    requests: int, beams: int, codes: int, width: int, parts: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a level's choice of beams: dead beams, pairs allowed by one part or the other, fewer
    # allowed pairs than the width, and a width above beams x codes
    from genrec import kernels
    from genrec.engine import beam

    native = kernels.beam_select_op()
    if native is None:
        pytest.skip("the native CPU kernels are not built here")
    g = torch.Generator().manual_seed(requests * 100 + beams)
    logp = torch.log_softmax(torch.randn(requests * beams, codes, generator=g), dim=-1)
    scores = torch.randn(requests, beams, generator=g)
    scores[0, -1] = float("-inf")  # a dead beam
    edges = []
    for _ in range(parts):
        e = torch.arange(requests * beams * codes).view(requests, beams, codes)
        edges.append(e.masked_fill(torch.rand(e.shape, generator=g) < 0.6, -1))
    edges[0][-1] = -1  # the last request: allowed by the other part only, or by none
    got = beam.select_beams(logp, scores, edges, width)
    monkeypatch.setattr(beam, "beam_select_op", lambda: None)
    ref = beam.select_beams(logp, scores, edges, width)
    assert torch.equal(got[0], ref[0])  # the same scores, -inf past the allowed pairs
    live = ~torch.isinf(ref[0])
    for mine, theirs in zip([got[1], got[2], *got[3]], [ref[1], ref[2], *ref[3]], strict=True):
        assert mine.shape == theirs.shape and torch.equal(mine[live], theirs[live])
    for chosen in got[3]:
        assert (chosen[~live] == -1).all()
