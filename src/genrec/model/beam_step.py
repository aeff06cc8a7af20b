"""One beam-search step on a KV indirection (TensorRT-LLM's "cache indirection").

A search over ``L`` levels keeps, per layer, one prefix per request and a *tail* of ``L - 1``
fixed slots per beam row (:class:`~genrec.model.kv_cache.KVCache`'s branch part). The token
of level ``j`` (fed at step ``j + 1``) is written once, into slot ``j`` of the row of the beam
that holds it; beams are never moved. An ancestry table ``[NB, L - 1]`` says, for each beam row
``b`` and level ``j``, which row's slot ``j`` holds the beam's token of level ``j``: when a beam
takes parent ``p``, its row gets ``ancestry[p]`` (one gather of ``NB x (L - 1)`` ints per level)
and its own row for the next slot. Attention reads the beam's tail through that table.

Everything here is shaped by the search alone (requests, beams, level, capacities), so a step
runs on static buffers with no host sync: positions come from the device-side prefix lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from genrec.model.attention import RUN_MAX_KEYS
from genrec.model.forward_layout import ForwardLayout, NativeTables
from genrec.model.grid_attention import attend, attend_math, cuda_fused_ok
from genrec.model.kv_cache import KVCache

_NEG_INF = float("-inf")


@dataclass
class BeamStepLayout(ForwardLayout):
    """The attention layout of step ``level`` (1 .. L-1) of a search: one new token per beam.

    ``prefix_len`` [R] (prefix keys of each request, on the device), ``ancestry`` [NB, cap]
    (row of each beam's slot per level; columns ``< level`` are read), ``width`` beams per
    request (``NB = R * width``, beam rows request-major), ``tail_cap`` slots per row.
    """

    prefix_len: torch.Tensor
    ancestry: torch.Tensor
    width: int
    level: int
    tail_cap: int
    _derived: dict = field(default_factory=dict, repr=False)
    derives_positions: ClassVar[bool] = True

    @property
    def num_requests(self) -> int:
        return int(self.prefix_len.shape[0])

    @property
    def num_tokens(self) -> int:
        """One query row per beam."""
        return self.num_requests * self.width

    def beam_request(self) -> torch.Tensor:
        """[NB] the request of each beam row."""
        if "request" not in self._derived:
            rows = torch.arange(self.num_requests, device=self.prefix_len.device)
            self._derived["request"] = rows.repeat_interleave(self.width,
                                                              output_size=self.num_tokens)
        return self._derived["request"]

    def positions(self) -> torch.Tensor:
        """[NB] the position of each beam's new token: its prefix's length + ``level - 1``."""
        return self.prefix_len[self.beam_request()] + (self.level - 1)

    def slots(self) -> torch.Tensor:
        """[NB * level] the flat tail slot (row * tail_cap + level) of each beam's token of
        each level so far, beam after beam, through the ancestry."""
        if "slots" not in self._derived:
            cols = torch.arange(self.level, device=self.ancestry.device)
            slots = self.ancestry[:, : self.level] * self.tail_cap + cols
            self._derived["slots"] = slots.reshape(-1)
        return self._derived["slots"]

    def tails(self, tail: torch.Tensor) -> torch.Tensor:
        """Each beam's tail keys (or values) in level order, gathered through the ancestry:
        tail [NB, tail_cap, Hkv, D] -> [NB, level, Hkv, D]."""
        flat = tail.view((-1,) + tuple(tail.shape[2:]))
        rows = flat.index_select(0, self.slots())
        return rows.view((self.num_tokens, self.level) + tuple(tail.shape[2:]))

    def runs(self, prefix_cap: int) -> torch.Tensor:
        """The native kernel's query runs (see ``AttentionLayout.query_runs``) of this step
        over a prefix cache of ``prefix_cap`` slots per request and the gathered tails
        ``[NB, level]``: int64 [NB, 7], built on the device."""
        key = ("runs", prefix_cap)
        if key not in self._derived:
            nb, dev = self.num_tokens, self.prefix_len.device
            beams = torch.arange(nb, device=dev)
            req = self.beam_request()
            ones = torch.ones_like(beams)
            self._derived[key] = torch.stack((
                beams, ones, req * prefix_cap, self.prefix_len[req], ones * 0,
                beams * self.level, ones * (self.level - 1)), dim=1).contiguous()
        return self._derived[key]

    def own_positions(self) -> torch.Tensor:
        return self.positions()

    def write_cache(
        self, cache: KVCache, layer: int, k: torch.Tensor, v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # slot ``level - 1`` of every beam row, in place (static buffers)
        return cache.write_slot(layer, self.level - 1, k, v)

    def kernel_runs(self, prefix_cap: int) -> torch.Tensor | None:
        # over the gathered tails (kernel_caches)
        return self.runs(prefix_cap) if prefix_cap + self.level <= RUN_MAX_KEYS else None

    def kernel_caches(self, caches: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        prefix_k, prefix_v, tail_k, tail_v = caches
        return prefix_k, prefix_v, self.tails(tail_k), self.tails(tail_v)

    def attend_portable(
        self, q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
        branch_k: torch.Tensor, branch_v: torch.Tensor, scale: float,
    ) -> torch.Tensor:
        return step_attention_portable(q, prefix_k, prefix_v, branch_k, branch_v, self, scale)

    def native_tables(self, prefix_capacity: int, readout: bool) -> NativeTables | None:
        # the kernel derives runs, slots and positions from the search's tables
        if prefix_capacity + self.level > RUN_MAX_KEYS or readout:
            return None
        return NativeTables(prefix_len=self.prefix_len, ancestry=self.ancestry,
                            width=self.width, level=self.level)


def advance_ancestry(ancestry: torch.Tensor, parent_rows: torch.Tensor, level: int
                     ) -> torch.Tensor:
    """The ancestry after beams take parents ``parent_rows`` [NB] (global beam rows) at the
    end of level ``level``: each row copies its parent's, and its own row holds the slot of
    the token of level ``level`` (written at the next step). [NB, cap] -> [NB, cap]."""
    out = ancestry.index_select(0, parent_rows)
    if level < out.shape[1]:
        out[:, level] = torch.arange(out.shape[0], device=out.device)
    return out


def step_attention_portable(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, tail_k: torch.Tensor,
    tail_v: torch.Tensor, layout: BeamStepLayout, scale: float,
) -> torch.Tensor:
    """Attention of one beam step on any device: q [NB, H, D] against its request's prefix
    keys (masked beyond ``prefix_len``: fixed-capacity buffers, used lengths) and its own tail
    (gathered through the ancestry), one softmax over both; returns [NB, H, D]."""
    return branch_attention(q, prefix_k, prefix_v, layout.prefix_len, layout.tails(tail_k),
                            layout.tails(tail_v), layout.width, causal=False, scale=scale)


def branch_attention(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, used: torch.Tensor,
    own_k: torch.Tensor, own_v: torch.Tensor, width: int, causal: bool, scale: float,
) -> torch.Tensor:
    """:func:`branch_attention_portable`'s result; on CUDA, where PyTorch's fused kernels
    pass their check, the prefix part through them (no [queries, keys] scores in memory) and
    the own part as a small product, merged by log-sum-exp."""
    if q.device.type == "cuda" and cuda_fused_ok(q.device, q.dtype):
        return _branch_attention_fused(q, prefix_k, prefix_v, used, own_k, own_v, width,
                                       causal, scale)
    return branch_attention_portable(q, prefix_k, prefix_v, used, own_k, own_v, width, causal,
                                     scale)


def _branch_attention_fused(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, used: torch.Tensor,
    own_k: torch.Tensor, own_v: torch.Tensor, width: int, causal: bool, scale: float,
) -> torch.Tensor:
    n_req, cap = prefix_k.shape[0], prefix_k.shape[1]
    nb, heads, dim = own_k.shape[0], q.shape[1], q.shape[2]
    n_q = q.shape[0] // nb
    # prefix part: a request's branch queries together, keys masked beyond their used length
    seen = torch.arange(cap, device=q.device)[None, :] < used[:, None]  # [R, P]
    mask = torch.zeros(n_req, 1, 1, cap, dtype=q.dtype, device=q.device).masked_fill(
        ~seen[:, None, None, :], _NEG_INF)
    qa = q.view(n_req, width * n_q, heads, dim).transpose(1, 2)
    o_a, lse_a = attend(qa, prefix_k.transpose(1, 2), prefix_v.transpose(1, 2), mask, False,
                        scale)
    o_a = o_a.transpose(1, 2).reshape(-1, heads, dim).float()
    lse_a = lse_a.transpose(1, 2).reshape(-1, heads)
    empty = (used == 0).repeat_interleave(width * n_q, output_size=nb * n_q)[:, None]  # [T, 1]
    o_a = o_a.masked_fill(empty[..., None], 0.0)  # no prefix: the own part alone
    lse_a = lse_a.masked_fill(empty, _NEG_INF)
    # own part: [NB, H, Q, D] against the branch's own keys
    qb = q.view(nb, n_q, heads, dim).transpose(1, 2)
    o_b, lse_b = attend_math(qb, own_k.transpose(1, 2), own_v.transpose(1, 2), None, causal,
                             scale)
    o_b = o_b.transpose(1, 2).reshape(-1, heads, dim).float()
    lse_b = lse_b.transpose(1, 2).reshape(-1, heads)
    weight = torch.sigmoid(lse_b - lse_a)[..., None]
    return torch.lerp(o_a, o_b, weight).to(q.dtype)


def branch_attention_portable(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, used: torch.Tensor,
    own_k: torch.Tensor, own_v: torch.Tensor, width: int, causal: bool, scale: float,
) -> torch.Tensor:
    """Branches of equal shape on any device, static shapes and no host sync: ``width``
    branches per request (``NB = R * width``, request-major), each with ``Q`` query rows
    (q [NB * Q, H, D], branch after branch) and ``L`` own keys (own_k / own_v [NB, L, Hkv,
    D]); a query sees its request's prefix keys [R, P, Hkv, D] below ``used`` [R] and its
    branch's own keys (``causal``: query i the first i + 1, needs Q == L; else all L). The
    prefix part is one batched product per request (its branches' queries together), the own
    part a small batched product per branch, one softmax over both. Returns [NB * Q, H, D]."""
    n_req = prefix_k.shape[0]
    nb, n_own, kvh, dim = own_k.shape
    heads = q.shape[1]
    groups, n_q = heads // kvh, q.shape[0] // nb
    qf = q.float() * scale
    # prefix part: [R, Hkv, W * Q * G, D] @ [R, Hkv, D, P] -> [R, Hkv, W * Q * G, P]
    qa = qf.view(n_req, width * n_q, kvh, groups, dim).permute(0, 2, 1, 3, 4)
    s_a = torch.matmul(qa.reshape(n_req, kvh, width * n_q * groups, dim),
                       prefix_k.permute(0, 2, 3, 1).float())
    cap = prefix_k.shape[1]
    seen = torch.arange(cap, device=q.device)[None, :] < used[:, None]  # [R, P]
    s_a = torch.where(seen[:, None, None, :], s_a, _NEG_INF)
    # own part: [NB, Hkv, Q * G, D] @ [NB, Hkv, D, L] -> [NB, Hkv, Q * G, L]
    qb = qf.view(nb, n_q, kvh, groups, dim).permute(0, 2, 1, 3, 4).reshape(
        nb, kvh, n_q * groups, dim)
    s_b = torch.matmul(qb, own_k.permute(0, 2, 3, 1).float())
    if causal:
        rows = torch.arange(n_q, device=q.device).repeat_interleave(groups)  # [Q * G]
        keys = torch.arange(n_own, device=q.device)
        s_b = s_b.masked_fill(keys[None, :] > rows[:, None], _NEG_INF)

    def per_branch(t: torch.Tensor) -> torch.Tensor:
        # [R, Hkv, W * Q * G, ...] -> [NB, Hkv, Q * G, ...]
        rest = t.shape[3:]
        t = t.view(n_req, kvh, width, n_q * groups, *rest).transpose(1, 2)
        return t.reshape(nb, kvh, n_q * groups, *rest)

    # one softmax over both key sets (a query always sees its own first key)
    top = torch.maximum(per_branch(s_a.amax(dim=-1)), s_b.amax(dim=-1))  # [NB, Hkv, Q * G]
    top_a = top.view(n_req, width, kvh, n_q * groups).transpose(1, 2).reshape(
        n_req, kvh, width * n_q * groups)
    e_a = torch.exp(s_a - top_a[..., None])
    e_b = torch.exp(s_b - top[..., None])
    o_a = per_branch(torch.matmul(e_a, prefix_v.permute(0, 2, 1, 3).float()))
    o = o_a + torch.matmul(e_b, own_v.permute(0, 2, 1, 3).float())
    z = per_branch(e_a.sum(dim=-1)) + e_b.sum(dim=-1)
    out = (o / z[..., None]).view(nb, kvh, n_q, groups, dim).permute(0, 2, 1, 3, 4)
    return out.reshape(nb * n_q, heads, dim).to(q.dtype)
