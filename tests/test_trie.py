import itertools

import pytest
import torch

from genrec.catalog.semantic_ids import SemanticIndex
from genrec.catalog.trie import (
    SemanticTrie,
    allowed_codes,
    build_item_mask,
    level_masks,
    ranked_prefix_counts,
)

SIZES = [3, 4, 2]


def random_codes(n: int = 11, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    space = torch.tensor(list(itertools.product(*(range(k) for k in SIZES))))
    return space[torch.randperm(len(space), generator=g)[:n]]


def test_trie_accepts_exactly_the_ids():
    codes = random_codes()
    trie = SemanticTrie.from_codes(codes, SIZES)
    ids = {tuple(c): i for i, c in enumerate(codes.tolist())}
    queries = list(itertools.product(range(-1, 4), range(-1, 5), range(-1, 3)))
    expected = [ids.get(q, -1) for q in queries]
    assert trie.lookup(torch.tensor(queries)).tolist() == expected
    assert trie.lookup(codes.view(1, 11, 3)).tolist() == [list(range(11))]
    # structure: allowed codes at the root and one step down
    assert trie.allowed[0][0].nonzero().flatten().tolist() == sorted({c[0] for c in ids})
    for c0 in range(3):
        node = trie.child[0][0, c0].item()
        below = sorted({c[1] for c in ids if c[0] == c0})
        if not below:
            assert node == -1
        else:
            assert trie.allowed[1][node].nonzero().flatten().tolist() == below
    assert trie.leaf_item.shape[1] == 2 and len(trie.child) == 2


def test_trie_from_index_and_errors():
    index = SemanticIndex(random_codes(5), SIZES)
    trie = SemanticTrie.from_index(index)
    assert trie.lookup(index.codes).tolist() == list(range(5))
    with pytest.raises(ValueError, match="duplicate Semantic IDs"):
        SemanticTrie.from_codes(torch.tensor([[0, 1, 1], [0, 1, 1]]), SIZES)
    with pytest.raises(ValueError, match="outside the codebook"):
        SemanticTrie.from_codes(torch.tensor([[0, 4, 1]]), SIZES)


def test_build_item_mask():
    mask = build_item_mask(6, allow=[None, [1, 4], []], exclude=[[0, 5], [4], None])
    assert mask.int().tolist() == [
        [0, 1, 1, 1, 1, 0],
        [0, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ]
    assert build_item_mask(3).tolist() == [[True, True, True]]
    assert build_item_mask(3, num_requests=2).shape == (2, 3)
    with pytest.raises(ValueError, match="request 1 has item 6"):
        build_item_mask(6, exclude=[[], [6]])
    with pytest.raises(ValueError, match="request count"):
        build_item_mask(6, allow=[None], exclude=[[], []])


def brute_force_level_masks(trie, codes, item_mask):
    out = []
    for level, k in enumerate(SIZES):
        m = torch.zeros(item_mask.shape[0], trie.allowed[level].shape[0], k, dtype=torch.bool)
        for r in range(item_mask.shape[0]):
            for i in range(codes.shape[0]):
                if item_mask[r, i]:
                    m[r, trie.item_node[level][i], codes[i, level]] = True
        out.append(m)
    return out


def test_level_masks_match_brute_force():
    codes = random_codes(14, seed=3)
    trie = SemanticTrie.from_codes(codes, SIZES)
    g = torch.Generator().manual_seed(1)
    item_mask = torch.rand(5, 14, generator=g) < 0.3
    item_mask[0] = True
    item_mask[1] = False
    got = level_masks(trie, item_mask)
    want = brute_force_level_masks(trie, codes, item_mask)
    for level in range(3):
        assert torch.equal(got[level], want[level]), level
    assert torch.equal(got[0][0], trie.allowed[0])  # all items allowed: the plain trie
    assert not any(m[1].any() for m in got)


def test_allowed_codes_for_beams():
    codes = random_codes(14, seed=3)
    trie = SemanticTrie.from_codes(codes, SIZES)
    item_mask = torch.rand(2, 14, generator=torch.Generator().manual_seed(2)) < 0.5
    masks = level_masks(trie, item_mask)
    counts = ranked_prefix_counts(trie, item_mask)
    for level in range(3):
        n = trie.allowed[level].shape[0]
        nodes = torch.tensor([[0, n - 1, -1], [n - 1, 0, 0]])
        got = allowed_codes(trie, level, nodes, item_mask)
        assert got.shape == (2, 3, SIZES[level])
        assert torch.equal(got, allowed_codes(trie, level, nodes, counts=counts))
        assert not got[0, 2].any()  # dead beam
        for r in range(2):
            for b in range(3):
                if nodes[r, b] >= 0:
                    assert torch.equal(got[r, b], masks[level][r, nodes[r, b]])
        plain = allowed_codes(trie, level, nodes)
        assert torch.equal(plain[1, 0], trie.allowed[level][n - 1])
        assert not plain[0, 2].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trie_on_cuda():
    codes = random_codes(14, seed=3)
    trie = SemanticTrie.from_codes(codes, SIZES).to("cuda")
    item_mask = build_item_mask(14, exclude=[[0, 1], []], device="cuda")
    masks = level_masks(trie, item_mask)
    assert all(m.is_cuda for m in masks)
    cpu = level_masks(trie.to("cpu"), item_mask.cpu())
    assert all(torch.equal(a.cpu(), b) for a, b in zip(masks, cpu, strict=True))
    assert trie.lookup(codes.cuda()).tolist() == list(range(14))
