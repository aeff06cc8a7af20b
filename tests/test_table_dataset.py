"""Interaction tables: layouts detected, columns named, items tables, time order, ratings,
Parquet, and errors that name what was looked for."""

import sys
from pathlib import Path

import pytest

from genrec.data import load_table_dataset


def write(path: Path, text: str) -> Path:
    path.write_text(text.strip() + "\n")
    return path


def test_csv_sorts_by_time_stably(tmp_path):
    inter = write(tmp_path / "inter.csv", """
user_id,item_id,timestamp
u2,b,5
u1,c,30
u1,a,10
u1,b,20
u2,a,5
u2,c,1
""")
    ds = load_table_dataset(inter)
    assert ds.user_ids == ["u1", "u2"] and ds.item_ids == ["a", "b", "c"]
    # u2: c (t=1), then b and a tie at t=5 and keep file order
    assert ds.sequences == [[0, 1, 2], [2, 1, 0]]
    assert ds.item_text is None and ds.name == "inter"


def test_csv_custom_columns_items_table_and_iso_dates(tmp_path):
    inter = write(tmp_path / "log.tsv", """
uid\tsku\twhen
7\tx-2\t2024-01-02T00:00:00
7\tx-1\t2024-01-01T12:00:00
""")
    items = write(tmp_path / "items.tsv", """
sku\ttitle\tdescription\tprice
x-1\tFirst\tThe first\t3
x-2\tSecond\t\t4
x-3\tThird\tNever bought\t5
""")
    ds = load_table_dataset(
        inter, items, user_col="uid", item_col="sku", time_col="when",
        text_cols=["title", "description"],
    )
    assert ds.item_ids == ["x-1", "x-2", "x-3"]
    assert ds.sequences == [[0, 1]]
    assert ds.item_text == {
        0: {"title": "First", "description": "The first"},
        1: {"title": "Second"},
        2: {"title": "Third", "description": "Never bought"},
    }


def test_table_errors(tmp_path):
    inter = write(tmp_path / "inter.csv", "user_id,item_id,timestamp\n1,a,3\n1,zz,4\n2,b,x")
    with pytest.raises(ValueError, match="'timestamp' value 'x'"):
        load_table_dataset(inter)
    inter = write(tmp_path / "inter.csv", "user_id,item_id,timestamp\n1,a,3\n1,zz,4")
    items = write(tmp_path / "items.csv", "item_id,title\na,A\nb,B")
    with pytest.raises(ValueError, match=r"1 item ids not in items table items\.csv: 'zz'"):
        load_table_dataset(inter, items)
    with pytest.raises(ValueError, match=r"no column 'brand' \(given by --text-cols"):
        load_table_dataset(inter, items, text_cols=["title", "brand"])
    items = write(tmp_path / "items.csv", "item_id,title\na,A\nzz,Z\na,B")
    with pytest.raises(ValueError, match="duplicate item ids: 'a'"):
        load_table_dataset(inter, items)
    bad = write(tmp_path / "bad.csv", "user_id,item_id,timestamp\n1,a")
    with pytest.raises(ValueError, match="expected 3 fields"):
        load_table_dataset(bad)
    empty_id = write(tmp_path / "empty.csv", "user_id,item_id,timestamp\n1, ,3")
    with pytest.raises(ValueError, match="empty 'item_id'"):
        load_table_dataset(empty_id)


# (user, item, rating, time): u1's file order is not its time order; item 7 has no interactions
ROWS = [("u1", "10", 5, 30), ("u1", "2", 3, 10), ("u2", "2", 4, 20), ("u1", "3", 4, 20)]
ITEMS = [("2", "Two", "9.5"), ("3", "Three", "1"), ("7", "Seven", "2"), ("10", "Ten", "3")]
ISO = {10: "2024-01-01", 20: "2024-01-02", 30: "2024-01-03T08:00:00"}


def write_rows(path: Path, header: list[str], rows: list[tuple], sep: str = ",") -> Path:
    lines = [sep.join(header)] + [sep.join(str(v) for v in row) for row in rows]
    return write(path, "\n".join(lines))


LAYOUTS = {  # name: (interactions file, its header, items file, its header, text keys)
    "genrec": ("inter.csv", ["user_id", "item_id", "rating", "timestamp"],
               "items.csv", ["item_id", "title", "price"], ["title"]),
    "movielens": ("ratings.csv", ["userId", "movieId", "rating", "timestamp"],
                  "movies.csv", ["movieId", "title", "genres"], ["title", "genres"]),
    "recbole": ("ml.inter", ["user_id:token", "item_id:token", "rating:float", "timestamp:float"],
                "ml.item", ["item_id:token", "title:token_seq", "year:float"], ["title"]),
    "amazon": ("reviews.csv", ["reviewerID", "asin", "overall", "unixReviewTime"],
               "meta.csv", ["asin", "title", "brand"], ["title", "brand"]),
    "short": ("log.csv", ["user", "item", "score", "time"], "things.csv", ["item", "title",
                                                                           "price"], ["title"]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_detected_layouts(tmp_path, layout):
    inter_name, header, items_name, items_header, text = LAYOUTS[layout]
    sep = "\t" if layout == "recbole" else ","  # RecBole atomic files are tab-separated
    rows = [(u, i, r, ISO[t] if layout == "short" else t) for u, i, r, t in ROWS]
    inter = write_rows(tmp_path / inter_name, header, rows, sep)
    items = write_rows(tmp_path / items_name, items_header, ITEMS, sep)
    ds = load_table_dataset(inter, items)
    assert ds.user_ids == ["u1", "u2"] and ds.item_ids == ["2", "3", "7", "10"]
    assert ds.sequences == [[0, 1, 3], [0]]
    assert (ds.columns.user, ds.columns.item, ds.columns.time) == tuple(header[:2] + header[3:])
    assert ds.columns.items_id == items_header[0]
    assert list(ds.item_text[0]) == text and ds.item_text[0]["title"] == "Two"
    only = load_table_dataset(inter, min_rating=4)  # the rating column is detected too
    assert only.columns.rating == header[2] and only.sequences == [[1, 2], [0]]


def test_overrides(tmp_path):
    # uid and user_id both look like the user column, ts and when like none: the flags decide
    inter = write_rows(tmp_path / "log.tsv", ["uid", "user_id", "sku", "when", "stars"],
                       [("a", "u1", "x", 2, 1), ("a", "u1", "y", 1, 5), ("b", "u2", "x", 3, 4)],
                       "\t")
    items = write_rows(tmp_path / "items.tsv", ["id", "sku", "name:token_seq", "notes"],
                       [("1", "x", "Ex", "n1"), ("2", "y", "Why", "n2")], "\t")
    ds = load_table_dataset(inter, items, user_col="USER_ID", item_col="sku", time_col="when",
                            rating_col="stars", min_rating=4, items_id_col="sku",
                            text_cols=["name"])
    assert ds.user_ids == ["u1", "u2"] and ds.sequences == [[1], [0]]
    assert ds.item_text == {0: {"name": "Ex"}, 1: {"name": "Why"}}
    assert ds.columns.describe() == ("user 'user_id', item 'sku', time 'when', rating 'stars' "
                                     ">= 4, items id 'sku', text 'name:token_seq'")
    # the items' id column defaults to the interactions' item column: here 'sku', not 'id'
    ds = load_table_dataset(inter, items, user_col="uid", item_col="sku", time_col="when")
    assert ds.columns.items_id == "sku" and ds.item_text[0] == {"name": "Ex", "notes": "n1"}
    assert ds.user_ids == ["a", "b"] and ds.sequences == [[1, 0], [0]]


def test_min_rating(tmp_path):
    header = ["userId", "movieId", "rating", "timestamp"]
    inter = write_rows(tmp_path / "ratings.csv", header, ROWS)
    items = write_rows(tmp_path / "movies.csv", ["movieId", "title", "genres"], ITEMS)
    ds = load_table_dataset(inter, items, min_rating=4.5)
    assert ds.user_ids == ["u1"] and ds.sequences == [[3]]
    assert ds.num_items == 4  # the items table still defines the catalog
    assert load_table_dataset(inter, min_rating=4.5).item_ids == ["10"]
    with pytest.raises(ValueError, match="no row has rating >= 6"):
        load_table_dataset(inter, min_rating=6)
    with pytest.raises(ValueError, match="read only to filter by min_rating"):
        load_table_dataset(inter, rating_col="rating")
    bad = write_rows(tmp_path / "bad.csv", header, [("u", "1", "good", 1)])
    with pytest.raises(ValueError, match="data row 1: 'rating' value 'good' is not a number"):
        load_table_dataset(bad, min_rating=1)
    plain = write_rows(tmp_path / "plain.csv", ["user_id", "item_id", "timestamp"], [("u", 1, 1)])
    with pytest.raises(ValueError) as err:
        load_table_dataset(plain, min_rating=4)
    assert str(err.value) == (
        "plain.csv: no rating column (for --min-rating 4): looked for 'rating', 'overall', "
        "'score' (any case, RecBole ':type' suffixes ignored); the file has columns 'user_id', "
        "'item_id', 'timestamp'; name the column with --rating-col / rating_col=")


def test_column_errors_say_what_was_looked_for(tmp_path):
    inter = write_rows(tmp_path / "inter.csv", ["customer", "movieId", "ts"], [("c", "1", 1)])
    with pytest.raises(ValueError) as err:
        load_table_dataset(inter)
    assert str(err.value) == (
        "inter.csv: no user column: looked for 'user_id', 'userid', 'user', 'reviewerid', 'uid' "
        "(any case, RecBole ':type' suffixes ignored); the file has columns 'customer', "
        "'movieId', 'ts'; name the column with --user-col / user_col=")
    with pytest.raises(ValueError, match=r"no column 'buyer' \(given by --user-col / user_col=\); "
                                         r"the file has columns 'customer', 'movieId', 'ts'$"):
        load_table_dataset(inter, user_col="buyer")
    ok = load_table_dataset(inter, user_col="customer")
    assert (ok.columns.item, ok.columns.time) == ("movieId", "ts")
    items = write_rows(tmp_path / "movies.csv", ["id", "title"], [("1", "One")])
    with pytest.raises(ValueError, match=r"movies\.csv: no item id column: looked for 'movieId', "
                                         r"'item_id', .*the file has columns 'id', 'title'; "
                                         r"name the column with --items-id-col"):
        load_table_dataset(inter, items, user_col="customer")
    with pytest.raises(ValueError, match="describe an items table"):
        load_table_dataset(inter, user_col="customer", text_cols=["title"])


def test_two_candidates_for_one_role_is_an_error(tmp_path):
    inter = write_rows(tmp_path / "inter.csv", ["user_id", "item_id", "user", "time", "Date"],
                       [("u", "i", "v", 1, 2)])
    with pytest.raises(ValueError, match="'user_id', 'user' could each be the user column; "
                                         "choose one with --user-col"):
        load_table_dataset(inter)
    with pytest.raises(ValueError, match="'time', 'Date' could each be the time column"):
        load_table_dataset(inter, user_col="user")
    assert load_table_dataset(inter, user_col="user", time_col="date").columns.time == "Date"


def test_no_time_column_keeps_file_order(tmp_path, caplog):
    inter = write_rows(tmp_path / "seq.csv", ["user_id", "item_id"],
                       [("u", "3"), ("v", "1"), ("u", "1"), ("u", "2")])
    with caplog.at_level("WARNING", logger="genrec.data"):
        ds = load_table_dataset(inter)
    assert ds.sequences == [[2, 0, 1], [0]] and ds.columns.time is None
    assert "seq.csv: no time column" in caplog.text and "file order" in caplog.text
    assert "no time column (file order)" in ds.columns.describe()


def test_parquet_without_engine_names_packages(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    path = tmp_path / "inter.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="'pyarrow' or 'pandas'"):
        load_table_dataset(path)


def test_parquet_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"user_id": ["u", "u", "v"], "item_id": [5, 3, 5], "timestamp": [2, 1, 0]})
    pq.write_table(table, tmp_path / "inter.parquet")
    ds = load_table_dataset(tmp_path / "inter.parquet")
    assert ds.item_ids == ["3", "5"] and ds.sequences == [[0, 1], [1]]
