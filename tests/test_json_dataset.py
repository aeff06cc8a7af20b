"""The JSON dataset format: files found, the catalog as the union of interactions, item text and
Semantic IDs, numeric ids kept as indices, and errors."""

import json
import os
from pathlib import Path

import pytest

from genrec.data import find_json_dataset, leave_one_out, load_json_dataset


def write_json_dataset(
    root: Path, name: str = "Toy", with_items: bool = True, with_sids: bool = True
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    inter = {"0": [0, 2, 10], "1": [9, 10, 1, 2], "10": [3, 4, 5, 6]}
    (root / f"{name}.inter.json").write_text(json.dumps(inter))
    if with_items:
        items = {str(i): {"title": f"item {i}", "brand": "", "categories": ["a", "b"]}
                 for i in range(12)}
        (root / f"{name}.item.json").write_text(json.dumps(items))
    if not with_sids:
        return root
    (root / "sid-rqvae").mkdir(exist_ok=True)
    index = {str(i): [f"<a_{i % 3}>", f"<b_{i}>"] for i in range(12)}
    (root / "sid-rqvae" / f"{name}.index.json").write_text(json.dumps(index))
    return root


def test_json_dataset(tmp_path):
    root = write_json_dataset(tmp_path / "toy")
    files = find_json_dataset(root)
    assert files.name == "Toy"
    assert files.items == root / "Toy.item.json"
    assert files.semantic_ids == root / "sid-rqvae" / "Toy.index.json"
    ds = load_json_dataset(root)
    # numeric ids: index == id, items 7, 8, 11 only have text but are in the catalog
    assert ds.item_ids == [str(i) for i in range(12)]
    assert ds.user_ids == ["0", "1", "10"]
    assert ds.sequences == [[0, 2, 10], [9, 10, 1, 2], [3, 4, 5, 6]]
    assert (ds.num_users, ds.num_items, ds.num_interactions) == (3, 12, 11)
    assert ds.item_text[10] == {"title": "item 10", "categories": "a, b"}
    assert ds.semantic_id_path == files.semantic_ids


def test_json_dataset_without_item_text(tmp_path):
    ds = load_json_dataset(write_json_dataset(tmp_path / "a", with_items=False))
    assert ds.item_text is None
    assert ds.num_items == 12  # the Semantic-ID file names items 7, 8 and 11 too
    ds = load_json_dataset(write_json_dataset(tmp_path / "b", with_items=False, with_sids=False))
    assert ds.semantic_id_path is None
    assert ds.num_items == 9  # only items seen in interactions (7, 8 and 11 are unseen)
    assert ds.item_ids[-1] == "10" and ds.item_index["10"] == 8
    assert ds.sequences[0] == [0, 2, 8]


def test_json_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="inter.json"):
        find_json_dataset(tmp_path)
    write_json_dataset(tmp_path, "A")
    write_json_dataset(tmp_path, "B")
    with pytest.raises(ValueError, match="several interaction files"):
        find_json_dataset(tmp_path)
    assert find_json_dataset(tmp_path, name="B").name == "B"
    (tmp_path / "A.item.json").write_text(json.dumps({"0": {"title": "x"}}))
    with pytest.raises(ValueError, match=r"missing from A\.item\.json: '1', '2'"):
        load_json_dataset(tmp_path, name="A")


DATASETS = os.environ.get("GENREC_DATASETS")


@pytest.mark.skipif(not DATASETS, reason="set GENREC_DATASETS to the shared datasets folder")
def test_real_amazon18_scientific():
    from genrec.catalog import SemanticTrie, load_sid_index

    ds = load_json_dataset(Path(DATASETS) / "amazon18-scientific")
    assert (ds.num_users, ds.num_items, ds.num_interactions) == (8317, 4344, 58492)
    assert ds.item_ids == [str(i) for i in range(4344)]
    split = leave_one_out(ds.sequences)
    assert len(split.val) == len(split.test) == 8317 and split.num_short_users == 0
    assert len(split.train) == 58492 - 3 * 8317
    with pytest.raises(ValueError, match="shared by several items"):
        load_sid_index(ds.semantic_id_path, ds.item_index, 256)
    index = load_sid_index(ds.semantic_id_path, ds.item_index, 256, on_collision="dedup")
    assert index.num_levels == 5
    trie = SemanticTrie.from_index(index)
    assert trie.lookup(index.codes).tolist() == list(range(4344))
