"""The generative model's training loss, and distillation of its item head from teachers.

:func:`batch_loss` is the Semantic-ID cross-entropy of a packed batch plus, with an item head,
its cross-entropy over all items. With an :class:`ItemTeacher` (trained genrec models over the
same Semantic index: one, or several whose probabilities are averaged), the item term becomes
``(1 - weight) x cross-entropy + weight x KL(teacher || student)`` over all items at the same
rows (knowledge distillation): the student learns which other items the teachers find likely,
not only the one the user took. At a ``temperature`` T other than 1 both distributions are taken
at T (log-probabilities / T, renormalised) and the KL is scaled by T^2 (Hinton et al.): T < 1
weighs the items the teachers rank highest, T > 1 the tail. With ``sid_weight`` the Semantic-ID
term is mixed the same way with KL to the teachers' mean next-token distribution (over the
vocabulary, or over each target's level when the model normalises per level). The teachers read
exactly the student's batch (same tokens, same seen items), once per step, without gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from genrec.engine.inputs import PackedInputs, build_input_embeds
from genrec.model.decoder import DecoderLM
from genrec.model.item_head import item_logits
from genrec.model.layout import build_layout
from genrec.training.extend_vocab import level_loss
from genrec.training.windows import IGNORE, TrainBatch
from genrec.vocab.sid_vocab import SidVocab

# the distillation's share of the item head's loss when none is given (amazon14-beauty,
# docs/results.md: 0.8 validated above 0.5)
DISTILL_WEIGHT = 0.8
DISTILL_TEMPERATURE = 1.0


def batch_hidden(model: DecoderLM, batch: TrainBatch) -> torch.Tensor:
    """The final hidden states of a packed batch: one forward over its windows -> [T, hidden]."""
    inputs = PackedInputs(
        token_ids=batch.token_ids, raw_rows=torch.zeros(0, dtype=torch.long), raw_embeds=None,
        soft_rows=batch.soft_rows, user_vectors=batch.user_vectors,
    )
    # the soft token enters exactly as at serving: projector(user vector) at the soft rows
    embeds = build_input_embeds(model.model.embed_tokens, inputs, None, model.user_projector,
                                model.item_head)
    layout = build_layout(batch.lengths, [], []).to(model.device)
    return model(embeds, layout.positions, layout)


def sid_log_probs(model: DecoderLM, hidden: torch.Tensor, labels: torch.Tensor,
                  vocab: SidVocab | None = None) -> torch.Tensor:
    """Next-token log-probabilities at Semantic-ID targets, normalised as the model is trained
    and scored: hidden [N, hidden], labels [N] -> [N, vocab] fp32; over the whole vocabulary, or
    (``sid_normalize="level"``, needs ``vocab``) over each label's level, -inf elsewhere."""
    logits = model.logits(hidden).float()
    if model.config.sid_normalize != "level":
        return torch.log_softmax(logits, -1)
    if vocab is None:
        raise ValueError("vocab: a level-normalised model's loss needs its SidVocab")
    inside = torch.zeros_like(logits, dtype=torch.bool)
    for offset, size in zip(vocab.level_offsets, vocab.index.codebook_sizes, strict=True):
        rows = (labels >= offset) & (labels < offset + size)
        inside[rows, offset : offset + size] = True
    if not bool(inside.any(-1).all()):
        raise ValueError("labels: some targets are not Semantic-ID tokens")
    return torch.log_softmax(logits.masked_fill(~inside, float("-inf")), -1)


@dataclass(frozen=True)
class TeacherTargets:
    """The teachers' mean distributions for one batch: ``items`` [N, num_items] log-probs at
    the item-labelled rows; ``sids`` [M, vocab] at the Semantic-ID-labelled rows, or None when
    the Semantic-ID term is not distilled."""

    items: torch.Tensor
    sids: torch.Tensor | None


class ItemTeacher:
    """Frozen teacher models, ``weight`` in (0, 1] the distillation's share of the item head's
    term and ``sid_weight`` in [0, 1] its share of the Semantic-ID term (0: labels only). Each
    teacher needs an item head over the student's items and the student's vocabulary (the same
    Semantic index); their probabilities are averaged (an ensemble's). ``temperature`` > 0:
    the item term's distillation temperature (:func:`distill_loss`)."""

    def __init__(self, models: Sequence[DecoderLM], weight: float = DISTILL_WEIGHT,
                 sid_weight: float = 0.0, temperature: float = DISTILL_TEMPERATURE) -> None:
        if not models:
            raise ValueError("teachers: give at least one model")
        if not 0 < weight <= 1:
            raise ValueError(f"distill weight must be in (0, 1], got {weight}")
        if not 0 <= sid_weight <= 1:
            raise ValueError(f"sid distill weight must be in [0, 1], got {sid_weight}")
        if not temperature > 0:
            raise ValueError(f"distill temperature must be > 0, got {temperature}")
        for m in models:
            if m.item_head is None:
                raise ValueError("teacher: a model with an item head is needed")
            m.eval().requires_grad_(False)
        self.models, self.weight, self.sid_weight = list(models), float(weight), float(sid_weight)
        self.temperature = float(temperature)

    @classmethod
    def load(cls, paths: Sequence[Path], weight: float = DISTILL_WEIGHT,
             device: str | torch.device = "cpu", sid_weight: float = 0.0,
             temperature: float = DISTILL_TEMPERATURE) -> ItemTeacher:
        """Load each folder of ``paths`` (a trained model, e.g. a run's ``model/``) in fp32."""
        from genrec.model import load_model

        return cls([load_model(p, dtype=torch.float32, device=device) for p in paths], weight,
                   sid_weight, temperature)

    def check(self, student: DecoderLM) -> None:
        """Raise ValueError unless every teacher reads the student's tokens and scores its
        items: same vocabulary size, item count, soft-token size and items' Semantic IDs (and,
        distilling the Semantic IDs, the same normalisation of their probabilities)."""
        head = student.item_head
        if head is None:
            raise ValueError("teacher: the student has no item head to distil into")
        names = ("vocab_size", "item_head", "user_dim") + (
            ("sid_normalize",) if self.sid_weight > 0 else ())
        for i, m in enumerate(self.models):
            ours, theirs = student.config, m.config
            for name in names:
                if getattr(ours, name) != getattr(theirs, name):
                    raise ValueError(f"teacher {i}: {name} {getattr(theirs, name)}, the student "
                                     f"has {getattr(ours, name)} (another index or data?)")
            tokens = m.item_head.item_tokens
            if tokens is not None and head.item_tokens is not None and not torch.equal(
                    tokens.cpu(), head.item_tokens.cpu()):
                raise ValueError(f"teacher {i}: its items' Semantic IDs differ from the "
                                 "student's (another index?)")

    @torch.no_grad()
    def targets(self, batch: TrainBatch, at: torch.Tensor, rows: torch.Tensor | None = None,
                vocab: SidVocab | None = None) -> TeacherTargets:
        """The teachers' mean distributions, one forward each: over all items at the rows
        ``at`` [T] (bool) of ``batch``, each teacher given the batch's seen items as in its own
        training (its history bias, else the items hidden); with ``sid_weight`` > 0, over the
        next Semantic-ID token at the rows ``rows`` [T] (bool, the labelled ones)."""
        items = batch.item_labels.to(at.device)[at]
        labels = batch.labels.to(at.device)[rows] if rows is not None else None
        item_total = sid_total = None
        for m in self.models:
            hidden = batch_hidden(m, batch)
            logp = torch.log_softmax(item_logits(m.item_head, hidden[at], items,
                                                 batch.seen_items), -1)
            item_total = logp if item_total is None else torch.logaddexp(item_total, logp)
            if self.sid_weight > 0 and labels is not None:
                logp = sid_log_probs(m, hidden[rows], labels, vocab)
                sid_total = logp if sid_total is None else torch.logaddexp(sid_total, logp)
        n = math.log(len(self.models))
        return TeacherTargets(item_total - n, None if sid_total is None else sid_total - n)


def distill_loss(log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
    """Mean over rows of KL(teacher || student), both given as log-probabilities [N, classes];
    at a ``temperature`` T != 1 both taken at T (log-probabilities / T, renormalised) and the KL
    scaled by T^2. Classes the teacher rules out (-inf) add nothing; where the student rules
    classes out (a student that hides the user's items, a teacher that only pushes them down),
    the teacher's distribution is taken over the student's classes (renormalised), so the loss
    stays finite."""
    log_probs = log_probs.float()
    if temperature != 1.0:
        log_probs = torch.log_softmax(log_probs / temperature, -1)
        teacher_log_probs = teacher_log_probs.float() / temperature
    # renormalised over the student's classes (the same where it rules none out; no host sync)
    teacher_log_probs = torch.log_softmax(
        teacher_log_probs.masked_fill(~torch.isfinite(log_probs), float("-inf")), -1)
    p = teacher_log_probs.exp()
    terms = p * (teacher_log_probs - log_probs)
    kl = torch.where(p > 0, terms, torch.zeros_like(terms)).sum(-1).mean()
    return kl * temperature**2


def batch_loss(model: DecoderLM, batch: TrainBatch, vocab: SidVocab | None = None,
               item_weight: float = 1.0, teacher: ItemTeacher | None = None) -> torch.Tensor:
    """Mean cross-entropy over the batch's targets, normalised as the engine scores: over the
    full vocabulary, or over each target's level (``sid_normalize="level"``; needs ``vocab``);
    with an item head, plus ``item_weight`` x its mean cross-entropy over all items at the
    batch's item labels (over the items each user does not have yet, when the batch carries
    ``seen_items``); each term mixed with the distillation loss from ``teacher`` when given
    (the Semantic-ID one at ``teacher.sid_weight``)."""
    hidden = batch_hidden(model, batch)  # [T, hidden]
    labels = batch.labels.to(model.device)
    rows = labels != IGNORE
    if model.item_head is None:
        if teacher is not None:
            raise ValueError("teacher: the model has no item head to distil into")
        return sid_loss(model, hidden[rows], labels[rows], vocab)
    if batch.item_labels is None:
        raise ValueError("batch.item_labels: a model with an item head needs them")
    items = batch.item_labels.to(model.device)
    at = items != IGNORE
    logits = item_logits(model.item_head, hidden[at], items[at], batch.seen_items)
    item = F.cross_entropy(logits, items[at])
    if teacher is None:
        return sid_loss(model, hidden[rows], labels[rows], vocab) + item_weight * item
    target = teacher.targets(batch, at, rows, vocab)
    kl = distill_loss(torch.log_softmax(logits.float(), -1), target.items, teacher.temperature)
    item = (1 - teacher.weight) * item + teacher.weight * kl
    if target.sids is None:
        return sid_loss(model, hidden[rows], labels[rows], vocab) + item_weight * item
    student = sid_log_probs(model, hidden[rows], labels[rows], vocab)  # [M, vocab]
    loss = F.nll_loss(student, labels[rows])
    loss = (1 - teacher.sid_weight) * loss + teacher.sid_weight * distill_loss(student,
                                                                               target.sids)
    return loss + item_weight * item


def sid_loss(model: DecoderLM, hidden: torch.Tensor, labels: torch.Tensor,
             vocab: SidVocab | None) -> torch.Tensor:
    """Mean cross-entropy of Semantic-ID targets ``labels`` [N] given ``hidden`` [N, hidden],
    over the full vocabulary or each target's level (``sid_normalize="level"``)."""
    if model.config.sid_normalize == "level":
        if vocab is None:
            raise ValueError("vocab: a level-normalised model's loss needs its SidVocab")
        return level_loss(model, hidden, labels, vocab)
    return F.cross_entropy(model.logits(hidden), labels)
