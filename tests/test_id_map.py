"""The id map: table ids <-> rows, lookups, unknown ids, growth, hash collisions."""

from __future__ import annotations

import numpy as np
import pytest

from genrec.catalog import id_map
from genrec.catalog.id_map import IdMap, item_key, item_keys


def test_lookup_both_ways() -> None:
    ids = ["B000123", "spotify:track:4uLU6hMC", "ü-ñ", "7", "sku-0000001"]
    m = IdMap.build(ids)
    assert len(m) == 5
    assert m.find(list(reversed(ids))).tolist() == [4, 3, 2, 1, 0]
    assert m.ids_of([2, 0, 4]) == ["ü-ñ", "B000123", "sku-0000001"]
    assert m.find(["B00012", "B0001234", "sku-0000002", ""]).tolist() == [-1, -1, -1, -1]


def test_integers_name_their_decimal_strings() -> None:
    m = IdMap.build([1, 3, 6, "10"])
    assert m.rows([6, "1", 10], "history") == [2, 0, 3]
    assert item_key(42) == "42" and item_key(np.int64(5)) == "5"
    for bad in (True, 1.5, None, "", "a\x00b", "x" * 2000):
        with pytest.raises(ValueError, match="history"):
            item_key(bad, "history")


def test_unknown_ids_name_the_field() -> None:
    m = IdMap.build(["a", "b"])
    with pytest.raises(ValueError, match=r"allow: unknown item ids \['x', '9'\]"):
        m.rows(["a", "x", 9], "allow")
    assert m.known(["x", "b", "y", "a"], "exclude") == ([1, 0], ["x", "y"])
    with pytest.raises(ValueError, match=r"exclude\[1\]"):
        item_keys(["a", 2.5], "exclude")
    many = [f"u{i}" for i in range(25)]
    with pytest.raises(ValueError, match="and 15 more"):
        m.rows(many, "candidates")


def test_duplicates_refused() -> None:
    with pytest.raises(ValueError, match=r"item_ids\[2\]: item id '1' is given twice"):
        IdMap.build(["1", "2", 1])


def test_an_empty_map_grows() -> None:
    empty = IdMap.build([])
    assert len(empty) == 0 and empty.find(["a"]).tolist() == [-1]
    assert empty.extended(["a"]).rows(["a"], "h") == [0]


def test_rows_named() -> None:
    m = IdMap.rows_named(12)
    assert m.rows(["11", 0], "history") == [11, 0]
    assert m.ids_of([3]) == ["3"]


def test_extended_adds_rows_in_order_and_folds() -> None:
    base = IdMap.build([f"sku-{i:05d}" for i in range(100)])
    grown = base.extended(["new-a", "new-b"])
    assert len(base) == 100 and len(grown) == 102  # the old map is unchanged
    assert base.find(["new-a"]).tolist() == [-1]
    assert grown.rows(["new-b", "sku-00007", "new-a"], "h") == [101, 7, 100]
    assert grown.ids_of([100, 101, 99]) == ["new-a", "new-b", "sku-00099"]
    many = grown
    for start in range(0, 5000, 1000):  # past the fold threshold
        many = many.extended([f"n{j}" for j in range(start, start + 1000)])
    assert len(many) == 5102
    keys = ["n4999", "new-a", "sku-00000", "n0", "nope"]
    assert many.find(keys).tolist() == [5101, 100, 0, 102, -1]
    assert many.ids_of([5101, 101, 102]) == ["n4999", "new-b", "n0"]


def test_hash_collisions_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    # every id of one length shares a hash: the bytes decide
    monkeypatch.setattr(id_map, "_hash", lambda buf, starts: np.diff(starts).astype(np.uint64))
    ids = ["ab", "cd", "ef", "xyz", "q"]
    m = IdMap.build(ids)
    assert m.find(["ef", "cd", "ab", "xyz", "zz", "q"]).tolist() == [2, 1, 0, 3, -1, 4]
    with pytest.raises(ValueError, match="given twice"):
        IdMap.build(["ab", "cd", "ab"])
    grown = m.extended(["gh"])
    assert grown.find(["gh", "ab"]).tolist() == [5, 0]


def test_many_ids_round_trip() -> None:
    rng = np.random.default_rng(0)
    ids = [f"{rng.integers(1 << 40):x}-{i}" for i in range(20000)]
    m = IdMap.build(ids)
    pick = rng.integers(0, len(ids), 300).tolist()
    assert m.find([ids[i] for i in pick]).tolist() == pick
    assert m.ids_of(pick) == [ids[i] for i in pick]
    assert m.nbytes < 40 * len(ids)
