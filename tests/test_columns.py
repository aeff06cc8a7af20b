"""Column roles of interaction tables: matching, text columns, reading files, parsing values."""

from __future__ import annotations

from pathlib import Path

import pytest

from genrec.data.columns import (
    TableColumns,
    column_key,
    field_name,
    find_column,
    find_columns,
    parse_column,
    read_table,
    text_columns,
)


def test_names_match_by_case_and_without_recbole_types():
    assert field_name("title:token_seq") == "title" and column_key("UserId") == "userid"
    assert field_name("a:b") == "a:b"  # not a RecBole type: the colon is part of the name
    cols = ["UserID:token", "Item", "Rating:float"]
    assert find_column(cols, "user", where="t") == "UserID:token"
    assert find_column(cols, "item", where="t") == "Item"
    assert find_column(cols, "time", where="t", required=False) is None
    assert find_column(cols, "rating", "rating", where="t") == "Rating:float"
    assert find_column(cols, "user", "UserID:token", where="t") == "UserID:token"


def test_preferred_names_come_before_the_candidates():
    # an items table with both the interactions' name and a candidate name
    cols = ["item_id", "movieId", "title"]
    assert find_column(cols, "item id", where="t", preferred=["movieId"]) == "movieId"
    with pytest.raises(ValueError, match="'item_id', 'movieId' could each be the item id"):
        find_column(cols, "item id", where="t", preferred=["sku"])


def test_given_names_must_exist():
    with pytest.raises(ValueError, match=r"'Title', 'title' all match 'TITLE'"):
        find_column(["Title", "title"], "text", "TITLE", where="t")
    assert find_columns(["Title", "body"], ["title", "body"], "text", where="t") == ["Title",
                                                                                    "body"]
    with pytest.raises(ValueError, match=r"t: no column 'x' \(given by --text-cols"):
        find_columns(["title"], ["title", "x"], "text", where="t")


def test_text_columns_leave_out_ids_and_numbers():
    table = {
        "item_id": ["1", "2"], "title": ["1917", "2012"],  # a text name: text even if numeric
        "director": ["Mendes", ""], "price": ["9.5", ""], "year:token": ["2019", "2009"],
        "tags:token_seq": ["war drama", "disaster"], "rank:float": ["a", "b"], "empty": ["", ""],
        "related": [["1", "2"], []],
    }
    assert text_columns(table, "item_id") == ["title", "director", "tags:token_seq", "related"]


def test_describe():
    cols = TableColumns("u", "i", None, "r", 3.5, "iid", ("title", "genres"))
    assert cols.describe() == ("user 'u', item 'i', no time column (file order), rating 'r' "
                               ">= 3.5, items id 'iid', text 'title', 'genres'")
    assert TableColumns("u", "i", "t").describe() == "user 'u', item 'i', time 't'"


def test_parse_column():
    path = Path("x.csv")
    table = {"id": [3.0, " a ", 7], "t": ["5", "2024-01-01T00:00:00+00:00", 2.5], "r": ["4", 1]}
    assert parse_column(table, "id", "id", path) == ["3", "a", "7"]
    assert parse_column(table, "t", "time", path) == [5.0, 1704067200.0, 2.5]
    assert parse_column(table, "r", "rating", path) == [4.0, 1.0]
    with pytest.raises(ValueError, match="x.csv: data row 2: 'r' value None is not a number"):
        parse_column({"r": [1, None]}, "r", "rating", path)
    with pytest.raises(ValueError, match="'t' value 'soon' is neither a number nor an ISO"):
        parse_column({"t": ["soon"]}, "t", "time", path)


@pytest.mark.parametrize(("name", "text"), [
    ("a.inter", "user_id:token\titem_id:token\nu\t1\n"),  # RecBole: tabs by suffix
    ("a.csv", "user_id\titem_id\nu\t1\n"),  # tabs and no commas in the header
    ("a.csv", "\ufeffuser_id,item_id\nu,1\n"),  # a byte-order mark (spreadsheet exports)
])
def test_read_table_delimiters(tmp_path: Path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    table = read_table(path)
    assert [column_key(c) for c in table] == ["user_id", "item_id"]
    assert list(table.values()) == [["u"], ["1"]]
