"""The generative loss and the item head's distillation from teachers, on generated data."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from item_head_support import tiny_vocab

from genrec.model.checkpoint import save_model
from genrec.model.registry import build_model
from genrec.training.generative_loss import (
    ItemTeacher,
    batch_hidden,
    batch_loss,
    distill_loss,
    sid_log_probs,
)
from genrec.training.generative_task import GenerativeTask, scratch_config, set_item_tokens
from genrec.training.windows import IGNORE
from genrec.vocab.sid_vocab import SidVocab


def head_model(vocab: SidVocab, seed: int, history_bias: bool = True,  # noqa: ANN201
               normalize: str = "full"):
    torch.manual_seed(seed)
    config = scratch_config(vocab, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                            item_head=True, item_inputs=True, history_bias=history_bias)
    model = build_model(dataclasses.replace(config, sid_normalize=normalize))
    set_item_tokens(model, vocab)
    with torch.no_grad():
        model.item_head.weight.normal_(0.0, 0.5)  # spread distributions: KL far from 0
        if history_bias:
            model.item_head.history_bias.fill_(-0.3)
    return model.eval()


def one_batch(vocab: SidVocab):  # noqa: ANN201
    g = torch.Generator().manual_seed(1)
    n = vocab.index.num_items
    seqs = [torch.randint(0, n, (int(k),), generator=g).tolist() for k in (5, 7, 9, 4)]
    task = GenerativeTask(vocab, seqs, batch_tokens=10_000, history_bias=True)
    return next(iter(task.batches(0)))


def test_a_teacher_identical_to_the_student_adds_nothing_at_full_weight() -> None:
    vocab = tiny_vocab()
    student, batch = head_model(vocab, 0), one_batch(vocab)
    teacher = ItemTeacher([copy.deepcopy(student)], weight=1.0)
    teacher.check(student)
    sid_only = batch_loss(student, batch, vocab, item_weight=0.0)
    distilled = batch_loss(student, batch, vocab, item_weight=3.0, teacher=teacher)
    # the teacher reads the same tokens and seen items: KL(p || p) = 0
    assert torch.allclose(distilled, sid_only, atol=1e-5)


def test_the_item_term_mixes_cross_entropy_and_kl_to_the_teachers_mean() -> None:
    vocab = tiny_vocab()
    student, batch = head_model(vocab, 0), one_batch(vocab)
    a, b = head_model(vocab, 1), head_model(vocab, 2, history_bias=False)
    teacher = ItemTeacher([a, b], weight=0.25)
    items = batch.item_labels
    at = items != IGNORE
    got = teacher.targets(batch, at).items
    # the mean of the two teachers' probabilities, each with its own rule for seen items
    pa = a.item_head.log_probs(batch_hidden(a, batch)[at], batch.seen_items).exp()
    hidden_b = batch_hidden(b, batch)[at]
    logits_b = b.item_head.logits(hidden_b)
    hidden_rows = torch.arange(logits_b.shape[0])[:, None].expand_as(batch.seen_items)
    seen = batch.seen_items >= 0
    logits_b[hidden_rows[seen], batch.seen_items[seen]] = float("-inf")
    logits_b[torch.arange(logits_b.shape[0]), items[at]] = b.item_head.logits(hidden_b)[
        torch.arange(logits_b.shape[0]), items[at]]
    pb = torch.softmax(logits_b, -1)
    assert torch.allclose(got.exp(), (pa + pb) / 2, atol=1e-6)
    # the student's loss: SID cross-entropy + w x (0.75 CE + 0.25 KL)
    logits = student.item_head.with_history(
        student.item_head.logits(batch_hidden(student, batch)[at]), batch.seen_items)
    ce = F.cross_entropy(logits, items[at])
    kl = (got.exp() * (got - torch.log_softmax(logits, -1))).sum(-1).mean()
    assert float(kl.detach()) > 0.1
    expected = batch_loss(student, batch, vocab, item_weight=0.0) + 2.0 * (0.75 * ce + 0.25 * kl)
    assert torch.allclose(batch_loss(student, batch, vocab, 2.0, teacher), expected, atol=1e-5)


def test_gradients_reach_the_student_only() -> None:
    vocab = tiny_vocab()
    student, batch = head_model(vocab, 0).train(), one_batch(vocab)
    teacher_model = head_model(vocab, 1)
    before = {k: v.clone() for k, v in teacher_model.state_dict().items()}
    batch_loss(student, batch, vocab, teacher=ItemTeacher([teacher_model])).backward()
    assert student.item_head.weight.grad is not None
    assert all(p.grad is None and not p.requires_grad for p in teacher_model.parameters())
    assert not teacher_model.training
    assert all(torch.equal(v, teacher_model.state_dict()[k]) for k, v in before.items())


def test_distill_loss_is_zero_only_at_the_teacher() -> None:
    logp = torch.log_softmax(torch.randn(3, 7), -1)
    assert float(distill_loss(logp, logp)) == pytest.approx(0, abs=1e-6)
    assert float(distill_loss(logp, torch.log_softmax(2 * logp, -1))) > 0
    # classes the teacher rules out add nothing, even where the student rules them out too
    ruled_out = torch.log_softmax(logp.masked_fill(torch.arange(7) < 2, float("-inf")), -1)
    assert float(distill_loss(ruled_out, ruled_out)) == pytest.approx(0, abs=1e-6)
    assert torch.isfinite(distill_loss(logp, ruled_out))
    # the student's ruled-out classes: the teacher's distribution over the rest
    assert float(distill_loss(ruled_out, logp)) == pytest.approx(0, abs=1e-6)


def test_a_temperature_tempers_both_distributions_and_scales_by_its_square() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(3, 7), torch.randn(3, 7)
    logp, target = torch.log_softmax(student, -1), torch.log_softmax(teacher, -1)
    for t in (0.5, 2.0):
        p = torch.softmax(teacher / t, -1)
        expected = t**2 * (p * (torch.log(p) - torch.log_softmax(student / t, -1))).sum(-1).mean()
        assert float(distill_loss(logp, target, t)) == pytest.approx(float(expected), rel=1e-5)
        # at any temperature the loss is zero exactly at the teacher
        assert float(distill_loss(target, target, t)) == pytest.approx(0, abs=1e-6)
    assert float(distill_loss(logp, target, 1.0)) == float(distill_loss(logp, target))
    # T < 1 weighs the teachers' top classes: moving probability among the tail costs less
    tail = target.clone()
    for row, order in zip(tail, target.argsort(-1), strict=True):
        row[order[:3]] = row[order[:3]].flip(0)  # the three least likely classes swapped
    assert float(distill_loss(tail, target, 0.5)) < float(distill_loss(tail, target, 2.0))


def test_the_item_term_distils_at_the_teachers_temperature() -> None:
    vocab = tiny_vocab()
    student, batch = head_model(vocab, 0), one_batch(vocab)
    teacher = ItemTeacher([head_model(vocab, 1)], weight=0.5, temperature=2.0)
    at = batch.item_labels != IGNORE
    got = teacher.targets(batch, at).items
    logits = student.item_head.with_history(
        student.item_head.logits(batch_hidden(student, batch)[at]), batch.seen_items)
    ce = F.cross_entropy(logits, batch.item_labels[at])
    kl = distill_loss(torch.log_softmax(logits, -1), got, 2.0)
    assert float(kl.detach()) != pytest.approx(float(distill_loss(
        torch.log_softmax(logits, -1), got).detach()), rel=1e-3)
    expected = batch_loss(student, batch, vocab, item_weight=0.0) + 0.5 * ce + 0.5 * kl
    assert torch.allclose(batch_loss(student, batch, vocab, 1.0, teacher), expected, atol=1e-5)
    with pytest.raises(ValueError, match="distill temperature"):
        ItemTeacher([head_model(vocab, 1)], temperature=0.0)


def test_teachers_over_another_index_or_without_a_head_are_refused(tmp_path: Path) -> None:
    vocab = tiny_vocab()
    student = head_model(vocab, 0)
    other_model = head_model(vocab, 1)
    with torch.no_grad():
        other_model.item_head.item_tokens.copy_(other_model.item_head.item_tokens.flip(0))
    with pytest.raises(ValueError, match="Semantic IDs differ"):
        ItemTeacher([other_model]).check(student)
    torch.manual_seed(0)
    no_head = build_model(scratch_config(vocab, hidden=32, layers=1, heads=4, kv_heads=2,
                                         head_dim=8))
    with pytest.raises(ValueError, match="item head"):
        ItemTeacher([no_head])
    with pytest.raises(ValueError, match="distill weight"):
        ItemTeacher([head_model(vocab, 1)], weight=0.0)
    with pytest.raises(ValueError, match="item head to distil"):
        ItemTeacher([head_model(vocab, 1)]).check(no_head)
    save_model(head_model(vocab, 2), tmp_path / "t")
    loaded = ItemTeacher.load([tmp_path / "t"], 0.5)
    loaded.check(student)
    assert loaded.weight == 0.5 and not loaded.models[0].training


def test_a_teacher_identical_to_the_student_leaves_no_loss_at_full_weights() -> None:
    vocab = tiny_vocab()
    for normalize in ("full", "level"):
        student, batch = head_model(vocab, 0, normalize=normalize), one_batch(vocab)
        teacher = ItemTeacher([copy.deepcopy(student)], weight=1.0, sid_weight=1.0)
        teacher.check(student)
        assert float(batch_loss(student, batch, vocab, teacher=teacher).detach()) == pytest.approx(
            0, abs=1e-5)
        assert float(batch_loss(student, batch, vocab, item_weight=0.0).detach()) > 1.0


def test_the_sid_term_mixes_cross_entropy_and_kl_to_the_teachers_next_tokens() -> None:
    vocab = tiny_vocab()
    for normalize in ("full", "level"):
        student, batch = head_model(vocab, 0, normalize=normalize), one_batch(vocab)
        a, b = (head_model(vocab, s, normalize=normalize) for s in (1, 2))
        teacher = ItemTeacher([a, b], weight=0.5, sid_weight=0.3)
        rows = batch.labels != IGNORE
        labels = batch.labels[rows]
        got = teacher.targets(batch, batch.item_labels != IGNORE, rows, vocab).sids
        mean = sum(torch.softmax(m.logits(batch_hidden(m, batch)[rows]).float(), -1)
                   if normalize == "full" else sid_log_probs(m, batch_hidden(m, batch)[rows],
                                                             labels, vocab).exp()
                   for m in (a, b)) / 2
        assert torch.allclose(got.exp(), mean, atol=1e-6)
        # each row's distribution covers its level's codes only when normalised per level
        assert torch.allclose(got.exp().sum(-1), torch.ones(len(labels)), atol=1e-5)
        if normalize == "level":
            assert int(torch.isfinite(got).sum()) < got.numel()
        student_logp = sid_log_probs(student, batch_hidden(student, batch)[rows], labels, vocab)
        ce = F.nll_loss(student_logp, labels)
        p = got.exp()
        kl = torch.where(p > 0, p * (got - student_logp), torch.zeros_like(p)).sum(-1).mean()
        assert float(kl.detach()) > 0.05
        sid_only = batch_loss(student, batch, vocab, item_weight=0.0)
        assert torch.allclose(sid_only, ce, atol=1e-5)  # the labels' loss, however computed
        expected = 0.7 * ce + 0.3 * kl
        assert torch.allclose(batch_loss(student, batch, vocab, 0.0, teacher), expected,
                              atol=1e-5)


def test_a_teacher_that_hides_seen_items_gives_a_finite_loss_and_gradient() -> None:
    # its log-probabilities are -inf at the seen items: KL counts those items as nothing
    vocab = tiny_vocab()
    student, batch = head_model(vocab, 0).train(), one_batch(vocab)
    assert (batch.seen_items >= 0).any()
    teacher = ItemTeacher([head_model(vocab, 1, history_bias=False)], weight=0.8)
    at = batch.item_labels != IGNORE
    assert not torch.isfinite(teacher.targets(batch, at).items).all()
    loss = batch_loss(student, batch, vocab, teacher=teacher)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None)
    # and the other way round: a student that hides them, a teacher that only pushes them down
    student = head_model(vocab, 0, history_bias=False).train()
    loss = batch_loss(student, batch, vocab, teacher=ItemTeacher([head_model(vocab, 1)]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None)


def test_sid_distillation_needs_the_teachers_normalisation() -> None:
    vocab = tiny_vocab()
    student = head_model(vocab, 0, normalize="level")
    ItemTeacher([head_model(vocab, 1)]).check(student)  # items only: the head's softmax
    with pytest.raises(ValueError, match="sid_normalize"):
        ItemTeacher([head_model(vocab, 1)], sid_weight=0.5).check(student)
    with pytest.raises(ValueError, match="sid distill weight"):
        ItemTeacher([head_model(vocab, 1)], sid_weight=1.5)
