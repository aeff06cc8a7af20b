"""Attention layout of one forward: requests made of a shared prefix plus branches.

A forward processes R requests. Request r owns a prefix (``prefix_cached[r]`` tokens already in
the KV cache plus ``prefix_new[r]`` new ones) and a number of branches (candidates or beams).
Branch b belongs to request ``branch_request[b]`` and has ``branch_cached[b]`` tokens in the
cache plus ``branch_new[b]`` new ones. A prefix token sees the earlier tokens of its prefix; a
branch token sees its request's whole prefix and the earlier tokens of its own branch only.

New tokens are packed request-major: request r's new prefix tokens, then the new tokens of its
branches, branch after branch (``branch_request`` must be non-decreasing). The layout holds the
index tensors that move packed rows into the padded grids the attention kernels work on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from genrec.model.packed_layout import AttentionLayout, exclusive_cumsum
from genrec.utils.device import to_device

Lengths = Sequence[int] | torch.Tensor


def _as_long(x: Lengths, name: str) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.long, device="cpu").reshape(-1)
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name} must be non-negative")
    return t


def build_layout(
    prefix_new: Lengths,
    branch_request: Lengths,
    branch_new: Lengths,
    prefix_cached: Lengths | None = None,
    branch_cached: Lengths | None = None,
    prefix_cap: int | None = None,
    branch_cap: int | None = None,
) -> AttentionLayout:
    """Vectorised construction of an :class:`AttentionLayout` (on the CPU; move with ``.to``)."""
    p_new = _as_long(prefix_new, "prefix_new")
    n_req = p_new.numel()
    p_cached = _as_long([0] * n_req if prefix_cached is None else prefix_cached, "prefix_cached")
    b_req = _as_long(branch_request, "branch_request")
    b_new = _as_long(branch_new, "branch_new")
    n_br = b_req.numel()
    b_cached = _as_long(branch_cached if branch_cached is not None else [0] * n_br, "branch_cached")
    if p_cached.numel() != n_req or b_new.numel() != n_br or b_cached.numel() != n_br:
        raise ValueError("layout length lists disagree in size")
    if n_br and (int(b_req.max()) >= n_req or bool((b_req[1:] < b_req[:-1]).any())):
        raise ValueError("branch_request must be non-decreasing request indices < num_requests")

    p_len = p_cached + p_new
    b_len = b_cached + b_new
    p_cap = int(p_len.max()) if n_req else 0
    p_cap = max(p_cap, prefix_cap or 0)
    b_cap = max(int(b_len.max()) if n_br else 0, branch_cap or 0)

    # Tokens per request: new prefix tokens followed by the new tokens of its branches.
    branch_sum = torch.zeros(n_req, dtype=torch.long).index_add_(0, b_req, b_new)
    req_start = exclusive_cumsum(p_new + branch_sum)
    num_tokens = int((p_new + branch_sum).sum())

    # Prefix tokens.
    tp = int(p_new.sum())
    p_req = torch.repeat_interleave(torch.arange(n_req), p_new)
    p_j = torch.arange(tp) - exclusive_cumsum(p_new)[p_req]
    p_width = int(p_new.max()) if n_req else 0
    prefix_tokens = req_start[p_req] + p_j
    prefix_slots = p_req * p_cap + p_cached[p_req] + p_j
    prefix_rows = p_req * p_width + p_j
    prefix_causal = bool((p_cached[p_new > 0] == 0).all())
    prefix_mask = None
    if not prefix_causal:
        q_pos = p_cached[:, None] + torch.arange(p_width)[None, :]  # [R, Pq]
        keys = torch.arange(p_cap)[None, None, :]
        prefix_mask = (keys <= q_pos[:, :, None]) & (keys < p_len[:, None, None])
        prefix_mask |= (q_pos[:, :, None] >= p_len[:, None, None]) & (keys == 0)  # padded rows
        prefix_mask = prefix_mask[:, None]

    # Branch tokens.
    tb = int(b_new.sum())
    t_br = torch.repeat_interleave(torch.arange(n_br), b_new)
    t_j = torch.arange(tb) - exclusive_cumsum(b_new)[t_br]
    t_req = b_req[t_br]
    first_in_req = exclusive_cumsum(b_new) - exclusive_cumsum(branch_sum)[b_req]  # [NB]
    b_width = int(b_new.max()) if n_br else 0
    branch_tokens = req_start[t_req] + p_new[t_req] + first_in_req[t_br] + t_j
    branch_slots = t_br * b_cap + b_cached[t_br] + t_j
    branch_rows = t_br * b_width + t_j
    branch_causal = bool((b_cached == 0).all())
    branch_mask = None
    if not branch_causal:
        q_pos = b_cached[:, None] + torch.arange(b_width)[None, :]
        keys = torch.arange(b_cap)[None, None, :]
        branch_mask = (keys <= q_pos[:, :, None])[:, None]

    shared_width = int(branch_sum.max()) if n_req else 0
    shared_rows = t_req * shared_width + first_in_req[t_br] + t_j
    shared_mask = None
    if n_req and bool((p_len < p_cap).any()):
        shared_mask = (torch.arange(p_cap)[None, :] < p_len[:, None])[:, None, None, :]
    shared_empty = (p_len[t_req] == 0) if bool((p_len == 0).any()) else None

    positions = torch.empty(num_tokens, dtype=torch.long)
    positions[prefix_tokens] = p_cached[p_req] + p_j
    positions[branch_tokens] = p_len[t_req] + b_cached[t_br] + t_j

    return AttentionLayout(
        num_requests=n_req, num_branches=n_br, num_tokens=num_tokens,
        prefix_len=p_len, prefix_cap=p_cap, prefix_tokens=prefix_tokens,
        prefix_slots=prefix_slots, prefix_rows=prefix_rows, prefix_width=p_width,
        prefix_causal=prefix_causal, prefix_mask=prefix_mask,
        branch_request=b_req, branch_len=b_len, branch_cap=b_cap, branch_tokens=branch_tokens,
        branch_slots=branch_slots, branch_rows=branch_rows, branch_width=b_width,
        branch_causal=branch_causal, branch_mask=branch_mask,
        shared_rows=shared_rows, shared_width=shared_width, shared_mask=shared_mask,
        shared_empty=shared_empty, positions=positions, single_request=n_req == 1,
        prefix_dense=p_width * n_req == tp, shared_dense=shared_width * n_req == tb,
        uniform_branches=bool(n_br == 0 or int(b_new.min()) == b_width),
        prefix_new=p_new, prefix_first=req_start,
        branch_new=b_new, branch_first=req_start[b_req] + p_new[b_req] + first_in_req,
    )


@dataclass
class Readout:
    """Rows whose final hidden states a forward must return, and ``layout``: those rows as
    queries over keys already in the cache. The last layer then runs its attention output,
    MLP and norm for these rows only (their keys and values are still written for all)."""

    rows: torch.Tensor  # [K] packed rows, in the packing order of ``layout``
    layout: AttentionLayout

    def to(self, device: torch.device | str) -> Readout:
        return Readout(to_device(self.rows, device), self.layout.to(device))


# Layouts up to this many tokens are memoised by shared_layout (larger ones are rebuilt).
SHARED_LAYOUT_MAX_TOKENS = 8192


def _key(x: Lengths | None) -> tuple[int, ...] | None:
    if x is None:
        return None
    return tuple(x.tolist()) if isinstance(x, torch.Tensor) else tuple(x)


@lru_cache(maxsize=64)
def _memoised_layout(*key: tuple[int, ...] | int | None) -> AttentionLayout:
    p_new, b_req, b_new, p_cached, b_cached, p_cap, b_cap = key
    return build_layout(p_new, b_req, b_new, p_cached, b_cached, p_cap, b_cap)


def shared_layout(
    prefix_new: Lengths, branch_request: Lengths, branch_new: Lengths,
    prefix_cached: Lengths | None = None, branch_cached: Lengths | None = None,
    prefix_cap: int | None = None, branch_cap: int | None = None,
) -> AttentionLayout:
    """:func:`build_layout`, memoised for small layouts: requests of one shape (the same
    prefix and candidate lengths, e.g. DuoLM candidates of k tokens) recur, and building a
    layout costs ~0.3 ms. A layout is never modified after it is built (its lazily built
    float masks are derived data), so sharing one between forwards is safe."""
    key = tuple(_key(x) for x in (prefix_new, branch_request, branch_new, prefix_cached,
                                  branch_cached)) + (prefix_cap, branch_cap)
    if sum(key[0]) + sum(key[2]) > SHARED_LAYOUT_MAX_TOKENS:
        return build_layout(*key)
    return _memoised_layout(*key)


def branch_last_readout(
    prefix_len: Lengths, branch_request: Lengths, branch_len: Lengths, last_rows: torch.Tensor,
    branch_cap: int, prefix_cap: int | None = None,
) -> Readout:
    """Readout of each branch's last token (a branch of n keys reads keys 0..n-1)."""
    lens = _key(branch_len)
    if any(n < 1 for n in lens):
        raise ValueError("branch_len: every branch needs a token to read")
    layout = shared_layout(
        [0] * len(_key(prefix_len)), branch_request, [1] * len(lens), prefix_cached=prefix_len,
        branch_cached=[n - 1 for n in lens], branch_cap=branch_cap, prefix_cap=prefix_cap,
    )
    return Readout(rows=last_rows, layout=layout)


def prefix_last_layout(prefix_len: Lengths, prefix_cap: int) -> AttentionLayout:
    """Layout of a :class:`Readout` of each request's last prefix token: a prefix of n keys
    gives one query at n-1 over keys 0..n-1; ``prefix_cap`` is the cache's. Every prefix
    must be non-empty."""
    lens = _key(prefix_len)
    if any(n < 1 for n in lens):
        raise ValueError("a prefix read-out needs non-empty prefixes")
    return shared_layout([1] * len(lens), [], [], prefix_cached=[n - 1 for n in lens],
                         prefix_cap=prefix_cap)
