"""Semantic IDs for new items from an index's saved codebooks (genrec.catalog.assign)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genrec.catalog import SemanticIndex, build_semantic_index
from genrec.catalog.assign import IdAssigner, assign_upserts, with_items
from genrec.catalog.codebooks import CODEBOOKS_KEY, IdCodebooks


def clustered(n: int = 80, dim: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(6, dim, generator=g) * 3
    return centers[torch.randint(0, 6, (n,), generator=g)] + torch.randn(n, dim, generator=g)


@pytest.fixture(scope="module")
def emb() -> torch.Tensor:
    return clustered()


@pytest.fixture(scope="module")
def index(emb: torch.Tensor) -> SemanticIndex:
    # few codes: many items share their k-means codes, so the counter level matters
    return build_semantic_index(emb, levels=2, codebook_size=3, iters=50,
                                item_ids=[f"i{k}" for k in range(emb.shape[0])])


def test_held_out_item_gets_back_the_id_the_index_gave_it(index: SemanticIndex,
                                                          emb: torch.Tensor) -> None:
    assert index.codebook_sizes[-1] > 1  # collisions happened
    assigner = IdAssigner.of(index)
    for j in range(index.num_items):
        others = SemanticIndex(torch.cat([index.codes[:j], index.codes[j + 1:]]),
                               index.codebook_sizes)
        sid = assigner.assign(emb[j:j + 1], others.codes_to_items)
        assert sid == [index.codes[j].tolist()], j
        # the same as an item that owns its current ID
        again = assigner.assign(emb[j:j + 1], index.codes_to_items, owners=[j])
        assert again == sid


def test_balanced_index_gives_its_own_nearest_codes(emb: torch.Tensor) -> None:
    index = build_semantic_index(emb, levels=2, codebook_size=3, iters=50, balanced=True)
    assigner = IdAssigner.of(index)
    codes, _ = assigner.codebooks.codes(emb)
    first = IdCodebooks.from_meta(index.meta[CODEBOOKS_KEY], index.codebook_sizes, "t")
    d2 = torch.cdist(emb, first.centroids[0])
    assert torch.equal(codes[:, 0], d2.argmin(dim=1))  # nearest, capacity or not
    assert (codes[:, 0] == index.codes[:, 0]).float().mean() > 0.5


def test_new_items_of_one_call_take_distinct_counters(index: SemanticIndex,
                                                      emb: torch.Tensor) -> None:
    assigner = IdAssigner.of(index)
    two = torch.stack([emb[0], emb[0]])
    a, b = assigner.assign(two, index.codes_to_items)
    assert a[:-1] == b[:-1] == index.codes[0, :-1].tolist()
    assert a[-1] != b[-1]
    taken = {tuple(r) for r in index.codes.tolist()}
    assert tuple(a) not in taken and tuple(b) not in taken


def test_full_counters_move_to_the_next_nearest_code(index: SemanticIndex,
                                                     emb: torch.Tensor) -> None:
    assigner = IdAssigner.of(index)
    codes, ranked = assigner.codebooks.codes(emb[:1])
    prefix = codes[0, :-1].tolist()

    def lookup(c: torch.Tensor) -> torch.Tensor:  # every ID under the nearest codes taken
        full = (c[:, :-1] == torch.tensor(codes[0].tolist())).all(dim=1)
        return torch.where(full, 0, index.codes_to_items(c))

    (sid,) = assigner.assign(emb[:1], lookup)
    assert sid[:-2] == prefix and sid[-2] == int(ranked[0, 1])
    with pytest.raises(ValueError, match=r"new\[0\]: no free Semantic ID"):
        assigner.assign(emb[:1], lambda c: torch.zeros(len(c), dtype=torch.int64),
                        fields=["new[0]"])


def test_codebooks_are_saved_exactly_and_loaded_strictly(index: SemanticIndex,
                                                         tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    index.save(path)
    loaded = IdAssigner.of(SemanticIndex.load(path))
    for a, b in zip(loaded.codebooks.centroids, IdAssigner.of(index).codebooks.centroids,
                    strict=True):
        assert torch.equal(a, b)
    data = json.loads(path.read_text())
    data["meta"][CODEBOOKS_KEY]["codebooks"][0]["shape"][0] += 1
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="id_assignment.codebooks"):
        SemanticIndex.load(path)
    data["meta"][CODEBOOKS_KEY] = {"format": 1}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="id_assignment: expected the keys"):
        SemanticIndex.load(path)


def test_index_without_codebooks_has_no_assigner(index: SemanticIndex) -> None:
    assert IdAssigner.of(SemanticIndex(index.codes, index.codebook_sizes)) is None


def test_with_items_appends_rows_and_keeps_the_codebooks(index: SemanticIndex,
                                                         emb: torch.Tensor) -> None:
    assigner = IdAssigner.of(index)
    codes = assigner.assign(emb[:2] + 0.01, index.codes_to_items)
    bigger = with_items(index, ["new-a", "new-b"], codes)
    assert bigger.item_ids[-2:] == ["new-a", "new-b"]
    assert bigger.codes[-2:].tolist() == codes
    assert bigger.meta[CODEBOOKS_KEY] == index.meta[CODEBOOKS_KEY]
    with pytest.raises(ValueError, match="'i3': already in the index"):
        with_items(index, ["i3"], codes[:1])


def test_upserts_get_ids_from_embeddings(index: SemanticIndex, emb: torch.Tensor) -> None:
    assigner = IdAssigner.of(index)
    items = [{"item_id": "x", "embedding": emb[5].tolist()},
             {"item_id": "y", "semantic_id": [0, 0, 0]},
             {"item_id": "z", "text": "for the ranker"}]
    out, assigned = assign_upserts(items, assigner, index.codes_to_items, [-1, -1, -1],
                                   ranker=True)
    assert list(assigned) == ["x"] and out[0]["semantic_id"] == assigned["x"]
    assert "embedding" not in out[0] and out[1:] == items[1:]
    with pytest.raises(ValueError, match=r"items\[0\]\.embedding: expected 8 values, got 3"):
        assign_upserts([{"item_id": "x", "embedding": [1.0, 2.0, 3.0]}], assigner,
                       index.codes_to_items, [-1], ranker=False)
    with pytest.raises(ValueError, match=r"items\[1\]\.embedding: .* not both"):
        assign_upserts([items[0], {**items[1], "embedding": emb[1].tolist()}], assigner,
                       index.codes_to_items, [-1, -1], ranker=True)
    with pytest.raises(ValueError, match=r"items\[0\]\.semantic_id: required"):
        assign_upserts(items[:1], None, index.codes_to_items, [-1], ranker=False)
    with pytest.raises(ValueError, match=r"items\[0\]\.text: this index was built from "
                                         r"embeddings"):
        assign_upserts([{"item_id": "t", "text": "a"}], assigner, index.codes_to_items, [-1],
                       ranker=False)


def test_codebooks_of_the_first_format_load_without_a_collaborative_part(
        index: SemanticIndex, tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    index.save(path)
    data = json.loads(path.read_text())
    books = data["meta"][CODEBOOKS_KEY]
    assert books["format"] == 2 and books["collaborative"] == 0
    del books["collaborative"]
    books["format"] = 1
    path.write_text(json.dumps(data))
    loaded = IdAssigner.of(SemanticIndex.load(path))
    assert loaded.codebooks.collaborative == 0 and loaded.dim == IdAssigner.of(index).dim
    books.update(format=2, collaborative=loaded.dim)  # every dimension: no room for text
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="id_assignment.collaborative"):
        SemanticIndex.load(path)
