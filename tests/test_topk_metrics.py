"""Recall@K / NDCG@K against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from genrec.evaluation.topk_metrics import (
    ndcg_at_k,
    paired_difference,
    ranking_metrics,
    recall_at_k,
    target_ranks,
    user_ndcg,
    user_recall,
)


def test_target_ranks_finds_first_position_or_miss() -> None:
    top = torch.tensor([[5, 3, 9], [1, 2, 4], [7, -1, -1], [8, 8, 2]])
    targets = torch.tensor([9, 6, 7, 8])
    assert target_ranks(top, targets).tolist() == [2, -1, 0, 0]


def test_padding_never_matches_a_negative_target() -> None:
    assert target_ranks(torch.tensor([[-1, -1]]), torch.tensor([-1])).tolist() == [-1]


def test_hand_computed_values() -> None:
    ranks = torch.tensor([0, 2, 6, -1])  # hits at 1st, 3rd, 7th place; one miss
    assert recall_at_k(ranks, 1) == pytest.approx(0.25)
    assert recall_at_k(ranks, 5) == pytest.approx(0.5)
    assert recall_at_k(ranks, 10) == pytest.approx(0.75)
    assert ndcg_at_k(ranks, 5) == pytest.approx((1.0 + 1 / math.log2(4)) / 4)
    assert ndcg_at_k(ranks, 10) == pytest.approx((1.0 + 0.5 + 1 / math.log2(8)) / 4)


def test_ranking_metrics_keys_and_empty_input() -> None:
    metrics = ranking_metrics(torch.tensor([1]), (5, 10))
    assert list(metrics) == ["recall@5", "ndcg@5", "recall@10", "ndcg@10"]
    assert metrics["ndcg@5"] == pytest.approx(1 / math.log2(3))
    assert ranking_metrics(torch.zeros(0, dtype=torch.long))["recall@10"] == 0.0


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="recommended must be"):
        target_ranks(torch.tensor([1, 2]), torch.tensor([1]))


def test_per_user_scores_average_to_the_metrics() -> None:
    ranks = torch.tensor([0, 3, -1, 12, 1, 9])
    assert user_recall(ranks, 10).tolist() == [1, 1, 0, 0, 1, 1]
    assert user_ndcg(ranks, 5)[1].item() == pytest.approx(1 / math.log2(5))
    assert user_ndcg(ranks, 5)[5].item() == 0.0
    for k in (5, 10):
        assert float(user_recall(ranks, k).mean()) == pytest.approx(recall_at_k(ranks, k))
        assert float(user_ndcg(ranks, k).mean()) == pytest.approx(ndcg_at_k(ranks, k))
    with pytest.raises(ValueError, match="k must be"):
        user_ndcg(ranks, 0)


def test_paired_difference_by_hand() -> None:
    ranks, baseline = torch.tensor([0, 3, -1, 12]), torch.tensor([1, 3, 2, -1])
    out = paired_difference(ranks, baseline, ks=(5,))
    assert list(out) == ["recall@5", "ndcg@5"]
    d = [1 - 1 / math.log2(3), 0.0, -1 / math.log2(4), 0.0]  # per-user NDCG@5 differences
    mean = sum(d) / 4
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 3 / 4)
    assert out["ndcg@5"]["difference"] == pytest.approx(mean)
    assert out["ndcg@5"]["se"] == pytest.approx(se)
    assert out["recall@5"]["difference"] == pytest.approx(-0.25)
    same = paired_difference(ranks, ranks)
    assert all(v == {"difference": 0.0, "se": 0.0} for v in same.values())
    with pytest.raises(ValueError, match="baseline"):
        paired_difference(ranks, baseline[:3])
    with pytest.raises(ValueError, match="at least 2 users"):
        paired_difference(ranks[:1], baseline[:1])
