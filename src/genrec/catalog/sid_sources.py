"""Semantic IDs built from item embeddings (residual k-means, with their codebooks kept to
assign IDs to new items) or read from a token-string file such as ``sid-rqvae/*.index.json``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import torch

from genrec.catalog.codebooks import CODEBOOKS_KEY, COUNTER, IdCodebooks
from genrec.catalog.kmeans import residual_kmeans
from genrec.catalog.semantic_ids import SemanticIndex, with_dedup_level

_TOKEN = re.compile(r"^<([a-z])_(\d+)>$")
_MAX_LISTED = 10


def _per_level(sizes: int | Sequence[int], levels: int) -> list[int]:
    out = [sizes] * levels if isinstance(sizes, int) else [int(k) for k in sizes]
    if len(out) != levels:
        raise ValueError(f"{len(out)} codebook sizes given for {levels} levels")
    return out


def build_semantic_index(
    embeddings: torch.Tensor,
    levels: int = 3,
    codebook_size: int | Sequence[int] = 256,
    iters: int = 50,
    seed: int = 0,
    init: Literal["kmeans++", "random"] = "kmeans++",
    dedup: bool = True,
    item_ids: list[str] | None = None,
    balanced: bool = False,
) -> SemanticIndex:
    """Residual k-means Semantic IDs over item embeddings [num_items, dim].

    ``levels`` k-means levels (codebook size per level: an int or one per level), then, with
    ``dedup``, a last level counting items that share the same prefix so every ID is unique
    (without it, colliding IDs raise a ValueError). ``balanced``: each level's codes used
    about equally (capacity-constrained k-means). Runs on the device of ``embeddings``. The
    codebooks are kept in ``meta`` (:class:`~genrec.catalog.codebooks.IdCodebooks`, used as
    given: no normalisation, no encoder) to assign IDs to new items.
    """
    sizes = _per_level(codebook_size, levels)
    fit = residual_kmeans(embeddings, sizes, iters=iters, seed=seed, init=init,
                          balanced=balanced)
    codes = fit.codes
    index = with_dedup_level(codes, sizes) if dedup else SemanticIndex(codes, sizes)
    index.item_ids = item_ids
    books = IdCodebooks(tuple(fit.codebooks), collision=COUNTER if dedup else None)
    index.meta = {"method": "residual_kmeans", "iters": iters, "seed": seed, "init": init,
                  "balanced": balanced, CODEBOOKS_KEY: books.to_meta()}
    index.validate()
    return index


def load_sid_index(
    path: str | Path,
    item_index: Mapping[str, int] | None = None,
    codebook_sizes: int | Sequence[int] | None = None,
    on_collision: Literal["error", "dedup"] = "error",
) -> SemanticIndex:
    """Load a token-string index such as ``sid-rqvae/<Name>.index.json``.

    The file maps item id -> ``["<a_12>", "<b_201>", ...]``; the letter gives the level (a = 0).
    ``item_index`` maps original item ids to rows ``0..N-1`` (default: the ids are ``0..N-1``);
    every item must have an ID and the file must not name unknown items. ``codebook_sizes``
    defaults to ``max code + 1`` per level. Items sharing a full ID raise a ValueError, or with
    ``on_collision="dedup"`` get an extra disambiguating level (see :func:`dedup_level`).
    """
    path = Path(path)
    if on_collision not in ("error", "dedup"):
        raise ValueError(f"on_collision must be 'error' or 'dedup', got {on_collision!r}")
    with open(path) as f:
        raw = json.load(f)
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a non-empty object {{item id: [tokens]}}")
    if item_index is None:
        item_index = {str(i): i for i in range(len(raw))}
    if sorted(item_index.values()) != list(range(len(item_index))):
        raise ValueError("item_index must map item ids onto 0..N-1")
    unknown = [k for k in raw if k not in item_index]
    if unknown:
        raise ValueError(f"{path.name}: {len(unknown)} unknown item ids: {unknown[:_MAX_LISTED]}")
    missing = sorted(set(item_index) - set(raw), key=item_index.__getitem__)
    if missing:
        raise ValueError(
            f"{path.name}: no Semantic ID for {len(missing)} items: {missing[:_MAX_LISTED]}"
        )
    n_levels = len(next(iter(raw.values())))
    rows: list[list[int]] = [[] for _ in range(len(item_index))]
    for key, tokens in raw.items():
        if not isinstance(tokens, list) or len(tokens) != n_levels:
            raise ValueError(f"{path.name}: item {key!r}: expected {n_levels} tokens: {tokens!r}")
        row = rows[item_index[key]]
        for level, token in enumerate(tokens):
            m = _TOKEN.match(str(token))
            if m is None or ord(m.group(1)) - ord("a") != level:
                letter = chr(ord("a") + level)
                raise ValueError(f"{path.name}: item {key!r}: token {token!r} is not <{letter}_N>")
            row.append(int(m.group(2)))
    codes = torch.tensor(rows, dtype=torch.int64)
    max_codes = (codes.max(dim=0).values + 1).tolist()
    sizes = max_codes if codebook_sizes is None else _per_level(codebook_sizes, n_levels)
    if any(s < m for s, m in zip(sizes, max_codes, strict=True)):
        raise ValueError(f"{path.name}: codebook sizes {sizes} too small for codes {max_codes}")
    dedup = on_collision == "dedup"
    index = with_dedup_level(codes, sizes) if dedup else SemanticIndex(codes, sizes)
    index.item_ids = sorted(item_index, key=item_index.__getitem__)
    index.meta = {"source": path.name, "on_collision": on_collision}
    index.validate()
    return index

