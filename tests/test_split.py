import random

import pytest

from genrec.data import Example, leave_one_out
from genrec.data.split import training_sequences


def test_hand_made_split():
    seqs = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    split = leave_one_out(seqs, max_history=2)
    assert split.train == [
        Example(0, [1], 2),
        Example(0, [1, 2], 3),
        Example(1, [7], 8),  # short user: whole sequence is training data
    ]
    assert split.val == [Example(0, [2, 3], 4), Example(2, [9], 10)]
    assert split.test == [Example(0, [3, 4], 5), Example(2, [9, 10], 11)]
    assert split.num_short_users == 1
    assert split.summary() == {"train": 3, "val": 2, "test": 2, "short_users": 1}
    whole = leave_one_out(seqs, max_history=None)  # every earlier item
    assert whole.train[1] == Example(0, [1, 2], 3)
    assert whole.val == [Example(0, [1, 2, 3], 4), Example(2, [9], 10)]
    assert whole.test == [Example(0, [1, 2, 3, 4], 5), Example(2, [9, 10], 11)]


def test_short_users_drop_and_min_interactions():
    seqs = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    split = leave_one_out(seqs, min_interactions=4, short_users="drop")
    assert split.num_short_users == 2
    assert [e.user for e in split.train + split.val + split.test] == [0, 0, 0, 0]
    assert split.test == [Example(0, [1, 2, 3, 4], 5)]
    with pytest.raises(ValueError, match="min_interactions"):
        leave_one_out(seqs, min_interactions=2)
    with pytest.raises(ValueError, match="max_history"):
        leave_one_out(seqs, max_history=0)
    with pytest.raises(ValueError, match="short_users"):
        leave_one_out(seqs, short_users="keep")


def test_random_split_invariants():
    rng = random.Random(0)
    seqs = [[rng.randrange(50) for _ in range(rng.randrange(3, 40))] for _ in range(30)]
    split = leave_one_out(seqs, max_history=5)
    assert len(split.val) == len(split.test) == 30
    for u, s in enumerate(seqs):
        train = [e for e in split.train if e.user == u]
        assert [e.target for e in train] == s[1:-2]
        for pos, e in enumerate(train, start=1):
            assert e.history == s[max(0, pos - 5) : pos]
        assert split.val[u] == Example(u, s[:-2][-5:], s[-2])
        assert split.test[u] == Example(u, s[:-1][-5:], s[-1])


def test_training_sequences_hold_out_last_two() -> None:
    assert training_sequences([[1, 2, 3, 4], [5, 6], [7, 8, 9]]) == [[1, 2], [5, 6], [7]]
    # the training parts leave_one_out trains on, short users whole
    assert training_sequences([[1, 2, 3, 4], [5, 6]], min_interactions=4) == [[1, 2], [5, 6]]
