"""The Semantic-ID trie: dense and CSR levels give the same edges, ranks and lookups."""

import itertools

import pytest
import torch

from genrec.catalog import trie as trie_module
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.catalog.trie import SemanticTrie

SIZES = [3, 4, 2]


def random_codes(n: int = 11, seed: int = 0, sizes: list[int] = SIZES) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    space = torch.tensor(list(itertools.product(*(range(k) for k in sizes))))
    return space[torch.randperm(len(space), generator=g)[:n]]


@pytest.fixture(params=["dense", "dense-torch", "sparse", "sparse-torch"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every level dense (the default for small tables), or every level CSR; expanded by the
    native CPU ops where they are built, or by tensor operations (``-torch``)."""
    if request.param.startswith("sparse"):
        monkeypatch.setattr(trie_module, "_DENSE_SLOTS", 0)
        monkeypatch.setattr(trie_module, "_DENSE_FILL", 2.0)
    if request.param.endswith("-torch"):
        monkeypatch.setattr(trie_module, "trie_expand_op", lambda: None)
        monkeypatch.setattr(trie_module, "trie_expand_dense_op", lambda: None)
    return request.param.split("-")[0]


def _prefix_items(codes: torch.Tensor, prefix: tuple[int, ...]) -> list[int]:
    return [i for i, c in enumerate(codes.tolist()) if tuple(c[: len(prefix)]) == prefix]


def test_trie_accepts_exactly_the_ids(layout: str) -> None:
    codes = random_codes()
    trie = SemanticTrie.from_codes(codes, SIZES)
    assert all(level.dense == (layout == "dense") for level in trie.levels)
    ids = {tuple(c): i for i, c in enumerate(codes.tolist())}
    queries = list(itertools.product(range(-1, 4), range(-1, 5), range(-1, 3)))
    expected = [ids.get(q, -1) for q in queries]
    assert trie.lookup(torch.tensor(queries)).tolist() == expected
    assert trie.lookup(codes.view(1, 11, 3)).tolist() == [list(range(11))]
    assert trie.ranks(torch.arange(11)).sort().values.tolist() == list(range(11))
    assert trie.ranks(torch.tensor([11, -1])).tolist() == [-1, -1]


def test_expand_and_edge_ranks_follow_the_prefixes(layout: str) -> None:
    # walk every prefix: the edges by code, their children, and the ranked items below them
    codes = random_codes(14, seed=3)
    trie = SemanticTrie.from_codes(codes, SIZES)
    order = trie.order.tolist()
    frontier = {(): 0}  # prefix -> node
    for level, k in enumerate(SIZES):
        nodes = torch.tensor(list(frontier.values()) + [-1])
        edges = trie.expand(level, nodes[None])[0]  # [nodes + 1, K]
        assert (edges[-1] == -1).all()  # a dead beam has no edges
        nxt = {}
        for row, prefix in enumerate(frontier):
            for c in range(k):
                below = _prefix_items(codes, (*prefix, c))
                e = int(edges[row, c])
                assert (e >= 0) == bool(below)
                if e < 0:
                    continue
                start, end = trie.edge_ranks(level, torch.tensor([e]))
                assert sorted(order[int(start) : int(end)]) == below
                nxt[(*prefix, c)] = e
        frontier = nxt
    leaves = torch.tensor(list(frontier.values()))
    assert trie.leaf_items(leaves).tolist() == [_prefix_items(codes, p)[0] for p in frontier]


def test_items_of_a_delta_trie_are_any_ids(layout: str) -> None:
    codes = random_codes(6, seed=5)
    items = torch.tensor([40, 3, 17, 8, 100, 21])
    trie = SemanticTrie.from_codes(codes, SIZES, items=items)
    assert trie.lookup(codes).tolist() == items.tolist()
    ranks = trie.ranks(items)
    assert trie.leaf_items(ranks).tolist() == items.tolist()
    assert trie.ranks(torch.tensor([0, 41])).tolist() == [-1, -1]
    with pytest.raises(ValueError, match="unique"):
        SemanticTrie.from_codes(codes[:2], SIZES, items=torch.tensor([1, 1]))


def test_trie_from_index_and_errors() -> None:
    index = SemanticIndex(random_codes(5), SIZES)
    trie = SemanticTrie.from_index(index)
    assert trie.lookup(index.codes).tolist() == list(range(5))
    with pytest.raises(ValueError, match="duplicate Semantic IDs"):
        SemanticTrie.from_codes(torch.tensor([[0, 1, 1], [0, 1, 1]]), SIZES)
    with pytest.raises(ValueError, match="outside the codebook"):
        SemanticTrie.from_codes(torch.tensor([[0, 4, 1]]), SIZES)
    with pytest.raises(ValueError, match="empty catalog"):
        SemanticTrie.from_codes(torch.zeros(0, 3, dtype=torch.long), SIZES)


def test_wide_codebooks_sort_without_a_mixed_radix_key() -> None:
    # 8 levels of 512 codes overflow an int64 key: lexicographic sorts level by level
    sizes = [512] * 8
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 512, (300, 8), generator=g)
    trie = SemanticTrie.from_codes(codes, sizes)
    ranked = codes[trie.order.long()].tolist()
    assert ranked == sorted(ranked)
    assert trie.lookup(codes).tolist() == list(range(300))


def test_sparse_levels_are_small() -> None:
    # 20k random IDs over 3 x 256 codes: the last level is CSR and int16 codes
    g = torch.Generator().manual_seed(0)
    codes = torch.unique(torch.randint(0, 256, (20000, 3), generator=g), dim=0)
    trie = SemanticTrie.from_codes(codes, [256] * 3)
    assert not trie.levels[-1].dense and trie.levels[-1].codes.dtype == torch.int16
    assert trie.nbytes() / codes.shape[0] < 32
    assert trie.lookup(codes).tolist() == list(range(codes.shape[0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trie_on_cuda() -> None:
    codes = random_codes(14, seed=3)
    trie = SemanticTrie.from_codes(codes, SIZES).to("cuda")
    assert trie.lookup(codes.cuda()).tolist() == list(range(14))
    nodes = torch.tensor([[0, -1]], device="cuda")
    assert trie.expand(0, nodes).is_cuda
