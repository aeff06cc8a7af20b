import json

import pytest
import torch

from genrec.catalog.kmeans import kmeans, residual_kmeans
from genrec.catalog.semantic_ids import (
    SemanticIndex,
    dedup_level,
    group_counter,
    mixed_radix_key,
    prefix_stats,
)


def clustered(n: int = 400, dim: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(12, dim, generator=g) * 4
    return centers[torch.randint(12, (n,), generator=g)] + torch.randn(n, dim, generator=g)


def small_index() -> SemanticIndex:
    codes = torch.tensor([[0, 1, 0], [0, 1, 1], [2, 0, 0], [1, 3, 0]])
    return SemanticIndex(codes, [3, 4, 2])


def test_token_mapping_roundtrip():
    index = small_index()
    assert index.token_offsets() == [0, 3, 7]
    assert index.token_offsets(base=100) == [100, 103, 107]
    assert index.vocab_size == 9
    tokens = index.item_to_tokens([3, 0], base=100)
    assert tokens.tolist() == [[101, 106, 107], [100, 104, 107]]
    items = torch.arange(4)
    assert torch.equal(index.tokens_to_items(index.item_to_tokens(items, 5), 5), items)
    bad = torch.tensor([
        [100, 104, 108],  # [0, 1, 1] is item 1
        [100, 104, 109],  # code 2 is outside level 2
        [102, 103, 107],  # [2, 0, 0] is item 2
        [102, 104, 107],  # [2, 1, 0] is no item
        [103, 104, 107],  # token 103 belongs to level 1, not level 0
    ])
    assert index.tokens_to_items(bad, base=100).tolist() == [1, -1, 2, -1, -1]
    assert index.codes_to_items(torch.tensor([[[1, 3, 0]]])).tolist() == [[3]]


def test_validation_names_items():
    codes = torch.tensor([[0, 1], [1, 1], [0, 1], [1, 0]])
    index = SemanticIndex(codes, [2, 2], item_ids=["a", "b", "c", "d"])
    with pytest.raises(ValueError, match=r"\[0, 1\]: items 0 \(id 'a'\), 2 \(id 'c'\)"):
        index.validate()
    with pytest.raises(ValueError, match="outside the codebook sizes"):
        SemanticIndex(torch.tensor([[0, 2]]), [2, 2])
    with pytest.raises(ValueError, match="codes must be"):
        SemanticIndex(torch.tensor([[0, 1]]), [2, 2, 2])


def test_dedup_level_counts_within_groups():
    codes = torch.tensor([[0, 0], [0, 0], [1, 0], [0, 0], [1, 0], [2, 1]])
    assert dedup_level(codes).tolist() == [0, 1, 0, 2, 1, 0]


def test_kmeans_reseeds_empty_clusters():
    # 3 groups of identical points: random init often picks 2 seeds in one group
    x = torch.tensor([[10.0, 10.0]] * 10 + [[20.0, 10.0]] * 10 + [[10.0, 20.0]] * 10)
    for seed in range(8):
        centroids, assign = kmeans(x, 3, iters=20, seed=seed, init="random")
        assert sorted(assign.view(3, 10)[:, 0].tolist()) == [0, 1, 2], seed
        assert (assign.view(3, 10) == assign.view(3, 10)[:, :1]).all()
    centroids, assign = kmeans(x[:2], 4)  # fewer points than clusters
    assert assign.tolist() == [0, 1] and centroids.shape == (4, 2)


def test_residual_kmeans_reconstruction_improves_with_levels():
    x = clustered()
    result = residual_kmeans(x, [8, 8, 8], iters=20, seed=0)
    errors = [((x - result.reconstruct(level)) ** 2).sum(1).mean().item() for level in range(4)]
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert errors[3] < 0.5 * errors[1]
    again = residual_kmeans(x, [8, 8, 8], iters=20, seed=0)
    assert torch.equal(result.codes, again.codes)


def test_save_load_roundtrip(tmp_path):
    index = small_index()
    index.item_ids, index.meta = ["w", "x", "y", "z"], {"method": "test"}
    path = tmp_path / "sub" / "sid.json"
    index.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["sid.json"]
    loaded = SemanticIndex.load(path)
    assert torch.equal(loaded.codes, index.codes)
    assert loaded.codebook_sizes == [3, 4, 2] and loaded.item_ids == index.item_ids
    assert loaded.meta == {"method": "test"}
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a genrec.semantic_index file"):
        SemanticIndex.load(path)



def test_group_counter_matches_dedup_level_on_keys():
    key = torch.tensor([7, 3, 7, 7, 3, 1])
    assert group_counter(key).tolist() == [0, 0, 1, 2, 1, 0]


def test_mixed_radix_key_orders_like_the_code_tuples():
    codes = torch.tensor([[1, 0, 2], [0, 3, 1], [1, 0, 0], [0, 3, 2]])
    key = mixed_radix_key(codes, [2, 4, 3])
    assert key.tolist() == [1 * 12 + 0 + 2, 0 + 3 * 3 + 1, 12, 3 * 3 + 2]
    ranked = sorted(range(4), key=lambda i: codes[i].tolist())
    assert torch.argsort(key).tolist() == ranked


def test_prefix_stats_counts() -> None:
    codes = torch.tensor([[0, 0], [0, 1], [0, 1], [1, 0]])
    stats = prefix_stats(codes)
    assert stats[0] == {"level": 1, "distinct": 2, "largest_group": 3, "unique_share": 0.25}
    assert stats[1] == {"level": 2, "distinct": 3, "largest_group": 2, "unique_share": 0.5}
