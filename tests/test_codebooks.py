"""Codebook sizes from the catalog size, and ``genrec index`` using them by default."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.catalog.codebooks import IDS_PER_ITEM, MAX_CODES, MIN_CODES, default_codebook_size
from genrec.cli import app


@pytest.mark.parametrize("items", [100, 2420, 4344, 12101, 10**5, 10**6, 10**7])
@pytest.mark.parametrize("levels", [2, 3, 4])
def test_smallest_power_of_two_with_enough_ids(items: int, levels: int) -> None:
    k = default_codebook_size(items, levels)
    assert MIN_CODES <= k <= MAX_CODES and k & (k - 1) == 0
    assert k**levels >= IDS_PER_ITEM * items or k == MAX_CODES
    assert k == MIN_CODES or (k // 2) ** levels < IDS_PER_ITEM * items


def test_grows_with_the_catalog_and_shrinks_with_levels() -> None:
    assert default_codebook_size(2420, 3) == 64  # not 256 for a small catalog
    assert default_codebook_size(10**6, 3) == 256
    sizes = [default_codebook_size(n, 3) for n in (10**2, 10**3, 10**4, 10**5, 10**6, 10**7)]
    assert sizes == sorted(sizes)
    assert default_codebook_size(10**5, 4) < default_codebook_size(10**5, 2)


def test_tiny_catalogs_and_bad_input() -> None:
    assert default_codebook_size(5, 3) == 5  # no more codes than items
    assert default_codebook_size(1, 3) == 2
    with pytest.raises(ValueError, match="num_items"):
        default_codebook_size(0, 3)
    with pytest.raises(ValueError, match="levels"):
        default_codebook_size(10, 0)


def test_index_command_picks_the_default(tmp_path: Path) -> None:
    inter = tmp_path / "inter.csv"
    rows = [f"u{u},i{(u * 7 + t) % 300},{t}" for u in range(120) for t in range(5)]
    inter.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    n_items = len({r.split(",")[1] for r in rows})
    np.save(tmp_path / "emb.npy",
            np.random.default_rng(0).normal(size=(n_items, 8)).astype("f4"))
    result = CliRunner().invoke(app, [
        "index", "--interactions", str(inter), "--embeddings", str(tmp_path / "emb.npy"),
        "--levels", "2", "--iters", "5", "--out", str(tmp_path / "idx.json")])
    assert result.exit_code == 0, result.output
    k = default_codebook_size(n_items, 2)
    sizes = json.loads((tmp_path / "idx.json").read_text())["codebook_sizes"]
    assert sizes[:2] == [k, k] and k < 256
