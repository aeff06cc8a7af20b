"""A scoring forward on a fixed grid: static shapes for step runners and CUDA graphs.

``R`` requests, each a prefix of ``P`` slots (the first ``used[r]`` real, the rest padding)
and ``C`` candidates of ``k`` tokens each (padding candidates past a request's count). Rows are
in grid order: every prefix slot (request after request), then every candidate token
(candidate after candidate, request-major). A prefix row sees the rows before it in its
prefix (padding slots come after the real ones, so a real row never sees one); a candidate
row sees its request's real prefix slots and the tokens before it in its own candidate, at
positions ``used[r] + t``: what it would see alone. Only ``used`` is data: nothing else about
the grid depends on the requests, so its index tensors are fixed per grid shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from genrec.model.attention import RUN_MAX_KEYS, RUN_ROWS
from genrec.model.beam_step import branch_attention
from genrec.model.forward_layout import ForwardLayout
from genrec.model.grid_attention import attend_output
from genrec.model.kv_cache import KVCache


@dataclass
class ScoreGridLayout(ForwardLayout):
    """The grid of one scoring forward (see the module docstring): ``used`` [R] real
    prefix slots per request (on the device), ``prefix_cap`` P, ``width`` C candidates per
    request, ``branch_len`` k tokens per candidate."""

    used: torch.Tensor
    prefix_cap: int
    width: int
    branch_len: int
    _derived: dict = field(default_factory=dict, repr=False)

    @property
    def num_requests(self) -> int:
        return int(self.used.shape[0])

    @property
    def num_prefix_rows(self) -> int:
        return self.num_requests * self.prefix_cap

    @property
    def num_branches(self) -> int:
        return self.num_requests * self.width

    @property
    def branch_cap(self) -> int:
        return self.branch_len

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_rows + self.num_branches * self.branch_len

    def positions(self) -> torch.Tensor:
        """[T] positions in grid order (candidate token t of request r at ``used[r] + t``)."""
        dev, k = self.used.device, self.branch_len
        prefix = torch.arange(self.prefix_cap, device=dev).repeat(self.num_requests)
        start = self.used.repeat_interleave(self.width * k, output_size=self.num_branches * k)
        own = torch.arange(k, device=dev).repeat(self.num_branches)
        return torch.cat((prefix, start + own))

    def last_rows(self) -> torch.Tensor:
        """[R * C] the row of each candidate's last token."""
        dev, k = self.used.device, self.branch_len
        return self.num_prefix_rows + torch.arange(self.num_branches, device=dev) * k + k - 1

    def runs(self) -> torch.Tensor:
        """The native kernel's query runs (see ``AttentionLayout.query_runs``) over the
        prefix cache [R * P] and the candidate cache [R * C * k]: int64 [runs, 7], built on
        the device (only the candidates' prefix lengths are data)."""
        if "runs" not in self._derived:
            dev = self.used.device
            n_req, cap, k = self.num_requests, self.prefix_cap, self.branch_len
            tiles = (cap + RUN_ROWS - 1) // RUN_ROWS
            req = torch.arange(n_req, device=dev).repeat_interleave(tiles, output_size=n_req *
                                                                    tiles)
            offset = torch.arange(tiles, device=dev).repeat(n_req) * RUN_ROWS
            zeros = torch.zeros_like(req)
            prefix = torch.stack((req * cap + offset, (cap - offset).clamp(max=RUN_ROWS),
                                  zeros, zeros, zeros + 1, req * cap, offset), dim=1)
            branch = torch.arange(self.num_branches, device=dev)
            b_req = branch // self.width
            zeros = torch.zeros_like(branch)
            cands = torch.stack((self.num_prefix_rows + branch * k, zeros + k, b_req * cap,
                                 self.used[b_req], zeros, branch * k, zeros), dim=1)
            self._derived["runs"] = torch.cat((cands, prefix)).contiguous()
        return self._derived["runs"]

    def most_keys(self) -> int:
        """The most keys a query row sees (a Python int, fixed by the grid's shape)."""
        return self.prefix_cap + self.branch_len

    def write_cache(
        self, cache: KVCache, layer: int, k: torch.Tensor, v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # every slot written: the rows themselves are the cache
        return cache.keep(layer, k, v, (self.num_requests, self.prefix_cap),
                          (self.num_branches, self.branch_len))

    def kernel_runs(self, prefix_cap: int) -> torch.Tensor | None:
        return self.runs() if self.most_keys() <= RUN_MAX_KEYS else None

    def attend_portable(
        self, q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
        branch_k: torch.Tensor, branch_v: torch.Tensor, scale: float,
    ) -> torch.Tensor:
        return grid_attention_portable(q, prefix_k, prefix_v, branch_k, branch_v, self, scale)


def grid_attention_portable(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, own_k: torch.Tensor,
    own_v: torch.Tensor, layout: ScoreGridLayout, scale: float,
) -> torch.Tensor:
    """The grid's attention on any device: q [T, H, D] in grid order; prefix caches
    [R, P, Hkv, D], candidate caches [R * C, k, Hkv, D] -> [T, H, D]."""
    n_req, cap = layout.num_requests, layout.prefix_cap
    heads, dim = q.shape[1], q.shape[2]
    qp = q[: layout.num_prefix_rows].view(n_req, cap, heads, dim).transpose(1, 2)
    out_p = attend_output(qp, prefix_k.transpose(1, 2), prefix_v.transpose(1, 2), None, True,
                          scale)
    out_p = out_p.transpose(1, 2).reshape(-1, heads, dim)
    out_c = branch_attention(q[layout.num_prefix_rows :], prefix_k, prefix_v, layout.used,
                             own_k, own_v, layout.width, causal=True, scale=scale)
    return torch.cat((out_p.to(q.dtype), out_c))
