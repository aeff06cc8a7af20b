"""The demo: synthetic data generator, tiny training, metrics, and a shortened main job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from genrec.demo import SyntheticConfig, TrainConfig, generate, run_demo
from genrec.demo.evaluate import rank_of_positive, sample_candidates, user_prefix
from genrec.demo.synthetic import (
    BOS,
    ITEM_OFFSET,
    item_token,
    popularity,
    sample_negatives,
    split_users,
    token_item,
)
from genrec.demo.train import pack_batch, sequence_loss, tiny_config, train_model

SMALL = SyntheticConfig(num_items=60, num_clusters=6, num_users=300, min_len=5, max_len=10)


def test_generate_structure() -> None:
    data = generate(SMALL)
    cfg = data.config
    assert data.item_cluster.shape == (60,)
    assert sorted(set(data.item_cluster.tolist())) == list(range(6))
    assert (np.diff(data.item_cluster) >= 0).all()  # contiguous clusters
    assert len(data.sequences) == 300 and data.preferred.shape == (300,)
    same, steps = 0, 0
    for seq in data.sequences:
        assert cfg.min_len <= len(seq) <= cfg.max_len
        assert len(set(seq)) == len(seq)  # no item twice
        assert all(0 <= i < cfg.num_items for i in seq)
        clusters = data.item_cluster[seq]
        same += int((clusters[1:] == clusters[:-1]).sum())
        steps += len(seq) - 1
    assert same / steps > 0.75  # users mostly stay within a cluster
    assert list(data.cluster_items(1)) == list(range(10, 20))


def test_generate_is_seeded() -> None:
    a, b = generate(SMALL), generate(SMALL)
    assert a.sequences == b.sequences
    c = generate(SyntheticConfig(**{**SMALL.__dict__, "seed": 1}))
    assert c.sequences != a.sequences


def test_generate_rejects_bad_config() -> None:
    with pytest.raises(ValueError):
        generate(SyntheticConfig(num_items=10, num_clusters=10))
    with pytest.raises(ValueError):
        generate(SyntheticConfig(min_len=1))


def test_tokens_split_popularity_negatives() -> None:
    assert item_token(0) == ITEM_OFFSET and token_item(item_token(7)) == 7
    assert token_item(BOS) == -1
    data = generate(SMALL)
    train, held = split_users(data, 50)
    assert len(held) == 50 and not set(train) & set(held)
    assert sorted(train + held) == list(range(300))
    counts = popularity(data, train)
    assert counts.sum() == sum(len(data.sequences[u]) for u in train)
    rng = np.random.default_rng(0)
    negs = sample_negatives(rng, 60, [1, 2, 3], 57)
    assert len(set(negs)) == 57 and not {1, 2, 3} & set(negs)
    with pytest.raises(ValueError):
        sample_negatives(rng, 60, [1, 2, 3], 58)


def test_rank_of_positive_ties() -> None:
    assert rank_of_positive(1.0, [0.0, 0.5]) == 0
    assert rank_of_positive(0.0, [1.0, 0.0, -1.0]) == 1.5


def test_sample_candidates() -> None:
    data = generate(SMALL)
    cands, target = sample_candidates(data, 0, 12)
    seq = data.sequences[0]
    assert target == seq[-1] and target in cands
    assert len(cands) == len(set(cands)) == 12
    assert not set(cands) & set(seq[:-1])


def test_pack_batch_targets() -> None:
    ids, targets, lengths = pack_batch([[1, 5, 6], [1, 7]])
    assert ids.tolist() == [1, 5, 6, 1, 7]
    assert targets.tolist() == [5, 6, -100, 7, -100]
    assert lengths == [3, 2]


def test_training_lowers_loss() -> None:
    data = generate(SMALL)
    seqs = [user_prefix(s) for s in data.sequences]
    model, losses = train_model(tiny_config(SMALL.vocab_size), seqs,
                                TrainConfig(steps=30, batch_size=32), progress=False)
    assert len(losses) == 30 and not model.training
    with torch.no_grad():
        assert sequence_loss(model, seqs[:50]).item() < losses[0] - 0.5


def test_short_demo_beats_chance_and_popularity(tmp_path: Path) -> None:
    lines: list[str] = []
    threads = torch.get_num_threads()
    result = run_demo(
        tmp_path / "ckpt", SyntheticConfig(num_users=600, seed=0),
        TrainConfig(steps=40, batch_size=32, seed=0), num_heldout=100, num_candidates=20,
        progress=False, echo=lines.append,
    )
    assert torch.get_num_threads() == threads  # restored
    assert (tmp_path / "ckpt" / "config.json").is_file()
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert result.reload_max_diff < 1e-5
    assert result.model.num_users == 100 and result.model.num_negatives == 99
    assert result.chance_hit_rate == pytest.approx(0.1)
    # Seeded; across seeds 0-3 this budget gives 0.86-0.97 against a popularity of 0.12-0.17.
    assert result.model.hit_rate > 0.5
    assert result.model.hit_rate > result.popularity.hit_rate + 0.25
    scores = [s for _, s in result.sample_ranking]
    assert len(scores) == 20 and scores == sorted(scores, reverse=True)
    assert result.sample_target in [item for item, _ in result.sample_ranking]
    text = "\n".join(lines)
    assert "HitRate@10" in text and "popularity baseline" in text and "time:" in text
