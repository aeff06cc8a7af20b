"""The generative model's training loss, and distillation of its item head from teachers.

:func:`batch_loss` is the Semantic-ID cross-entropy of a packed batch plus, with an item head,
its cross-entropy over all items. With an :class:`ItemTeacher` (trained genrec models over the
same Semantic index: one, or several whose probabilities are averaged), the item term becomes
``(1 - weight) x cross-entropy + weight x KL(teacher || student)`` over all items at the same
rows (knowledge distillation): the student learns which other items the teachers find likely,
not only the one the user took. The teachers read exactly the student's batch (same tokens,
same seen items), once per step, without gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


class ItemTeacher:
    """Frozen teacher models for the item head, ``weight`` in (0, 1] the distillation's share
    of the item term. Each teacher needs an item head over the student's items and the
    student's vocabulary (the same Semantic index); their item-head probabilities are averaged
    (an ensemble's)."""

    def __init__(self, models: Sequence[DecoderLM], weight: float = DISTILL_WEIGHT) -> None:
        if not models:
            raise ValueError("teachers: give at least one model")
        if not 0 < weight <= 1:
            raise ValueError(f"distill weight must be in (0, 1], got {weight}")
        for m in models:
            if m.item_head is None:
                raise ValueError("teacher: a model with an item head is needed")
            m.eval().requires_grad_(False)
        self.models, self.weight = list(models), float(weight)

    @classmethod
    def load(cls, paths: Sequence[Path], weight: float = DISTILL_WEIGHT,
             device: str | torch.device = "cpu") -> ItemTeacher:
        """Load each folder of ``paths`` (a trained model, e.g. a run's ``model/``) in fp32."""
        from genrec.model import load_model

        return cls([load_model(p, dtype=torch.float32, device=device) for p in paths], weight)

    def check(self, student: DecoderLM) -> None:
        """Raise ValueError unless every teacher reads the student's tokens and scores its
        items: same vocabulary size, item count, soft-token size and items' Semantic IDs."""
        head = student.item_head
        if head is None:
            raise ValueError("teacher: the student has no item head to distil into")
        for i, m in enumerate(self.models):
            ours, theirs = student.config, m.config
            for name in ("vocab_size", "item_head", "user_dim"):
                if getattr(ours, name) != getattr(theirs, name):
                    raise ValueError(f"teacher {i}: {name} {getattr(theirs, name)}, the student "
                                     f"has {getattr(ours, name)} (another index or data?)")
            tokens = m.item_head.item_tokens
            if tokens is not None and head.item_tokens is not None and not torch.equal(
                    tokens.cpu(), head.item_tokens.cpu()):
                raise ValueError(f"teacher {i}: its items' Semantic IDs differ from the "
                                 "student's (another index?)")

    @torch.no_grad()
    def log_probs(self, batch: TrainBatch, at: torch.Tensor) -> torch.Tensor:
        """log of the teachers' mean item probabilities at the rows ``at`` [T] (bool) of
        ``batch`` -> [N, num_items] fp32, each teacher given the batch's seen items as in its own
        training (its history bias, else the items hidden)."""
        items = batch.item_labels.to(at.device)[at]
        total = None
        for m in self.models:
            hidden = batch_hidden(m, batch)[at]
            logp = torch.log_softmax(item_logits(m.item_head, hidden, items, batch.seen_items), -1)
            total = logp if total is None else torch.logaddexp(total, logp)
        return total - math.log(len(self.models))


def distill_loss(logits: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(teacher || softmax(``logits``)): [N, items] each."""
    student = torch.log_softmax(logits.float(), dim=-1)
    return F.kl_div(student, teacher_log_probs, log_target=True, reduction="batchmean")


def batch_loss(model: DecoderLM, batch: TrainBatch, vocab: SidVocab | None = None,
               item_weight: float = 1.0, teacher: ItemTeacher | None = None) -> torch.Tensor:
    """Mean cross-entropy over the batch's targets, normalised as the engine scores: over the
    full vocabulary, or over each target's level (``sid_normalize="level"``; needs ``vocab``);
    with an item head, plus ``item_weight`` x its mean cross-entropy over all items at the
    batch's item labels (over the items each user does not have yet, when the batch carries
    ``seen_items``), mixed with the distillation loss from ``teacher`` when given."""
    hidden = batch_hidden(model, batch)  # [T, hidden]
    labels = batch.labels.to(model.device)
    rows = labels != IGNORE
    if model.config.sid_normalize == "level":
        if vocab is None:
            raise ValueError("vocab: a level-normalised model's loss needs its SidVocab")
        loss = level_loss(model, hidden[rows], labels[rows], vocab)
    else:
        loss = F.cross_entropy(model.logits(hidden[rows]), labels[rows])
    if model.item_head is None:
        if teacher is not None:
            raise ValueError("teacher: the model has no item head to distil into")
        return loss
    if batch.item_labels is None:
        raise ValueError("batch.item_labels: a model with an item head needs them")
    items = batch.item_labels.to(model.device)
    at = items != IGNORE
    logits = item_logits(model.item_head, hidden[at], items[at], batch.seen_items)
    item = F.cross_entropy(logits, items[at])
    if teacher is not None:
        target = teacher.log_probs(batch, at)
        item = (1 - teacher.weight) * item + teacher.weight * distill_loss(logits, target)
    return loss + item_weight * item
