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
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from genrec.utils.device import to_device

Lengths = Sequence[int] | torch.Tensor


def _as_long(x: Lengths, name: str) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.long, device="cpu").reshape(-1)
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name} must be non-negative")
    return t


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 0) - x


@dataclass
class AttentionLayout:
    """Index tensors of one forward (see module docstring). Build with :func:`build_layout`."""

    num_requests: int
    num_branches: int
    num_tokens: int
    prefix_len: torch.Tensor  # [R] prefix keys after this forward
    prefix_cap: int  # cache slots per request prefix
    prefix_tokens: torch.Tensor  # [Tp] packed index of each new prefix token
    prefix_slots: torch.Tensor  # [Tp] r * prefix_cap + position in prefix
    prefix_rows: torch.Tensor  # [Tp] r * prefix_width + j
    prefix_width: int  # most new prefix tokens of a request
    prefix_causal: bool  # True: plain causal mask suffices for prefix queries
    prefix_mask: torch.Tensor | None  # bool [R, 1, prefix_width, prefix_cap]
    branch_request: torch.Tensor  # [NB]
    branch_len: torch.Tensor  # [NB] branch keys after this forward
    branch_cap: int
    branch_tokens: torch.Tensor  # [Tb] packed index of each new branch token
    branch_slots: torch.Tensor  # [Tb] b * branch_cap + position in branch
    branch_rows: torch.Tensor  # [Tb] b * branch_width + j
    branch_width: int  # most new tokens of a branch
    branch_causal: bool
    branch_mask: torch.Tensor | None  # bool [NB, 1, branch_width, branch_cap]
    shared_rows: torch.Tensor  # [Tb] r * shared_width + j: branch queries grouped by request
    shared_width: int  # most new branch tokens of a request
    shared_mask: torch.Tensor | None  # bool [R, 1, 1, prefix_cap]; None when no padding
    shared_empty: torch.Tensor | None  # bool [Tb]: branch token whose request has no prefix
    positions: torch.Tensor  # [T] default positions: a branch continues from its prefix end
    single_request: bool  # one request: prefix tokens are [0, Tp), branch tokens [Tp, T)
    prefix_dense: bool  # every request has prefix_width new prefix tokens: prefix_rows is arange
    shared_dense: bool  # every request has shared_width new branch tokens: shared_rows is arange
    uniform_branches: bool  # every branch has branch_width new tokens: branch_rows is arange
    prefix_new: torch.Tensor  # [R] new prefix tokens of each request
    prefix_first: torch.Tensor  # [R] packed index of each request's first new token
    branch_new: torch.Tensor  # [NB] new tokens of each branch
    branch_first: torch.Tensor  # [NB] packed index of each branch's first new token
    _derived: dict = field(default_factory=dict, repr=False)

    def to(self, device: torch.device | str) -> AttentionLayout:
        """This layout with every tensor on ``device``: itself where they are, else a copy
        made once and kept (memoised layouts recur: no transfer per forward, none per layer;
        to a GPU from pinned memory, without a blocking copy)."""
        device = torch.device(device)
        if self.positions.device == device:
            return self
        key = ("to", str(device))
        if key not in self._derived:
            moved = {
                name: to_device(value, device) if isinstance(value, torch.Tensor) else value
                for name, value in self.__dict__.items()
                if name != "_derived"
            }
            self._derived[key] = AttentionLayout(**moved)
        return self._derived[key]

    def query_runs(self, tile: int) -> tuple[torch.Tensor, int]:
        """Runs of at most ``tile`` consecutive packed query rows with the keys they see, as
        int64 rows (q_start, q_len, shared_start, shared_len, own_source, own_start,
        own_before), and the most keys a run sees. Query i of a run (row q_start + i) sees
        prefix-cache rows [shared_start, +shared_len) and rows [own_start, +own_before + i + 1)
        of the prefix cache (own_source 1) or the branch cache (0), both flattened over their
        first two dims. Built once (on the CPU)."""
        key = ("runs", tile)
        if key not in self._derived:
            self._derived[key] = _query_runs(self, tile)
        return self._derived[key]

    def additive_mask(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The bool mask ``name`` as an additive mask (0 / -inf) of ``dtype``, built once."""
        key = (name, dtype)
        if key not in self._derived:
            mask = getattr(self, name)
            if mask is not None:
                zeros = torch.zeros((), dtype=dtype, device=mask.device)
                mask = zeros.masked_fill(~mask, float("-inf")).expand(mask.shape).contiguous()
            self._derived[key] = mask
        return self._derived[key]


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
    req_start = _exclusive_cumsum(p_new + branch_sum)
    num_tokens = int((p_new + branch_sum).sum())

    # Prefix tokens.
    tp = int(p_new.sum())
    p_req = torch.repeat_interleave(torch.arange(n_req), p_new)
    p_j = torch.arange(tp) - _exclusive_cumsum(p_new)[p_req]
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
    t_j = torch.arange(tb) - _exclusive_cumsum(b_new)[t_br]
    t_req = b_req[t_br]
    first_in_req = _exclusive_cumsum(b_new) - _exclusive_cumsum(branch_sum)[b_req]  # [NB]
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


def _query_runs(layout: AttentionLayout, tile: int) -> tuple[torch.Tensor, int]:
    # see AttentionLayout.query_runs; branches first (they see the most keys)
    lay = layout.to("cpu")
    reqs, brs = torch.arange(lay.num_requests), torch.arange(lay.num_branches)
    b_req = lay.branch_request
    first = torch.cat((lay.branch_first, lay.prefix_first))
    count = torch.cat((lay.branch_new, lay.prefix_new))
    shared_start = torch.cat((b_req, reqs)) * lay.prefix_cap
    shared_len = torch.cat((lay.prefix_len[b_req], torch.zeros_like(reqs)))
    own_source = torch.cat((torch.zeros_like(brs), torch.ones_like(reqs)))
    own_start = torch.cat((brs * lay.branch_cap, reqs * lay.prefix_cap))
    before = torch.cat((lay.branch_len - lay.branch_new, lay.prefix_len - lay.prefix_new))
    tiles = (count + tile - 1) // tile  # a run with no rows gets no tile
    run = torch.repeat_interleave(torch.arange(count.numel()), tiles)
    offset = (torch.arange(run.numel()) - _exclusive_cumsum(tiles)[run]) * tile
    q_len = torch.minimum(count[run] - offset, torch.tensor(tile))
    runs = torch.stack((first[run] + offset, q_len, shared_start[run], shared_len[run],
                        own_source[run], own_start[run], before[run] + offset), dim=1)
    keys = runs[:, 3] + runs[:, 6] + runs[:, 1]
    return runs.contiguous(), int(keys.max()) if keys.numel() else 0


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
