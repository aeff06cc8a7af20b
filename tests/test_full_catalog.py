"""Full-catalog evaluation of a generative model through Engine.recommend."""

from __future__ import annotations

import math

import pytest
import torch

from genrec.catalog.semantic_ids import with_dedup_level
from genrec.engine import BeamParams, Engine, EngineConfig, RowRequest
from genrec.evaluation.full_catalog import (
    evaluate_generative,
    evaluate_item_weights,
    evaluate_popularity,
    evaluate_split,
    example_ranks,
    full_histories,
    item_counts,
    popularity_split,
    popularity_top,
    sample_examples,
    split_examples,
)
from genrec.evaluation.topk_metrics import ranking_metrics, target_ranks
from genrec.model import build_model
from genrec.training.generative_task import scratch_config
from genrec.training.initialization import init_weights
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

N_ITEMS = 60
KEYS = {"recall@5", "ndcg@5", "recall@10", "ndcg@10", "n_users", "beam_width"}


def make_engine(user_dim: int = 0, seed: int = 0, item_head: bool = False,
                history_bias: bool = False) -> Engine:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 8, (N_ITEMS, 3), generator=g)
    vocab = SidVocab(with_dedup_level(codes, [8, 8, 8]), max_history=5)
    torch.manual_seed(seed)
    model = build_model(scratch_config(vocab, hidden=32, layers=2, heads=2, kv_heads=1,
                                       head_dim=16, user_dim=user_dim, item_head=item_head,
                                       history_bias=history_bias))
    init_weights(model, std=0.2)  # large weights: peaked, varied predictions
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


def sequences(n_users: int = 12, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, N_ITEMS, (int(torch.randint(3, 9, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n_users)]

def metrics_of(recs: list, targets: list[int]) -> dict[str, float]:
    """Recall/NDCG of recommendation lists (``recommend_rows``' results), computed by hand."""
    top = torch.tensor([r.items + [-1] * (10 - len(r.items)) for r in recs])
    return ranking_metrics(target_ranks(top, torch.tensor(targets)))



def test_split_examples_use_the_right_history() -> None:
    seqs = [[1, 2, 3, 4, 5], [7, 8, 9], [4, 5]]
    test = split_examples(seqs, "test", max_history=3)
    val = split_examples(seqs, "val", max_history=3)
    assert [(e.user, e.history, e.target) for e in test] == [(0, [2, 3, 4], 5), (1, [7, 8], 9)]
    assert [(e.user, e.history, e.target) for e in val] == [(0, [1, 2, 3], 4), (1, [7], 8)]
    full = split_examples(seqs, "test")  # every earlier item, as a client sends them
    assert [(e.user, e.history, e.target) for e in full] == [(0, [1, 2, 3, 4], 5), (1, [7, 8], 9)]
    with pytest.raises(ValueError, match="split"):
        split_examples(seqs, "train", 3)  # type: ignore[arg-type]


def test_the_history_bias_reads_every_earlier_item_as_in_serving() -> None:
    engine = make_engine(item_head=True, history_bias=True, seed=2)  # prompts: last 5 items
    with torch.no_grad():
        engine.model.item_head.history_bias.fill_(20.0)  # a user's own items rank first
    g = torch.Generator().manual_seed(4)
    # each user's test target is their first item again: boosted only where the bias sees it
    firsts = [torch.randperm(N_ITEMS, generator=g)[:9].tolist() for _ in range(6)]
    seqs = [p + p[:1] for p in firsts]
    params = BeamParams(12, 10, item_weight=3.0)
    split = evaluate_split(engine, seqs, "test", beam_width=12, item_weight=3.0)
    served = engine.recommend_rows([RowRequest(s[:-1]) for s in seqs], params)
    cut = engine.recommend_rows([RowRequest(s[-6:-1]) for s in seqs], params)
    targets = [s[-1] for s in seqs]
    assert all(split[k] == pytest.approx(v) for k, v in metrics_of(served, targets).items())
    assert split["recall@10"] == 1.0 > metrics_of(cut, targets)["recall@10"]


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
    recs = engine.recommend_rows([RowRequest(e.history) for e in examples],
                            BeamParams(beam_width=12, n=10))
    manual = metrics_of(recs, [e.target for e in examples])
    for key, value in manual.items():
        assert metrics[key] == pytest.approx(value)
    assert evaluate_generative(engine, examples, beam_width=12, batch_size=100) == metrics


def test_a_target_the_engine_ranks_first_scores_one() -> None:
    engine = make_engine()
    history = [3, 4, 5]
    best = engine.recommend_rows([RowRequest(history)], BeamParams(20, 10))[0].items[0]
    from genrec.data.split import Example

    metrics = evaluate_generative(engine, [Example(0, history, best)])
    assert metrics["recall@5"] == metrics["ndcg@10"] == 1.0


def test_soft_token_changes_predictions() -> None:
    engine = make_engine(user_dim=4)
    examples = split_examples(sequences(), "test", 5)[:4]
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(12, 4, generator=g), torch.randn(12, 4, generator=g)
    req = [RowRequest(examples[0].history, user_vector=v[0]) for v in (a, b)]
    first, second = engine.recommend_rows(req, BeamParams(20, 10))
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


def test_against_a_second_model_is_paired_over_the_same_users() -> None:
    engine, other = make_engine(), make_engine(seed=1)
    seqs = sequences(30)
    alone = evaluate_split(engine, seqs, "val", users=20, beam_width=10, mask_history=True)
    both = evaluate_split(engine, seqs, "val", users=20, beam_width=10, mask_history=True,
                          against=other)
    theirs = evaluate_split(other, seqs, "val", users=20, beam_width=10, mask_history=True)
    for key in ("recall@5", "ndcg@5", "recall@10", "ndcg@10"):
        assert both[key] == pytest.approx(alone[key])
        assert both["against"][key] == pytest.approx(theirs[key])
        assert both["paired"][key]["difference"] == pytest.approx(alone[key] - theirs[key])
    examples = split_examples(seqs, "val", 5, 20)
    exclude = full_histories(seqs, examples, "val")
    ranks = example_ranks(engine, examples, beam_width=10, exclude=exclude)
    assert ranks.shape == (20,) and ranking_metrics(ranks)["ndcg@10"] == pytest.approx(
        alone["ndcg@10"])
    itself = evaluate_split(engine, seqs, "val", users=20, beam_width=10, against=engine)
    assert all(v["difference"] == 0.0 and v["se"] == 0.0 for v in itself["paired"].values())
    with pytest.raises(ValueError, match="against"):
        evaluate_split(engine, seqs, "val", against=other, item_weights=[1.0])
    with pytest.raises(ValueError, match="at least 2 users"):
        evaluate_split(engine, seqs, "val", users=1, against=other)


def test_excluded_items_are_never_recommended() -> None:
    engine = make_engine()
    seqs = sequences()
    examples = split_examples(seqs, "test", 5)
    masks = full_histories(seqs, examples, "test")
    assert masks[0] == seqs[examples[0].user][:-1]
    free = engine.recommend_rows([RowRequest(e.history) for e in examples], BeamParams(12, 10))
    masked = evaluate_generative(engine, examples, beam_width=12, exclude=masks)
    recs = engine.recommend_rows([RowRequest(e.history, exclude=m)
                             for e, m in zip(examples, masks, strict=True)], BeamParams(12, 10))
    assert all(not set(r.items) & set(m) for r, m in zip(recs, masks, strict=True))
    assert any(set(r.items) & set(m) for r, m in zip(free, masks, strict=True))
    manual = metrics_of(recs, [e.target for e in examples])
    assert all(masked[k] == pytest.approx(v) for k, v in manual.items())
    with pytest.raises(ValueError, match="exclude"):
        evaluate_generative(engine, examples, beam_width=12, exclude=masks[:1])
    # evaluate_split(mask_history=True) is the same evaluation over the full histories
    split = evaluate_split(engine, seqs, "test", beam_width=12, mask_history=True)
    assert all(split[k] == pytest.approx(v) for k, v in masked.items() if k != "seconds")


def test_item_weights_from_one_search_equal_one_evaluation_per_weight() -> None:
    engine = make_engine(item_head=True, seed=3)
    seqs = sequences(20)
    examples = split_examples(seqs, "test", 5)
    masks = full_histories(seqs, examples, "test")
    weights = (0.5, 3.0, 20.0)
    for exclude in (None, masks):
        swept = evaluate_item_weights(engine, examples, weights, beam_width=12, batch_size=7,
                                      exclude=exclude)
        for w in weights:
            alone = evaluate_generative(engine, examples, beam_width=12, exclude=exclude,
                                        item_weight=w)
            assert swept[w] == pytest.approx(alone)
    assert len({swept[w]["ndcg@10"] for w in weights}) > 1  # the weight matters here
    with pytest.raises(ValueError, match="item_weights"):
        evaluate_item_weights(engine, examples, (0.0, 1.0))
    with pytest.raises(ValueError, match="no item head"):
        evaluate_item_weights(make_engine(), examples, (1.0,))


def test_popularity_counts_training_items_and_masks_history() -> None:
    seqs = [[0, 1, 2, 3, 4], [1, 2, 5, 6], [3, 1, 4], [2, 2]]  # the last user is short
    counts = item_counts(seqs, 8)
    # training parts: [0, 1, 2], [1, 2], [3], and all of the short user's [2, 2]
    assert counts.tolist() == [1, 2, 4, 1, 0, 0, 0, 0]
    assert popularity_top(counts, 3, 2).tolist() == [[2, 1, 0], [2, 1, 0]]  # ties: lower index
    assert popularity_top(counts, 3, 1, exclude=[[2, 0]]).tolist() == [[1, 3, 4]]
    assert popularity_top(torch.tensor([3, 1]), 3, 1, exclude=[[0]]).tolist() == [[1, -1, -1]]
    examples = split_examples(seqs, "test", max_history=2)  # targets 4, 6, 4
    plain = evaluate_popularity(seqs, examples, 8, ks=(5,))  # top 5: 2, 1, 0, 3, 4
    assert plain["n_users"] == 3 and plain["recall@5"] == pytest.approx(2 / 3)
    assert plain["ndcg@5"] == pytest.approx(2 / math.log2(6) / 3)  # item 4 ranks 5th twice
    masks = full_histories(seqs, examples, "test")
    masked = evaluate_popularity(seqs, examples, 8, ks=(5,), exclude=masks)
    # user 0 gets 4 first, user 1 gets [0, 3, 4, 6, ...], user 2 gets [2, 0, 4, ...]
    assert masked["recall@5"] == 1.0
    assert masked["ndcg@5"] == pytest.approx((1 + 1 / math.log2(5) + 1 / math.log2(4)) / 3)
    assert popularity_split(seqs, 8, "test", 2, users=2)["n_users"] == 2
