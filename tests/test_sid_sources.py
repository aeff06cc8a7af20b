"""Semantic IDs built by residual k-means over embeddings, and read from token-string files."""

import json

import pytest
import torch

from genrec.catalog.sid_sources import build_semantic_index, load_sid_index


def test_build_semantic_index_unique_ids():
    x = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    x[1] = x[0]  # identical embeddings must still get distinct IDs
    index = build_semantic_index(x, levels=2, codebook_size=[16, 4], iters=10)
    assert index.num_levels == 3 and index.codebook_sizes[:2] == [16, 4]
    assert index.codes[:, 2].max().item() + 1 == index.codebook_sizes[2]
    assert torch.unique(index.codes, dim=0).shape[0] == 300
    assert index.codes[0, :2].tolist() == index.codes[1, :2].tolist()
    assert index.tokens_to_items(index.item_to_tokens(torch.arange(300))).tolist() == list(
        range(300)
    )
    with pytest.raises(ValueError, match="shared by several items"):
        build_semantic_index(x, levels=2, codebook_size=4, iters=5, dedup=False)



def write_sids(path, data) -> None:
    path.write_text(json.dumps(data))


def test_load_sid_index(tmp_path):
    path = tmp_path / "Toy.index.json"
    write_sids(path, {"1": ["<a_2>", "<b_0>"], "0": ["<a_0>", "<b_5>"], "2": ["<a_2>", "<b_1>"]})
    index = load_sid_index(path)
    assert index.codes.tolist() == [[0, 5], [2, 0], [2, 1]]
    assert index.codebook_sizes == [3, 6]
    assert load_sid_index(path, codebook_sizes=8).codebook_sizes == [8, 8]
    with pytest.raises(ValueError, match="too small"):
        load_sid_index(path, codebook_sizes=[3, 5])
    mapped = load_sid_index(path, item_index={"2": 0, "1": 1, "0": 2})
    assert mapped.codes.tolist() == [[2, 1], [2, 0], [0, 5]]
    assert mapped.item_ids == ["2", "1", "0"]
    with pytest.raises(ValueError, match=r"no Semantic ID for 1 items: \['9'\]"):
        load_sid_index(path, item_index={"0": 0, "1": 1, "2": 2, "9": 3})
    with pytest.raises(ValueError, match=r"unknown item ids: \['2'\]"):
        load_sid_index(path, item_index={"0": 0, "1": 1})


def test_load_sid_index_errors_and_collisions(tmp_path):
    path = tmp_path / "x.index.json"
    write_sids(path, {"0": ["<b_0>", "<a_1>"], "1": ["<a_0>", "<b_1>"]})
    with pytest.raises(ValueError, match="token '<b_0>' is not <a_N>"):
        load_sid_index(path)
    write_sids(path, {"0": ["<a_0>", "<b_1>"], "1": ["<a_0>"]})
    with pytest.raises(ValueError, match="expected 2 tokens"):
        load_sid_index(path)
    write_sids(path, {"0": ["<a_0>", "<b_1>"], "1": ["<a_1>", "<b_1>"], "2": ["<a_0>", "<b_1>"]})
    with pytest.raises(ValueError, match=r"\[0, 1\]: items 0 \(id '0'\), 2 \(id '2'\)"):
        load_sid_index(path)
    index = load_sid_index(path, on_collision="dedup")
    assert index.codes.tolist() == [[0, 1, 0], [1, 1, 0], [0, 1, 1]]
    assert index.codebook_sizes == [2, 2, 2]
