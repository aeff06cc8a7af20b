"""The attention layout of a packed forward: requests made of a shared prefix plus branches.

The semantics and the packing order are those of :mod:`genrec.model.layout`, which builds
layouts. :class:`AttentionLayout` holds the index tensors that move packed rows into the padded
grids the attention kernels work on, and implements
:class:`~genrec.model.forward_layout.ForwardLayout` over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from genrec.model.attention import RUN_MAX_KEYS, RUN_ROWS, attend_grid, merge_attention
from genrec.model.forward_layout import ForwardLayout, NativeTables
from genrec.model.kv_cache import KVCache, RowWrite, take_rows
from genrec.utils.device import to_device

_NEG_INF = float("-inf")


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """[N] -> [N]: the sum of the entries before each one."""
    return torch.cumsum(x, 0) - x


@dataclass
class AttentionLayout(ForwardLayout):
    """Index tensors of one forward (see module docstring). Build with ``layout.build_layout``."""

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

    def write_cache(
        self, cache: KVCache, layer: int, k: torch.Tensor, v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # one request: rows are [0, Tp) then [Tp, T) (slices, no gather)
        parts = (
            RowWrite(True, self.prefix_tokens, self.prefix_slots, 0,
                     self.prefix_dense and self.prefix_causal
                     and self.prefix_width == self.prefix_cap),
            RowWrite(False, self.branch_tokens, self.branch_slots, self.prefix_tokens.numel(),
                     self.uniform_branches and self.branch_causal
                     and self.branch_width == self.branch_cap),
        )
        return cache.write_rows(layer, k, v, parts, self.single_request)

    def kernel_runs(self, prefix_cap: int) -> torch.Tensor | None:
        runs, most_keys = self.query_runs(RUN_ROWS)
        return runs if most_keys <= RUN_MAX_KEYS else None

    def native_tables(self, prefix_capacity: int, readout: bool) -> NativeTables | None:
        # prompts alone (no branch tokens)
        if self.branch_tokens.numel():
            return None
        tasks = self.kernel_runs(prefix_capacity)
        return None if tasks is None else NativeTables(write_rows=self.prefix_slots,
                                                       tasks=tasks)

    def attend_portable(
        self, q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
        branch_k: torch.Tensor, branch_v: torch.Tensor, scale: float,
    ) -> torch.Tensor:
        # prefix queries against their prefix; branch queries against their prefix (part A)
        # and their own branch (part B), merged by log-sum-exp
        n_req, single = self.num_requests, self.single_request
        n_prefix, n_branch = self.prefix_tokens.numel(), self.branch_tokens.numel()
        pk, pv = prefix_k.transpose(1, 2), prefix_v.transpose(1, 2)  # [R, Hkv, P, D]
        # both parts: written into one output (for one request, prefix rows then branch rows)
        out = q.new_empty(q.shape) if n_prefix and n_branch else None

        if n_prefix:
            qp = take_rows(q, self.prefix_tokens, 0 if single else None)
            mask = self.additive_mask("prefix_mask", q.dtype)
            o_p, _ = attend_grid(qp, self.prefix_rows, n_req, self.prefix_width,
                                 self.prefix_dense, pk, pv, mask, self.prefix_causal, scale,
                                 need_lse=False)
            if out is None:
                return o_p
            if single:
                out[:n_prefix] = o_p
            else:
                out[self.prefix_tokens] = o_p

        qb = take_rows(q, self.branch_tokens, n_prefix if single else None)
        # Part B: each branch against its own keys.
        mask = self.additive_mask("branch_mask", q.dtype)
        o_b, lse_b = attend_grid(
            qb, self.branch_rows, self.num_branches, self.branch_width,
            self.uniform_branches, branch_k.transpose(1, 2), branch_v.transpose(1, 2), mask,
            self.branch_causal, scale,
        )
        # one request: the merge writes into ``out`` (not under autograd: lerp's out= has none)
        in_place = out is not None and single and not torch.is_grad_enabled()
        if self.prefix_cap:
            # Part A: all branch queries of a request against its prefix, in one product.
            mask = self.additive_mask("shared_mask", q.dtype)
            o_a, lse_a = attend_grid(qb, self.shared_rows, n_req, self.shared_width,
                                     self.shared_dense, pk, pv, mask, False, scale)
            if self.shared_empty is not None:
                lse_a = lse_a.masked_fill(self.shared_empty[:, None], _NEG_INF)
            o_b = merge_attention(o_a, lse_a, o_b, lse_b,
                                  out=out[n_prefix:] if in_place else None)
        if out is None:
            return o_b
        if single and not in_place:
            out[n_prefix:] = o_b
        elif not single:
            out[self.branch_tokens] = o_b
        return out


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
    offset = (torch.arange(run.numel()) - exclusive_cumsum(tiles)[run]) * tile
    q_len = torch.minimum(count[run] - offset, torch.tensor(tile))
    runs = torch.stack((first[run] + offset, q_len, shared_start[run], shared_len[run],
                        own_source[run], own_start[run], before[run] + offset), dim=1)
    keys = runs[:, 3] + runs[:, 6] + runs[:, 1]
    return runs.contiguous(), int(keys.max()) if keys.numel() else 0


