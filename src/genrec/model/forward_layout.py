"""What a decoder forward needs from its attention layout.

Three layouts describe a forward: :class:`~genrec.model.packed_layout.AttentionLayout` (packed
prefixes and branches of any lengths), :class:`~genrec.model.beam_step.BeamStepLayout` (one
token per beam, tails read through an ancestry table) and
:class:`~genrec.model.score_grid.ScoreGridLayout` (a fixed scoring grid). Each implements
:class:`ForwardLayout`: where the new keys and values go in the cache, how its queries attend
(the native cascade kernel's query runs, or a portable path), and the tables of the native
layer stack where it has one. The decoder, the cache and the native layers use this interface
only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from genrec.model.attention import QueryTransform, native_applies, native_attention
from genrec.model.kv_cache import KVCache


@dataclass(frozen=True)
class NativeTables:
    """A layout's side of the native layer stack (``genrec_cpu::decoder_layers``).

    A packed forward gives ``write_rows`` (the prefix cache slot of each row) and ``tasks``
    (its query runs); a beam step gives ``prefix_len``, ``ancestry``, ``width`` and ``level``
    (the kernel derives the runs, slots and positions from them)."""

    write_rows: torch.Tensor | None = None
    tasks: torch.Tensor | None = None
    prefix_len: torch.Tensor | None = None
    ancestry: torch.Tensor | None = None
    width: int = 0
    level: int = 0


class ForwardLayout(ABC):
    """The attention layout of one decoder forward (see the module docstring).

    ``num_tokens``: the packed query rows of the forward (every layout has it)."""

    num_tokens: int
    # True: the layout has its own positions (``own_positions``), a forward may omit them
    derives_positions: ClassVar[bool] = False

    def own_positions(self) -> torch.Tensor:
        """[T] the position of each row, where ``derives_positions``."""
        raise ValueError(f"{type(self).__name__} needs explicit positions")

    @abstractmethod
    def write_cache(
        self, cache: KVCache, layer: int, k: torch.Tensor, v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store the new keys/values of ``layer`` (k, v: [T, Hkv, D]) in ``cache``; return the
        layer's cache: prefix k, prefix v [R, P, Hkv, D], branch k, branch v."""

    @abstractmethod
    def kernel_runs(self, prefix_cap: int) -> torch.Tensor | None:
        """The native kernel's query runs (int64 [runs, 7], see
        ``AttentionLayout.query_runs``) over a prefix cache of ``prefix_cap`` slots per
        request; None where a run would see more keys than the kernel takes."""

    def kernel_caches(self, caches: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The (prefix k, prefix v, branch k, branch v) the kernel's runs index: ``caches``
        themselves unless the layout reads its branch keys indirectly."""
        return caches

    @abstractmethod
    def attend_portable(
        self, q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
        branch_k: torch.Tensor, branch_v: torch.Tensor, scale: float,
    ) -> torch.Tensor:
        """Attention of normed, rotated queries q [T, H, D] on any device -> [T, H, D]."""

    def native_tables(self, prefix_capacity: int, readout: bool) -> NativeTables | None:
        """The tables of the native layer stack over a cache of ``prefix_capacity`` slots per
        request (``readout``: only some rows' hidden states are returned); None where the
        stack does not run this layout."""
        return None

    def attend(
        self, q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
        branch_k: torch.Tensor, branch_v: torch.Tensor, scale: float,
        q_transform: QueryTransform | None = None,
    ) -> torch.Tensor:
        """Attention of the packed queries ``q`` [T, H, D] under this layout -> [T, H, D].
        With ``q_transform``, ``q`` is raw and the transform is applied first.

        CPU fp32 / bf16 inference runs the native cascade kernel (:mod:`genrec.kernels`) where
        it is built: one pass per run of query rows over its prefix and its own keys.
        Elsewhere :meth:`attend_portable`."""
        caches = (prefix_k, prefix_v, branch_k, branch_v)
        if native_applies(q, caches):
            runs = self.kernel_runs(prefix_k.shape[1])
            if runs is not None:
                return native_attention(q, self.kernel_caches(caches), runs, scale,
                                        q_transform)
        if q_transform is not None:
            q = q_transform.apply(q)
        return self.attend_portable(q, prefix_k, prefix_v, branch_k, branch_v, scale)
