"""Full-catalog evaluation of a generative model through Engine.recommend."""

from __future__ import annotations

import pytest
import torch

from genrec.catalog.semantic_ids import with_dedup_level
from genrec.engine import BeamParams, Engine, EngineConfig, RecommendRequest
from genrec.evaluation.generative import (
    evaluate_generative,
    evaluate_split,
    sample_examples,
    split_examples,
)
from genrec.evaluation.metrics import ranking_metrics, target_ranks
from genrec.generative.vocab import SOFT_ID, SidVocab
from genrec.model import build_model
from genrec.training.generative import init_weights, scratch_config

N_ITEMS = 60
KEYS = {"recall@5", "ndcg@5", "recall@10", "ndcg@10", "n_users", "beam_width"}


def make_engine(user_dim: int = 0, seed: int = 0) -> Engine:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 8, (N_ITEMS, 3), generator=g)
    vocab = SidVocab(with_dedup_level(codes, [8, 8, 8]), max_history=5)
    torch.manual_seed(seed)
    model = build_model(scratch_config(vocab, hidden=32, layers=2, heads=2, kv_heads=1,
                                       head_dim=16, user_dim=user_dim))
    init_weights(model, std=0.2)  # large weights: peaked, varied predictions
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


def sequences(n_users: int = 12, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, N_ITEMS, (int(torch.randint(3, 9, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n_users)]


def test_split_examples_use_the_right_history() -> None:
    seqs = [[1, 2, 3, 4, 5], [7, 8, 9], [4, 5]]
    test = split_examples(seqs, "test", max_history=3)
    val = split_examples(seqs, "val", max_history=3)
    assert [(e.user, e.history, e.target) for e in test] == [(0, [2, 3, 4], 5), (1, [7, 8], 9)]
    assert [(e.user, e.history, e.target) for e in val] == [(0, [1, 2, 3], 4), (1, [7], 8)]
    with pytest.raises(ValueError, match="split"):
        split_examples(seqs, "train", 3)  # type: ignore[arg-type]


def test_sample_is_fixed_and_in_user_order() -> None:
    examples = split_examples(sequences(30), "test", 5)
    a = sample_examples(examples, 10, seed=3)
    assert a == sample_examples(examples, 10, seed=3) and len(a) == 10
    assert [e.user for e in a] == sorted(e.user for e in a)
    assert sample_examples(examples, None) == examples


def test_metrics_match_a_manual_computation_and_ignore_batching() -> None:
    engine = make_engine()
    examples = split_examples(sequences(), "test", 5)
    metrics = evaluate_generative(engine, examples, beam_width=12, batch_size=5)
    assert set(metrics) == KEYS and metrics["n_users"] == len(examples)
    recs = engine.recommend([RecommendRequest(e.history) for e in examples],
                            BeamParams(beam_width=12, n=10))
    top = torch.tensor([r.items + [-1] * (10 - len(r.items)) for r in recs])
    manual = ranking_metrics(target_ranks(top, torch.tensor([e.target for e in examples])))
    for key, value in manual.items():
        assert metrics[key] == pytest.approx(value)
    assert evaluate_generative(engine, examples, beam_width=12, batch_size=100) == metrics


def test_a_target_the_engine_ranks_first_scores_one() -> None:
    engine = make_engine()
    history = [3, 4, 5]
    best = engine.recommend([RecommendRequest(history)], BeamParams(20, 10))[0].items[0]
    from genrec.data.split import Example

    metrics = evaluate_generative(engine, [Example(0, history, best)])
    assert metrics["recall@5"] == metrics["ndcg@10"] == 1.0


def test_soft_token_changes_predictions() -> None:
    engine = make_engine(user_dim=4)
    examples = split_examples(sequences(), "test", 5)[:4]
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(12, 4, generator=g), torch.randn(12, 4, generator=g)
    req = [RecommendRequest(examples[0].history, user_vector=v[0]) for v in (a, b)]
    first, second = engine.recommend(req, BeamParams(20, 10))
    assert first.scores != second.scores
    assert evaluate_generative(engine, examples, a)["n_users"] == 4


def test_evaluate_split_reports_time_and_checks_inputs() -> None:
    engine = make_engine()
    metrics = evaluate_split(engine, sequences(), "val", users=5, beam_width=10)
    assert metrics["n_users"] == 5 and metrics["seconds"] > 0
    with pytest.raises(ValueError, match="examples"):
        evaluate_generative(engine, [])
    with pytest.raises(ValueError, match="n \\(10\\) must not exceed beam_width"):
        evaluate_generative(engine, split_examples(sequences(), "test", 5), beam_width=5)
