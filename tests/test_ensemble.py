"""Ensembles of generative engines: exact mean scores, filters, batch independence, checks."""

from __future__ import annotations

import pytest
import torch
from search_reference import exhaustive_top
from serving_support import SIZES, tiny_engine

from genrec import BeamParams, Engine
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.engine.ensemble import Ensemble
from genrec.vocab.sid_vocab import SidVocab


def _engine(seed: int) -> Engine:
    return tiny_engine(seed=seed, user_dim=0)  # one catalog, weights of their own


@pytest.fixture(scope="module")
def members() -> list[Engine]:
    return [_engine(1), _engine(2), _engine(3)]


REQUESTS = [
    RowRequest(history=[3, 17, 8]),
    RowRequest(history=[5, 6, 7, 8, 9, 10, 11, 12], exclude=[0, 1, 2, 13, 14]),
    RowRequest(history=[20], allow=[4, 9, 30, 31, 33]),
]


def _mean_exhaustive(members: list[Engine], request: RowRequest) -> dict[int, float]:
    """Every allowed item's mean log-probability over the members (the reference)."""
    n = members[0].catalog.num_items
    total: dict[int, float] = {}
    for engine in members:
        items, scores = exhaustive_top(engine, request, n)
        for item, score in zip(items.tolist(), scores.tolist(), strict=True):
            total[item] = total.get(item, 0.0) + score / len(members)
    return total


@pytest.mark.parametrize("index", range(len(REQUESTS)))
def test_full_beams_give_the_exact_mean_ranking(members: list[Engine], index: int) -> None:
    """Beams as wide as the catalog propose every allowed item: the ensemble's top-n is then
    the top-n of the members' mean log-probability over the whole (filtered) catalog."""
    request = REQUESTS[index]
    got = Ensemble(members).recommend_rows([request], BeamParams(beam_width=40, n=5))[0]
    ref = _mean_exhaustive(members, request)
    best = sorted(ref.items(), key=lambda kv: -kv[1])[: len(got.items)]
    assert got.items == [item for item, _ in best]
    assert torch.allclose(torch.tensor(got.scores), torch.tensor([s for _, s in best]),
                          atol=1e-4)


def test_narrow_beams_score_every_proposal_exactly(members: list[Engine]) -> None:
    """With narrow beams the pool is smaller, but each returned score is still the exact
    mean over every member, filters hold, and the scores come best first."""
    recs = Ensemble(members).recommend_rows(REQUESTS, BeamParams(beam_width=4, n=4))
    for request, rec in zip(REQUESTS, recs, strict=True):
        ref = _mean_exhaustive(members, request)
        assert rec.items and set(rec.items) <= set(ref)
        assert rec.scores == sorted(rec.scores, reverse=True)
        for item, score in zip(rec.items, rec.scores, strict=True):
            assert score == pytest.approx(ref[item], abs=1e-4)


def test_batched_equals_alone(members: list[Engine]) -> None:
    ensemble, params = Ensemble(members), BeamParams(beam_width=6, n=5)
    together = ensemble.recommend_rows(REQUESTS, params)
    for request, rec in zip(REQUESTS, together, strict=True):
        alone = ensemble.recommend_rows([request], params)[0]
        assert alone.items == rec.items
        assert torch.allclose(torch.tensor(alone.scores), torch.tensor(rec.scores), atol=1e-5)


def test_one_member_is_that_engine(members: list[Engine]) -> None:
    params = BeamParams(beam_width=8, n=5)
    got = Ensemble(members[:1]).recommend_rows(REQUESTS, params)
    own = members[0].recommend_rows(REQUESTS, params)
    for a, b in zip(got, own, strict=True):
        assert a.items == b.items
        assert torch.allclose(torch.tensor(a.scores), torch.tensor(b.scores), atol=1e-4)


def test_members_must_share_the_catalog(members: list[Engine]) -> None:
    with pytest.raises(ValueError, match="engines"):
        Ensemble([])
    other = _engine(4)  # the same items under other Semantic IDs
    other.set_vocab(SidVocab(SemanticIndex(other.vocab.index.codes.flip(0), SIZES),
                             max_history=6))
    with pytest.raises(ValueError, match=r"engines\[1\].*share one index"):
        Ensemble([members[0], other])
    with pytest.raises(ValueError, match=r"engines\[1\].*soft token"):
        Ensemble([members[0], tiny_engine(seed=5)])


def test_bad_requests_are_named(members: list[Engine]) -> None:
    with pytest.raises(ValueError, match="history"):
        Ensemble(members).recommend_rows([RowRequest(history=[999])])
    with pytest.raises(ValueError, match="n"):
        Ensemble(members).recommend_rows(REQUESTS, BeamParams(beam_width=2, n=5))
