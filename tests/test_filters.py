"""Search filters as sorted ranks: counts over an edge's ranked items, against brute force."""

import pytest
import torch

from genrec.catalog.filters import PartFilter, count_in, padded_ranks
from genrec.catalog.trie import SemanticTrie

SIZES = [3, 4, 2]


def random_codes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    space = torch.cartesian_prod(*(torch.arange(k) for k in SIZES))
    return space[torch.randperm(len(space), generator=g)[:n]]


def test_count_in_one_list_and_per_request_rows() -> None:
    seq = torch.tensor([1, 4, 4, 9])
    start, end = torch.tensor([[0, 4, 5]]), torch.tensor([[2, 5, 10]])
    assert count_in(seq, start, end).tolist() == [[1, 2, 1]]
    rows = torch.tensor([[1, 3, 99], [2, 99, 99]])
    assert count_in(rows, torch.tensor([[0, 2], [0, 3]]), torch.tensor([[4, 3], [3, 9]])
                    ).tolist() == [[2, 0], [1, 0]]
    assert count_in(torch.zeros(0, dtype=torch.long), start, end).tolist() == [[0, 0, 0]]


def test_padded_ranks_sorts_and_dedups_per_request() -> None:
    got = padded_ranks(torch.tensor([2, 0, 2, 2, 0]), torch.tensor([5, 3, 1, 5, 0]), 4, 99, 3)
    assert got.tolist() == [[0, 3, 99], [99, 99, 99], [1, 5, 99], [99, 99, 99]]
    # entries equal to the padding are padding; the width defaults to the entries' count
    got = padded_ranks(torch.tensor([1, 0, 1]), torch.tensor([99, 4, 2]), 2, 99)
    assert got.tolist() == [[4, 99, 99], [2, 99, 99]]
    assert padded_ranks(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                        2, 7).tolist() == [[7], [7]]


def _brute(codes: torch.Tensor, ok_items: list[set[int]], prefix_rows, level: int):
    # [R, rows, K]: some allowed item under prefix + code
    out = torch.zeros(len(ok_items), len(prefix_rows), SIZES[level], dtype=torch.bool)
    for r, items in enumerate(ok_items):
        for i in items:
            c = tuple(codes[i].tolist())
            for row, prefix in enumerate(prefix_rows):
                if c[:level] == prefix:
                    out[r, row, c[level]] = True
    return out


@pytest.mark.parametrize("level", [0, 1, 2])
def test_live_edges_match_brute_force(level: int) -> None:
    codes = random_codes(20, seed=4)
    trie = SemanticTrie.from_codes(codes, SIZES)
    n = codes.shape[0]
    dead_items = [3, 11]
    exclude = [[0, 1, 5], [], [7]]
    allow = [None, [2, 3, 4, 6, 19], [7, 8, 9]]
    r = len(exclude)
    rank = trie.ranks(torch.arange(n))
    dead = torch.sort(rank[dead_items]).values
    req_x = torch.tensor([k for k, e in enumerate(exclude) for _ in e], dtype=torch.long)
    excl = padded_ranks(req_x, rank[torch.tensor([i for e in exclude for i in e])], r, n + 1)
    # allowed ranks: live and not excluded (CatalogState.search_filters guarantees it)
    allowed_sets = [None if a is None else set(a) - set(dead_items) - set(exclude[k])
                    for k, a in enumerate(allow)]
    req_a = torch.tensor([k for k, a in enumerate(allowed_sets) for _ in a or ()],
                         dtype=torch.long)
    items_a = torch.tensor([i for a in allowed_sets for i in sorted(a or ())], dtype=torch.long)
    allowed = padded_ranks(req_a, rank[items_a], r, n + 1)
    restricted = torch.tensor([a is not None for a in allow])
    flt = PartFilter(dead, excl, allowed, restricted)
    prefixes = sorted({tuple(c[:level]) for c in codes.tolist()})
    node_of = {(): 0}  # walk the prefixes down to their nodes
    for lv in range(level):
        nxt = {}
        for p, node in node_of.items():
            edges = trie.expand(lv, torch.tensor([node]))[0]
            for c in range(SIZES[lv]):
                if edges[c] >= 0:
                    nxt[(*p, c)] = int(edges[c])
        node_of = nxt
    nodes = torch.tensor([node_of[p] for p in prefixes])
    edges = trie.expand(level, nodes.expand(r, -1))  # [R, rows, K]
    got = flt.live(trie, level, edges)
    ok = [(set(range(n)) - set(dead_items) - set(exclude[k])) if allow[k] is None
          else allowed_sets[k] for k in range(r)]
    assert torch.equal(got, _brute(codes, ok, prefixes, level))
    plain = PartFilter(dead[:0]).live(trie, level, edges)
    assert torch.equal(plain, edges >= 0)
