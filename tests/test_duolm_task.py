"""DuoLM training: differentiable scores equal the engine's, end-to-end gradients,
distillation loss, deterministic batches, checkpoints with resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from genrec.data.split import Example
from genrec.duolm.encoder import EncoderConfig, ItemEncoder, ItemFeatures
from genrec.duolm.prompts import STUDENT_VOCAB_SIZE, StudentPrompts
from genrec.duolm.requests import RowRankRequest
from genrec.model.registry import build_model
from genrec.training.duolm_task import DuoModel, RankingTask, ranker_config
from genrec.training.initialization import init_weights
from genrec.training.loop import LoopConfig, fit

N_ITEMS, K, HIDDEN = 24, 2, 16


def make_student(seed: int = 0, user_dim: int = 0) -> tuple[DuoModel, ItemFeatures]:
    torch.manual_seed(seed)
    cfg = ranker_config(STUDENT_VOCAB_SIZE, HIDDEN, 1, 2, 1, 128)
    ranker = build_model(dataclasses.replace(cfg, user_dim=user_dim))
    init_weights(ranker, std=0.2)
    encoder = ItemEncoder(EncoderConfig(backend="minilm", k=K, hidden_size=HIDDEN,
                                        feature_dim=12, inner_size=16))
    return DuoModel(ranker, encoder), ItemFeatures(embeddings=torch.randn(N_ITEMS, 12))


def examples() -> list[Example]:
    return [Example(u, [(u + j) % N_ITEMS for j in range(1 + u % 4)], (u * 5 + 1) % N_ITEMS)
            for u in range(20)]


class FixedTeacher:
    """A teacher whose scores are a fixed function of the candidate id."""

    def rank_rows(self, requests: list[RowRankRequest]) -> list[torch.Tensor]:
        return [torch.tensor([float(c % 7) for c in r.candidates]) for r in requests]


def make_task(features: ItemFeatures, **kw) -> RankingTask:  # noqa: ANN003
    return RankingTask(StudentPrompts(K, STUDENT_VOCAB_SIZE), examples(), N_ITEMS,
                       {"kind": "student", "max_history": 20, "k": K}, features,
                       negatives=5, users_per_step=8, **kw)


def test_training_scores_equal_engine_scores() -> None:
    model, feats = make_student()
    task = make_task(feats)
    batch = task.batches(0)[0]
    train = task.scores(model, batch)  # [B, 6], with autograd
    rank = task.rank_fn(model)
    served = torch.stack(rank([RowRankRequest(ex.history, c)
                               for ex, c in zip(batch.examples, batch.candidates, strict=True)]))
    torch.testing.assert_close(train.detach(), served, atol=1e-4, rtol=0)


def test_soft_token_scores_equal_engine_scores() -> None:
    model, feats = make_student(user_dim=3)
    vectors = torch.randn(20, 3)
    task = make_task(feats, user_vectors=vectors)
    batch = task.batches(0)[0]
    train = task.scores(model, batch)
    served = torch.stack(task.rank_fn(model)([
        RowRankRequest(ex.history, c, vectors[ex.user])
        for ex, c in zip(batch.examples, batch.candidates, strict=True)]))
    torch.testing.assert_close(train.detach(), served, atol=1e-4, rtol=0)
    other = make_task(feats, user_vectors=torch.randn(20, 3)).scores(model, batch)
    assert not torch.allclose(other, train)  # the user vector matters


def test_gradients_reach_encoder_and_ranker() -> None:
    model, feats = make_student()
    task = make_task(feats)
    loss, n = task.loss(model, task.batches(0)[0])
    loss.backward()
    assert n == 8 * 6
    assert model.encoder.fc1.weight.grad.abs().sum() > 0
    assert model.ranker.model.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0


def test_distillation_term() -> None:
    model, feats = make_student()
    task = make_task(feats, teacher=FixedTeacher(), distill_weight=1.0, temperature=2.0)
    batch = task.batches(0)[0]
    loss, _ = task.loss(model, batch)
    s = task.scores(model, batch).detach()
    t = torch.tensor([[float(c % 7) for c in cs] for cs in batch.candidates])
    p_t = F.softmax(t / 2, -1)
    kl = (p_t * (p_t.log() - F.log_softmax(s / 2, -1))).sum(-1).mean() * 4
    torch.testing.assert_close(loss.detach(), kl, atol=1e-5, rtol=1e-5)


def test_batches_are_deterministic_and_negatives_avoid_the_target() -> None:
    _, feats = make_student()
    task = make_task(feats)
    a, b = task.batches(1), task.batches(1)
    assert [x.candidates for x in a] == [x.candidates for x in b]
    assert [x.candidates for x in a] != [x.candidates for x in task.batches(2)]
    for batch in a:
        for ex, cands in zip(batch.examples, batch.candidates, strict=True):
            assert cands[0] == ex.target and ex.target not in cands[1:]
            assert all(0 <= c < N_ITEMS for c in cands)
    assert sum(len(x.examples) for x in a) == 20 and task.num_batches(1) == len(a)


def test_bad_task_settings() -> None:
    _, feats = make_student()
    with pytest.raises(ValueError, match="negatives"):
        RankingTask(
            StudentPrompts(K), examples(), N_ITEMS, {}, feats, negatives=N_ITEMS)
    with pytest.raises(ValueError, match="features"):
        RankingTask(StudentPrompts(K), examples(), N_ITEMS, {}, None)
    with pytest.raises(ValueError, match="distill_weight"):
        make_task(feats, distill_weight=1.5)


def test_fit_checkpoints_and_resumes(tmp_path: Path) -> None:
    model, feats = make_student()
    val = examples()[:6]
    cands = [[ex.target] + [(ex.target + j) % N_ITEMS for j in range(1, 10)] for ex in val]
    task = make_task(feats, val_examples=val, val_candidates=cands)
    cfg = LoopConfig(epochs=1, lr=3e-3, progress=False, patience=0)
    result = fit(model, task, tmp_path, cfg)
    assert result.epochs_done == 1 and "val_mrr" in result.history[0]
    last = tmp_path / "last"
    assert (last / "item_encoder" / "encoder.safetensors").is_file()
    assert (last / "duolm.json").is_file()
    fresh, _ = make_student(seed=1)
    fresh.load_weights(last)
    batch = task.batches(0)[0]
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval().encoder(feats, torch.arange(4)),
                                   model.eval().encoder(feats, torch.arange(4)))
    resumed = fit(fresh, task, tmp_path, LoopConfig(epochs=2, lr=3e-3, progress=False,
                                                   patience=0), resume=True)
    assert resumed.epochs_done == 2 and len(resumed.history) == 2
    assert task.scores(fresh, batch).shape == (8, 6)
