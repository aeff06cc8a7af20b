"""What the DuoLM commands read from a dataset: its item text, the encoder's cached features of
every catalog item, and the fixed evaluation sample with its candidate lists (shared by
``train duolm``, ``train teacher``, ``encode-catalog`` and the ranking side of ``eval``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genrec.data.dataset import Dataset
    from genrec.duolm.encoder import EncoderConfig, ItemFeatures

FEATURES_FILE = "item_features.pt"


def dataset_item_text(ds: Dataset) -> dict[int, dict[str, str]]:
    """The dataset's item text (ValueError naming the dataset when it has none)."""
    if ds.item_text is None:
        raise ValueError(f"{ds.name}: the dataset has no item text; DuoLM reads item text")
    return ds.item_text


def catalog_features(
    config: EncoderConfig, ds: Dataset, cache: Path | None, progress: bool
) -> ItemFeatures:
    """The encoder's frozen features of every catalog item, cached in ``cache`` when given
    (reused only when backend, text length and the item texts match)."""
    import hashlib

    import torch

    from genrec.catalog.embeddings import item_texts
    from genrec.duolm.encoder import ItemFeatures, compute_features
    from genrec.utils.atomic import atomic_write

    texts = item_texts(dataset_item_text(ds), ds.num_items)
    key = hashlib.sha256(json.dumps([config.backend, config.max_text_tokens, texts])
                         .encode()).hexdigest()
    if cache is not None and cache.is_file():
        saved = torch.load(cache, weights_only=True)
        if saved.get("key") == key:
            return ItemFeatures(saved.get("embeddings"), saved.get("token_ids"))
    feats = compute_features(config, texts, progress=progress)
    if cache is not None:
        payload = {"key": key, "embeddings": feats.embeddings, "token_ids": feats.token_ids}
        atomic_write(cache, lambda t: torch.save(payload, t))
    return feats


def eval_split(ds: Dataset, max_history: int, users: int | None, negatives: int, seed: int,
               split: str = "val"):  # noqa: ANN202
    """The split, a fixed sample of ``users`` examples of ``split`` (None: all; 0: none) and
    their candidate lists."""
    from genrec.data.split import leave_one_out
    from genrec.evaluation.full_catalog import sample_examples
    from genrec.evaluation.ranking import sample_candidates

    sp = leave_one_out(ds.sequences, max_history=max_history)
    exs = sample_examples(getattr(sp, split), users, seed) if users != 0 else []
    return sp, exs, sample_candidates(exs, ds.sequences, ds.num_items, negatives or None, seed)
