"""Candidate-ranking evaluation: negative sampling, tie-aware ranks, hand-computed metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch

from genrec.data.split import Example
from genrec.evaluation.ranking import evaluate_ranking, mrr, sample_candidates, target_rank

SEQUENCES = [[0, 1, 2, 2], [3, 4], [5, 6, 7]]
EXAMPLES = [Example(0, [0, 1], 2), Example(1, [3], 4), Example(2, [5, 6], 7)]


def test_sample_candidates_target_first_and_unseen_negatives() -> None:
    cands = sample_candidates(EXAMPLES, SEQUENCES, num_items=30, num_negatives=10, seed=3)
    assert len(cands) == 3
    for ex, c in zip(EXAMPLES, cands, strict=True):
        assert c[0] == ex.target and len(c) == 11
        negs = c[1:]
        assert len(set(negs)) == 10
        assert all(0 <= i < 30 for i in negs)
        assert not set(negs) & set(SEQUENCES[ex.user])


def test_sample_candidates_deterministic_per_seed() -> None:
    first = sample_candidates(EXAMPLES, SEQUENCES, num_items=1000, num_negatives=20, seed=7)
    again = sample_candidates(EXAMPLES, SEQUENCES, num_items=1000, num_negatives=20, seed=7)
    other = sample_candidates(EXAMPLES, SEQUENCES, num_items=1000, num_negatives=20, seed=8)
    assert first == again
    assert first != other


def test_sample_candidates_takes_every_remaining_item_when_just_enough() -> None:
    # user 0 has seen {0, 1, 2}; exactly items 3..7 are left.
    cands = sample_candidates(EXAMPLES[:1], SEQUENCES, num_items=8, num_negatives=5)
    assert cands[0][0] == 2 and sorted(cands[0][1:]) == [3, 4, 5, 6, 7]
    assert sample_candidates(EXAMPLES[:1], SEQUENCES, 8, num_negatives=0) == [[2]]


def test_sample_candidates_too_few_items_raises() -> None:
    with pytest.raises(ValueError, match="user 0: only 5 items left to sample 6 negatives"):
        sample_candidates(EXAMPLES, SEQUENCES, num_items=8, num_negatives=6)


def test_sample_candidates_ignores_out_of_catalog_ids_when_counting_room() -> None:
    cands = sample_candidates([Example(0, [0], 2)], [[0, 1, 50]], num_items=5, num_negatives=2)
    assert cands[0][0] == 2 and sorted(cands[0][1:]) == [3, 4]


def test_target_rank_counts_ties_against_the_target() -> None:
    assert target_rank(torch.tensor([3.0, 1.0, 2.0])) == 0
    assert target_rank(torch.tensor([2.0, 3.0, 1.0, 5.0])) == 2
    assert target_rank(torch.tensor([2.0, 2.0, 1.0, 3.0])) == 2  # one higher, one tie
    assert target_rank(torch.full((6,), 0.5)) == 5  # a constant scorer ranks last
    assert target_rank(torch.tensor([1.0])) == 0


def test_target_rank_nan_target_ranks_last() -> None:
    assert target_rank(torch.tensor([float("nan"), 1.0, 2.0])) == 2
    assert target_rank(torch.tensor([1.0, float("nan"), 0.0])) == 0  # NaN negatives lose


def test_mrr() -> None:
    assert mrr(torch.tensor([0, 1, 3])) == pytest.approx((1 + 1 / 2 + 1 / 4) / 3)
    assert mrr(torch.tensor([], dtype=torch.long)) == 0.0


# Per user: the scores of its 12 candidates (target first) and the target's expected rank.
SCORES = {
    0: ([9.0] + [1.0] * 11, 0),
    1: ([5.0, 6.0, 7.0] + [0.0] * 9, 2),
    2: ([5.0, 6.0, 5.0, 7.0] + [0.0] * 8, 3),  # two higher, one tie
    3: ([0.0] + [1.0] * 11, 11),  # outside the top 10
}


Scorer = Callable[[Sequence[Example], Sequence[Sequence[int]]], list[torch.Tensor]]


def scorer(calls: list[int]) -> Scorer:
    """Known scores per user; records each call's batch size in ``calls``."""

    def score(
        examples: Sequence[Example], candidates: Sequence[Sequence[int]],
    ) -> list[torch.Tensor]:
        calls.append(len(examples))
        assert all(len(c) == 12 for c in candidates)
        return [torch.tensor(SCORES[ex.user][0], dtype=torch.float64) for ex in examples]

    return score


def test_evaluate_ranking_hand_computed_metrics() -> None:
    examples = [Example(u, [u], 100 + u) for u in SCORES]
    candidates = [[100 + u] + list(range(11)) for u in SCORES]
    calls: list[int] = []
    out = evaluate_ranking(scorer(calls), examples, candidates, batch_size=3)
    assert calls == [3, 1]
    assert list(out) == ["recall@5", "ndcg@5", "recall@10", "ndcg@10", "mrr", "users"]
    assert out["users"] == 4.0
    assert out["recall@10"] == pytest.approx(3 / 4)
    assert out["recall@5"] == pytest.approx(3 / 4)
    ndcg = (1.0 + 1 / math.log2(4) + 1 / math.log2(5) + 0.0) / 4
    assert out["ndcg@10"] == pytest.approx(ndcg)
    assert out["ndcg@5"] == pytest.approx(ndcg)
    assert out["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 4 + 1 / 12) / 4)
    only1 = evaluate_ranking(scorer([]), examples, candidates, ks=(1,))
    assert only1["recall@1"] == pytest.approx(1 / 4) and "recall@10" not in only1


def test_evaluate_ranking_no_examples() -> None:
    out = evaluate_ranking(scorer([]), [], [])
    assert out["users"] == 0.0 and out["mrr"] == 0.0 and out["ndcg@10"] == 0.0


def test_evaluate_ranking_rejects_mismatched_scores() -> None:
    examples = [Example(0, [0], 100), Example(1, [1], 101)]
    candidates = [[100] + list(range(11)), [101] + list(range(11))]
    with pytest.raises(ValueError, match="candidates: 1 lists for 2 examples"):
        evaluate_ranking(scorer([]), examples, candidates[:1])
    with pytest.raises(ValueError, match="score: expected one score per candidate"):
        evaluate_ranking(lambda ex, c: [torch.zeros(12)], examples, candidates)
    with pytest.raises(ValueError, match="score: expected one score per candidate"):
        evaluate_ranking(lambda ex, c: [torch.zeros(5) for _ in ex], examples, candidates)


def test_full_catalog_candidates() -> None:
    """``num_negatives=None``: every item the user has not seen, target first."""
    seqs = [[0, 1, 2], [3, 4]]
    exs = [Example(0, [0, 1], 2), Example(1, [3], 4)]
    out = sample_candidates(exs, seqs, 6, None)
    assert out == [[2, 3, 4, 5], [4, 0, 1, 2, 5]]
