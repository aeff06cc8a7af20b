"""Versioned item-representation store: round trip, versions, crash leftovers, validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from genrec.duolm.store import (
    CURRENT_FILE,
    META_FILE,
    current_version,
    load_store,
    write_store,
)

IDS = ["a", "b", "c"]


def vectors(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(seed))


def test_round_trip(tmp_path: Path) -> None:
    vecs = vectors()
    active = torch.tensor([True, False, True])
    version = write_store(tmp_path / "store", vecs, IDS, active=active, meta={"dataset": "toy"})
    assert version == 1
    s = load_store(tmp_path / "store")
    assert s.version == 1
    assert torch.equal(s.vectors, vecs) and s.vectors.dtype == torch.float32
    assert torch.equal(s.active, active) and s.active.dtype == torch.bool
    assert s.item_ids == IDS
    assert s.meta["dataset"] == "toy"
    counts = {k: s.meta[k] for k in ("version", "num_items", "k", "hidden_size", "num_active")}
    assert counts == {"version": 1, "num_items": 3, "k": 2, "hidden_size": 4, "num_active": 2}
    assert (tmp_path / "store" / CURRENT_FILE).read_text() == "v000001\n"


def test_default_active_and_reserved_meta_keys(tmp_path: Path) -> None:
    write_store(tmp_path, vectors().double(), IDS, meta={"version": 99, "num_items": 7})
    s = load_store(tmp_path)
    assert s.active.tolist() == [True, True, True]
    assert s.vectors.dtype == torch.float32
    assert s.meta["version"] == 1 and s.meta["num_items"] == 3  # computed values win


def test_versions_increase_and_old_ones_stay_readable(tmp_path: Path) -> None:
    assert current_version(tmp_path) is None
    assert current_version(tmp_path / "missing") is None
    with pytest.raises(FileNotFoundError, match="not an item store"):
        load_store(tmp_path)
    assert [write_store(tmp_path, vectors(i), IDS) for i in range(3)] == [1, 2, 3]
    assert current_version(tmp_path) == 3
    assert torch.equal(load_store(tmp_path).vectors, vectors(2))
    old = load_store(tmp_path, version=1)
    assert old.version == 1 and torch.equal(old.vectors, vectors(0))
    with pytest.raises(FileNotFoundError, match="no version 7"):
        load_store(tmp_path, version=7)


def test_crash_leftovers_do_not_change_what_is_read(tmp_path: Path) -> None:
    write_store(tmp_path, vectors(0), IDS)
    write_store(tmp_path, vectors(1), IDS)
    # A crash while writing v3 (temporary folder), and one after the rename but before CURRENT.
    shutil.copytree(tmp_path / "v000001", tmp_path / ".v000003.tmp")
    shutil.copytree(tmp_path / "v000001", tmp_path / "v000003")
    assert current_version(tmp_path) == 2
    s = load_store(tmp_path)
    assert s.version == 2 and torch.equal(s.vectors, vectors(1))
    # The next write takes number 3, replacing both leftovers.
    assert write_store(tmp_path, vectors(5), IDS) == 3
    assert torch.equal(load_store(tmp_path).vectors, vectors(5))
    assert not (tmp_path / ".v000003.tmp").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        CURRENT_FILE, "v000001", "v000002", "v000003",
    ]


@pytest.mark.parametrize(
    ("vecs", "ids", "active", "match"),
    [
        (torch.zeros(3, 4), IDS, None, r"\[num_items, k, hidden\]"),
        (torch.zeros(3, 1, 2, 4), IDS, None, r"\[num_items, k, hidden\]"),
        (torch.zeros(3, 2, 4), ["a", "b"], None, "item_ids: 2 ids for 3 items"),
        (torch.full((3, 2, 4), float("nan")), IDS, None, "NaN"),
        (torch.full((3, 2, 4), float("inf")), IDS, None, "infinite"),
        (torch.zeros(3, 2, 4), IDS, torch.tensor([True, False]), r"active must be \[3\]"),
    ],
)
def test_bad_inputs_raise_before_writing(
    tmp_path: Path, vecs: torch.Tensor, ids: list[str], active: torch.Tensor | None, match: str,
) -> None:
    write_store(tmp_path, vectors(), IDS)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=match):
        write_store(tmp_path, vecs, ids, active=active)
    assert current_version(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert torch.equal(load_store(tmp_path).vectors, vectors())


def test_bad_inputs_on_a_new_folder_create_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_store(tmp_path / "store", torch.zeros(3, 4), IDS)
    assert not (tmp_path / "store").exists()


def test_table_rejects_retired_items(tmp_path: Path) -> None:
    write_store(tmp_path, vectors(), IDS, active=torch.tensor([True, False, True]))
    write_store(tmp_path, vectors(), IDS, active=torch.tensor([True, False, True]))
    table = load_store(tmp_path).table()
    assert table.version == 2 and table.num_items == 3
    assert torch.equal(table.vectors, vectors())
    assert table.item_tokens([2, 0], vocab_size=10).tolist() == [[14, 15], [10, 11]]
    with pytest.raises(ValueError, match="item id 1 is retired"):
        table.item_tokens([0, 1], vocab_size=10)


def test_meta_file_is_json_with_item_ids(tmp_path: Path) -> None:
    write_store(tmp_path, vectors(), IDS)
    meta = json.loads((tmp_path / "v000001" / META_FILE).read_text())
    assert meta["item_ids"] == IDS and meta["created"].endswith("Z")
