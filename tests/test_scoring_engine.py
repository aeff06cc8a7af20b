"""ScoringEngine.score (and Engine.score, the same): multi-item scoring equals each candidate
scored alone; bad input."""

from __future__ import annotations

import pytest
import torch

from genrec import Embeds, Engine, EngineConfig, ScoreParams, ScoreRequest
from genrec.catalog.item_table import ItemTable
from genrec.engine.scoring_engine import ScoringEngine
from genrec.model import ModelConfig, build_layout, build_model

LABELS = ScoreParams(mode="labels", label_token_ids=[3, 7])


def _alone(model, prefix: list[int], cand: list[int]) -> torch.Tensor:
    """Reference: prefix + candidate as one sequence under a plain causal mask."""
    seq = torch.tensor(prefix + cand)
    lay = build_layout([len(seq)], [], [])
    with torch.no_grad():
        logp = torch.log_softmax(model.logits(model(model.model.embed_tokens(seq), lay.positions,
                                                    lay)), -1)
    summed = sum(logp[len(prefix) - 1 + i, t] for i, t in enumerate(cand))
    return logp[-1, LABELS.label_token_ids], summed


@pytest.fixture(scope="module")
def engine(qwen3_dir) -> Engine:
    return Engine.from_pretrained(qwen3_dir)


@pytest.mark.parametrize("n_cand", [1, 17, 500])
def test_each_candidate_equals_alone(engine: Engine, n_cand: int) -> None:
    g = torch.Generator().manual_seed(n_cand)
    prefix = torch.randint(0, 128, (int(torch.randint(1, 60, (1,), generator=g)),),
                           generator=g).tolist()
    cands = [torch.randint(0, 128, (int(torch.randint(1, 12, (1,), generator=g)),),
                           generator=g).tolist() for _ in range(n_cand)]
    labels = engine.score(prefix, cands, LABELS)
    loglik = engine.score(prefix, cands, ScoreParams(mode="loglik"))
    assert labels.shape == (n_cand, 2) and loglik.shape == (n_cand,)
    check = range(n_cand) if n_cand < 50 else torch.randperm(n_cand, generator=g)[:25].tolist()
    for i in check:
        ref_labels, ref_sum = _alone(engine.model, prefix, cands[i])
        assert (labels[i] - ref_labels).abs().max() <= 1e-4
        assert abs(loglik[i] - ref_sum) <= 1e-4 * max(1.0, abs(float(ref_sum)))


def test_other_candidates_do_not_change_a_score(engine: Engine) -> None:
    torch.manual_seed(5)
    prefix = torch.randint(0, 128, (50,)).tolist()
    cands = [torch.randint(0, 128, (int(n),)).tolist() for n in torch.randint(1, 20, (500,))]
    together = engine.score(prefix, cands, LABELS)
    together_ll = engine.score(prefix, cands, ScoreParams(mode="loglik"))
    for i in (0, 123, 499):
        alone = engine.score(prefix, [cands[i]], LABELS)
        assert (together[i] - alone[0]).abs().max() <= 1e-5
        alone_ll = engine.score(prefix, [cands[i]], ScoreParams(mode="loglik"))
        assert abs(together_ll[i] - alone_ll[0]) <= 1e-5 * max(1.0, abs(float(alone_ll[0])))


def test_many_requests_in_one_batch_equal_each_alone(engine: Engine) -> None:
    torch.manual_seed(6)
    reqs = [ScoreRequest(torch.randint(0, 128, (p,)).tolist(),
                         [torch.randint(0, 128, (c,)).tolist() for c in lens])
            for p, lens in ((3, [2, 5]), (40, [1]), (17, [4, 4, 9]))]
    batched = engine.score_requests(reqs, LABELS)
    small = Engine(engine.model, config=EngineConfig(max_batch_tokens=1))  # one per forward
    for got, req, single in zip(batched, reqs, small.score_requests(reqs, LABELS), strict=False):
        assert got.shape == (len(req.candidates), 2)
        assert (got - single).abs().max() <= 1e-5
        assert (got - engine.score(req.prefix, req.candidates, LABELS)).abs().max() <= 1e-5


def test_apply_softmax_normalises_over_labels(engine: Engine) -> None:
    probs = engine.score([1, 2, 3], [[4], [5, 6]], ScoreParams("labels", [3, 7], True))
    assert torch.allclose(probs.sum(-1), torch.ones(2))
    logp = engine.score([1, 2, 3], [[4], [5, 6]], LABELS)
    assert torch.allclose(probs, torch.softmax(logp, -1), atol=1e-6)


def _composed_engine() -> tuple[ScoringEngine, ItemTable]:
    torch.manual_seed(7)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, user_dim=6,
                      score_head=True, max_position_embeddings=64)
    table = ItemTable(torch.randn(10, 2, 32))
    return ScoringEngine(build_model(cfg), table, EngineConfig(soft_token_id=1)), table


def test_items_soft_token_raw_embeds_and_head() -> None:
    engine, table = _composed_engine()
    user = torch.randn(6)
    raw = torch.randn(2, 32)
    prefix = [5, 1, *engine.item_tokens([3, 4]), Embeds(raw), 9]
    cands = [engine.item_tokens([i]) for i in range(10)]
    scores = engine.score(prefix, cands, ScoreParams(mode="head"), user_vector=user)
    assert scores.shape == (10,) and torch.isfinite(scores).all()
    # Same request spelled out as raw embeddings everywhere: identical scores.
    model = engine.model
    with torch.no_grad():
        soft = model.user_projector(user[None])
        emb = lambda ids: model.model.embed_tokens(torch.tensor(ids))  # noqa: E731
        spelled = [Embeds(emb([5])), Embeds(soft), Embeds(table.vectors[3]),
                   Embeds(table.vectors[4]), Embeds(raw), Embeds(emb([9]))]
    again = engine.score(spelled, [[Embeds(table.vectors[i])] for i in range(10)],
                         ScoreParams(mode="head"))
    assert (scores - again).abs().max() < 1e-5
    # The user vector changes the scores.
    other = engine.score(prefix, cands, ScoreParams(mode="head"), user_vector=-user)
    assert (scores - other).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.score([5, 1], [], ScoreParams("head"), torch.randn(6)), "empty candidate"),
        (lambda e: e.score([5, 1], [[40 + 20]], ScoreParams("head"), torch.randn(6)),
         r"candidates\[0\].*beyond the item table"),
        (lambda e: e.score([5, 1], [[2]], ScoreParams("head"), torch.randn(5)), "dimension 6"),
        (lambda e: e.score([5, 1], [[2]], ScoreParams("head"),
                           torch.tensor([float("nan")] * 6)), "NaN"),
        (lambda e: e.score([5, 2], [[2]], ScoreParams("head"), torch.randn(6)),
         "exactly one soft-token placeholder.*found 0"),
        (lambda e: e.score([1, 1], [[2]], ScoreParams("head"), torch.randn(6)), "found 2"),
        (lambda e: e.score([1, 2], [[2]], ScoreParams("head")), "without user_vector"),
        (lambda e: e.score([5] * 60, [[2] * 5], ScoreParams("head")), "maximum of 64 positions"),
        (lambda e: e.score([5], [[]], ScoreParams("head")), "empty candidate"),
        (lambda e: e.score([5], [[-3]], ScoreParams("head")), "negative token id"),
        (lambda e: e.score([5], ["abc"], ScoreParams("head")), "sequence of token ids"),
        (lambda e: e.score([5], [[2]], ScoreParams("labels", [99])), "label_token_ids"),
        (lambda e: e.score([], [[2]], ScoreParams("loglik")), "non-empty prefix"),
        (lambda e: e.score([5], [e.item_tokens([1])], ScoreParams("loglik")), "text tokens"),
        (lambda e: e.item_tokens([10]), "outside the item table"),
    ],
)
def test_bad_input_is_named_and_engine_stays_usable(call, message: str) -> None:
    engine, _ = _composed_engine()
    with pytest.raises(ValueError, match=message):
        call(engine)
    ok = engine.score([5, 1], [[2], [3, 4]], ScoreParams("head"), user_vector=torch.randn(6))
    assert ok.shape == (2,)


def test_item_table_must_match_hidden_size() -> None:
    engine, _ = _composed_engine()
    with pytest.raises(ValueError, match="hidden size 16"):
        engine.set_item_table(ItemTable(torch.randn(3, 2, 16)))


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_branches_equal_one_forward(engine: Engine, chunk: int) -> None:
    torch.manual_seed(8)
    reqs = [ScoreRequest(torch.randint(0, 128, (p,)).tolist(),
                         [torch.randint(0, 128, (c,)).tolist() for c in lens])
            for p, lens in ((9, [2, 5, 3]), (30, [1]), (4, [6, 6, 1, 2]))]
    chunked = ScoringEngine(engine.model, config=EngineConfig(chunk_tokens=chunk))
    for params in (LABELS, ScoreParams(mode="loglik")):
        for a, b in zip(engine.score_requests(reqs, params), chunked.score_requests(reqs, params),
                        strict=True):
            assert (a - b).abs().max() <= 1e-5


def test_engine_loaded_under_inference_mode_scores(qwen3_dir, engine: Engine) -> None:
    # parameters created under inference_mode are inference tensors (no version counter)
    with torch.inference_mode():
        inner = Engine.from_pretrained(qwen3_dir)
        got = inner.score([5, 6, 7], [[8, 9], [10]], ScoreParams(mode="loglik"))
    want = engine.score([5, 6, 7], [[8, 9], [10]], ScoreParams(mode="loglik"))
    assert torch.allclose(torch.as_tensor(got), torch.as_tensor(want), atol=1e-5)
