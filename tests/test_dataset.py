"""The in-memory dataset: counts, ids sorted numerically or as strings, item text fields and
error listings."""

from genrec.data import Dataset
from genrec.data.dataset import MAX_LISTED, id_listing, sorted_ids, text_fields


def test_counts_and_summary() -> None:
    ds = Dataset(name="toy", sequences=[[0, 1, 2], [2]], user_ids=["a", "b"],
                 item_ids=["5", "7", "9", "11"], item_index={"5": 0, "7": 1, "9": 2, "11": 3})
    assert (ds.num_users, ds.num_items, ds.num_interactions) == (2, 4, 4)
    assert ds.summary() == {"name": "toy", "users": 2, "items": 4, "interactions": 4,
                            "min_len": 1, "max_len": 3, "has_text": False}


def test_ids_sort_numerically_when_all_are_integers() -> None:
    assert sorted_ids(["10", "9", "100", "9"]) == ["9", "10", "100"]
    assert sorted_ids(["10", "9", "b", "a"]) == ["10", "9", "a", "b"]


def test_text_fields_join_lists_and_drop_empty_values() -> None:
    raw = {"title": " Soap ", "brand": "", "price": None, "categories": ["a", "b"], "n": 3}
    assert text_fields(raw) == {"title": "Soap", "categories": "a, b", "n": "3"}


def test_id_listing_names_the_first_ids_and_counts_the_rest() -> None:
    assert id_listing(["x", "y"]) == "'x', 'y'"
    shown = ", ".join(repr(i) for i in range(MAX_LISTED))
    assert id_listing(range(MAX_LISTED + 3)) == shown + " (and 3 more)"
