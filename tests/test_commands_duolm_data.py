"""The DuoLM commands' dataset helpers: item text, cached catalog features, evaluation sample."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_commands_train_generative import write_dataset

from genrec.commands.dataset import load_dataset
from genrec.commands.duolm_data import catalog_features, dataset_item_text, eval_split
from genrec.duolm.encoder import EncoderConfig


def test_item_text_is_required(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "toy"), None, None)
    assert dataset_item_text(ds)[0]["title"] == "item 0"
    with pytest.raises(ValueError, match="no item text"):
        dataset_item_text(dataclasses.replace(ds, item_text=None))


def test_features_are_cached_by_content(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "toy"), None, None)
    config = EncoderConfig(backend="decoder", max_text_tokens=8)
    cache = tmp_path / "features.pt"
    first = catalog_features(config, ds, cache, progress=False)
    assert cache.is_file() and len(first.token_ids) == ds.num_items
    assert 0 < max(len(t) for t in first.token_ids) <= 8
    stamp = cache.stat().st_mtime_ns
    assert catalog_features(config, ds, cache, progress=False).token_ids == first.token_ids
    assert cache.stat().st_mtime_ns == stamp  # reused, not rewritten
    shorter = catalog_features(dataclasses.replace(config, max_text_tokens=2), ds, cache, False)
    assert max(len(t) for t in shorter.token_ids) <= 2 and cache.stat().st_mtime_ns != stamp


def test_eval_split_is_a_fixed_sample(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "toy"), None, None)
    _, exs, cands = eval_split(ds, max_history=5, users=6, negatives=4, seed=1)
    assert len(exs) == 6 and len(cands) == 6
    _, again, again_cands = eval_split(ds, max_history=5, users=6, negatives=4, seed=1)
    assert again == exs and [list(c) for c in again_cands] == [list(c) for c in cands]
    _, none, _ = eval_split(ds, max_history=5, users=0, negatives=4, seed=1)
    assert none == []
    _, test, _ = eval_split(ds, max_history=5, users=None, negatives=4, seed=1, split="test")
    assert len(test) > 6
