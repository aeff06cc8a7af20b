"""Leave-one-out split into (user, history, target) examples.

For a user with sequence ``s`` (oldest first) and ``len(s) >= min_interactions``:

* test: history ``s[:-1]``, target ``s[-1]``;
* validation: history ``s[:-2]``, target ``s[-2]``;
* train: the part ``s[:-2]``; every item from its 2nd one on is a target with the items before it
  as history (TIGER/SASRec style).

Every history is truncated to its last ``max_history`` items (None: every earlier item).

Users with fewer than ``min_interactions`` interactions ("short users") are never evaluated: they
get no validation/test example, are counted in :attr:`LeaveOneOutSplit.num_short_users`, and
(with ``short_users="train"``, the default) their whole sequence is used as training data; with
``short_users="drop"`` they are left out entirely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple


class Example(NamedTuple):
    """One next-item example: ``history`` (oldest first, at most the split's ``max_history``
    items) predicts ``target``."""

    user: int
    history: list[int]
    target: int


@dataclass
class LeaveOneOutSplit:
    """Train/validation/test examples of a leave-one-out split and its bookkeeping."""

    train: list[Example]
    val: list[Example]
    test: list[Example]
    max_history: int | None
    min_interactions: int
    num_short_users: int
    short_users: str

    def summary(self) -> dict[str, int]:
        """Counts of examples per split and of short (non-evaluated) users."""
        return {
            "train": len(self.train),
            "val": len(self.val),
            "test": len(self.test),
            "short_users": self.num_short_users,
        }


def _history(seq: Sequence[int], end: int, max_history: int | None) -> list[int]:
    # the items before position ``end``: the last ``max_history`` of them (None: all)
    return list(seq[0 if max_history is None else max(0, end - max_history) : end])


def _prefix_examples(user: int, seq: Sequence[int], max_history: int | None) -> list[Example]:
    return [Example(user, _history(seq, j, max_history), seq[j]) for j in range(1, len(seq))]


def training_sequences(
    sequences: Sequence[Sequence[int]], min_interactions: int = 3
) -> list[list[int]]:
    """Each user's training part: all but the last two items (the validation and test targets);
    users with fewer than ``min_interactions`` items are never evaluated and keep all of them
    (as :func:`leave_one_out` does)."""
    return [list(s) if len(s) < min_interactions else list(s[:-2]) for s in sequences]


def leave_one_out(
    sequences: Sequence[Sequence[int]],
    max_history: int | None = 20,
    min_interactions: int = 3,
    short_users: Literal["train", "drop"] = "train",
) -> LeaveOneOutSplit:
    """Split per-user sequences (index = user index) leave-one-out; see the module docstring."""
    if max_history is not None and max_history < 1:
        raise ValueError(f"max_history must be >= 1, got {max_history}")
    if min_interactions < 3:
        raise ValueError(
            f"min_interactions must be >= 3 (one training item, one validation and one test "
            f"target), got {min_interactions}"
        )
    if short_users not in ("train", "drop"):
        raise ValueError(f"short_users must be 'train' or 'drop', got {short_users!r}")
    train: list[Example] = []
    val: list[Example] = []
    test: list[Example] = []
    num_short = 0
    for user, seq in enumerate(sequences):
        if len(seq) < min_interactions:
            num_short += 1
            if short_users == "train":
                train.extend(_prefix_examples(user, seq, max_history))
            continue
        train.extend(_prefix_examples(user, seq[:-2], max_history))
        val.append(Example(user, _history(seq, len(seq) - 2, max_history), seq[-2]))
        test.append(Example(user, _history(seq, len(seq) - 1, max_history), seq[-1]))
    return LeaveOneOutSplit(
        train=train,
        val=val,
        test=test,
        max_history=max_history,
        min_interactions=min_interactions,
        num_short_users=num_short,
        short_users=short_users,
    )
