"""Inputs of ``bench/catalog.py``: random unique Semantic IDs at any size (vectorised dedup
level), fresh free IDs for upserts, update plans, requests with filters, the tiny model, and
the byte count of a genrec catalog state."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from genrec import (
    Engine,
    EngineConfig,  # noqa: E402
)
from genrec.catalog.semantic_ids import group_counter, mixed_radix_key
from genrec.engine import RowRequest  # noqa: E402
from genrec.live_catalog.state import CatalogState
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID

LEVELS, CODES, HISTORY = 3, 256, 20


def random_sids(n: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    """``n`` random 3 x 256 Semantic IDs plus the dedup level (codes int64 [n, 4], sizes; the
    dedup level's size is the largest collision count)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, CODES, (n, LEVELS), generator=g)
    counter = group_counter(mixed_radix_key(codes, [CODES] * LEVELS))
    sizes = [CODES] * LEVELS + [int(counter.max()) + 1]
    return torch.cat([codes, counter[:, None]], dim=1), sizes


def free_sids(codes: torch.Tensor, sizes: list[int], m: int, seed: int) -> torch.Tensor:
    """``m`` distinct random Semantic IDs no row of ``codes`` has: int64 [m, L]."""
    g = torch.Generator().manual_seed(seed)
    taken = torch.sort(mixed_radix_key(codes, sizes)).values
    got = torch.zeros(0, len(sizes), dtype=torch.int64)
    while got.shape[0] < m:
        want = 2 * (m - got.shape[0]) + 16
        cand = torch.stack([torch.randint(0, k, (want,), generator=g) for k in sizes], 1)
        cand = torch.cat([got, cand])
        key = mixed_radix_key(cand, sizes)
        pos = torch.searchsorted(taken, key).clamp(max=taken.numel() - 1)
        cand, key = cand[taken[pos] != key], key[taken[pos] != key]
        _, first = _first_of_each(key)
        got = cand[first]
    return got[:m]


def _first_of_each(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # distinct keys and the first position of each, in the order of first appearance
    uniq, inv = torch.unique(key, return_inverse=True)
    first = torch.full((uniq.numel(),), key.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inv, torch.arange(key.numel()), reduce="amin")
    return uniq, torch.sort(first).values


@dataclass
class UpdatePlan:
    """``k`` upserts (about half new items ``N, N+1, ...``, the rest existing items given
    fresh IDs) and ``k`` retires of other existing items, as the Python lists ``updated``
    takes."""

    upsert: list[tuple[int, list[int]]]
    retire: list[int]
    first_new: int = 0

    @property
    def new_items(self) -> list[int]:
        """The ids of the new items."""
        return [i for i, _ in self.upsert if i >= self.first_new]


def update_plan(codes: torch.Tensor, sizes: list[int], k: int, seed: int) -> UpdatePlan:
    """The plan of ``k`` upserts + ``k`` retires on a catalog of ``codes`` (items 0..N-1)."""
    n = codes.shape[0]
    g = torch.Generator().manual_seed(seed)
    n_new, n_old = (k + 1) // 2, k // 2
    if n_old + k > n // 2:
        raise ValueError(f"{k} upserts + {k} retires do not fit a catalog of {n} items")
    pick = torch.randperm(n, generator=g)[: n_old + k].tolist()
    fresh = free_sids(codes, sizes, k, seed + 1).tolist()
    items = list(range(n, n + n_new)) + pick[:n_old]
    return UpdatePlan(list(zip(items, fresh, strict=True)), pick[n_old:], first_new=n)


def feasible(n: int, k: int) -> bool:
    """Whether :func:`update_plan` can plan ``k`` changes on ``n`` items."""
    return k // 2 + k <= n // 2


FILTERS = ("none", "exclude100", "allow1000")


def make_requests(n_items: int, batch: int, kind: str, seed: int) -> list[RowRequest]:
    """``batch`` requests, histories of 20 random items, with no filter, a 100-item exclude
    list or a 1,000-item allow list each (random items, one list per request)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        hist = torch.randint(0, n_items, (HISTORY,), generator=g).tolist()
        exclude = allow = None
        if kind == "exclude100":
            exclude = torch.randint(0, n_items, (100,), generator=g).tolist()
        elif kind == "allow1000":
            allow = torch.randint(0, n_items, (1000,), generator=g).tolist()
        out.append(RowRequest(hist, exclude=exclude, allow=allow))
    return out


def tiny_engine(sizes: list[int], seed: int = 0) -> Engine:
    """The tiny Qwen3 (hidden 64, 2 layers) over these codebooks, no catalog installed."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(sizes), hidden_size=64, intermediate_size=192,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=128)
    model = build_model(cfg)
    with torch.no_grad():  # sharper distributions than the default init: no score ties
        model.lm_head.weight.mul_(20)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID))


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def state_nbytes(state: CatalogState) -> int:
    """Bytes of a catalog state's tensors: the base codes, both tries, the delta and the
    retired / dead lists."""
    total = _bytes(state.base_vocab.index.codes) + state.trie.nbytes()
    if state.delta_trie is not None:
        total += state.delta_trie.nbytes()
    for t in (state.retired_items, state.delta_items, state.delta_codes, state.base_dead,
              state.delta_dead):
        total += _bytes(t)
    return total


def others_busy(window: float = 0.3) -> float:
    """Cores kept busy by other processes over ``window`` seconds (this one sleeps)."""
    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
        return vals[3] + vals[4], sum(vals)

    idle0, total0 = snap()
    time.sleep(window)
    idle1, total1 = snap()
    return (1 - (idle1 - idle0) / max(total1 - total0, 1)) * (os.cpu_count() or 1)


def wait_quiet(limit_s: float, threshold: float = 0.5) -> float:
    """Wait (at most ``limit_s``) until other processes keep under ``threshold`` cores busy;
    returns the last reading (a shared machine: the figures say what load they ran under)."""
    start = time.monotonic()
    while True:
        busy = others_busy()
        if busy < threshold or time.monotonic() - start > limit_s:
            return busy
        time.sleep(1.0)
