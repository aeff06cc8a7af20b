"""The KV cache of a prefix + branches forward: one prefix per request, one tail per branch."""

from __future__ import annotations

import torch

from genrec.model.beam_step import BeamStepLayout
from genrec.model.layout import AttentionLayout
from genrec.model.score_grid import ScoreGridLayout


class KVCache:
    """Keys and values of every layer: one prefix per request, one short tail per branch.

    Shapes per layer: prefix [R, prefix_cap, Hkv, D], branch [NB, branch_cap, Hkv, D].
    A persistent cache (beam search) is zero-filled up front and updated in place; in a search
    its branch part holds each beam row's tail slots, read through an ancestry table
    (:mod:`genrec.model.beam_step`), so beams never move. A ``transient`` one (scoring:
    dropped after the forward) gets a layer's storage when it is first written: a write that
    fills a part entirely keeps the new rows themselves (the branch keys as a view of k, no
    copy and no zero fill); other writes go out of place under autograd so training can
    backpropagate through the cache.
    """

    def __init__(
        self, num_layers: int, num_requests: int, prefix_cap: int, num_branches: int,
        branch_cap: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
        device: torch.device | str, transient: bool = False,
    ) -> None:
        self.transient = transient
        self._row, self._dtype, self._device = (kv_heads, head_dim), dtype, device
        self._prefix_dims, self._branch_dims = (num_requests, prefix_cap), (num_branches,
                                                                           branch_cap)
        self.prefix_k = self._storage(num_layers, self._prefix_dims)
        self.prefix_v = self._storage(num_layers, self._prefix_dims)
        self.branch_k = self._storage(num_layers, self._branch_dims)
        self.branch_v = self._storage(num_layers, self._branch_dims)

    @property
    def prefix_capacity(self) -> int:
        """Cache slots per request prefix."""
        return self._prefix_dims[1]

    def nbytes(self) -> int:
        """Bytes of the layers' storage allocated so far."""
        return sum(t.numel() * t.element_size() for store in (
            self.prefix_k, self.prefix_v, self.branch_k, self.branch_v) for t in store
            if t is not None)

    def _storage(self, num_layers: int, dims: tuple[int, int]) -> list[torch.Tensor | None]:
        if self.transient:
            return [None] * num_layers
        return [self._zeros(dims) for _ in range(num_layers)]

    def _zeros(self, dims: tuple[int, int]) -> torch.Tensor:
        return torch.zeros(dims + self._row, dtype=self._dtype, device=self._device)

    def _layer(self, store: list[torch.Tensor | None], layer: int, prefix: bool) -> torch.Tensor:
        if store[layer] is None:
            store[layer] = self._zeros(self._prefix_dims if prefix else self._branch_dims)
        return store[layer]

    def layer_caches(self, layer: int) -> tuple[torch.Tensor, ...]:
        """The storage of ``layer`` (allocated, zero-filled, where not yet): prefix k, prefix
        v [R, prefix_cap, Hkv, D], branch k, branch v [NB, branch_cap, Hkv, D]."""
        return (self._layer(self.prefix_k, layer, True), self._layer(self.prefix_v, layer, True),
                self._layer(self.branch_k, layer, False),
                self._layer(self.branch_v, layer, False))

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor,
        layout: AttentionLayout | BeamStepLayout | ScoreGridLayout,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store the new keys/values of ``layer`` (k, v: [T, Hkv, D]); return the layer's cache.
        A beam step writes slot ``level - 1`` of every beam row (in place: static buffers); a
        score grid fills both parts (its rows are the cache)."""
        if isinstance(layout, ScoreGridLayout):  # every slot written: the rows themselves
            n_p = layout.num_prefix_rows
            prefix = (layout.num_requests, layout.prefix_cap)
            branch = (layout.num_branches, layout.branch_len)
            for store, src, dims in ((self.prefix_k, k[:n_p], prefix),
                                     (self.prefix_v, v[:n_p], prefix),
                                     (self.branch_k, k[n_p:], branch),
                                     (self.branch_v, v[n_p:], branch)):
                store[layer] = src.to(self._dtype).contiguous().view(dims + self._row)
            return (self.prefix_k[layer], self.prefix_v[layer], self.branch_k[layer],
                    self.branch_v[layer])
        if isinstance(layout, BeamStepLayout):
            slot = layout.level - 1
            self._layer(self.branch_k, layer, False)[:, slot].copy_(k)
            self._layer(self.branch_v, layer, False)[:, slot].copy_(v)
            return (self.prefix_k[layer], self.prefix_v[layer], self.branch_k[layer],
                    self.branch_v[layer])
        n_prefix = layout.prefix_tokens.numel()
        single = layout.single_request  # rows are [0, Tp) then [Tp, T): slices, no gather
        # fills: every slot of the part is written at once (slots 0, 1, ... in packed order)
        parts = (
            (True, layout.prefix_tokens, layout.prefix_slots, 0, (self.prefix_k, self.prefix_v),
             layout.prefix_dense and layout.prefix_causal
             and layout.prefix_width == layout.prefix_cap),
            (False, layout.branch_tokens, layout.branch_slots, n_prefix,
             (self.branch_k, self.branch_v), layout.uniform_branches and layout.branch_causal
             and layout.branch_width == layout.branch_cap),
        )
        for prefix, tokens, slots, first, stores, fills in parts:
            if not tokens.numel():
                continue
            dims = self._prefix_dims if prefix else self._branch_dims
            for store, src in zip(stores, (k, v), strict=True):
                rows = take_rows(src, tokens, first if single else None)
                if self.transient and fills and rows.shape[0] == dims[0] * dims[1]:
                    # compact rows (k is a view of the fused projection's output): the
                    # kernels read them faster, and a kept prefix holds no more than itself
                    store[layer] = rows.to(self._dtype).contiguous().view(dims + self._row)
                else:
                    store[layer] = _write(self._layer(store, layer, prefix), slots, rows)
        return self.layer_caches(layer)

    def reset_branches(self, num_branches: int, branch_cap: int) -> None:
        """Fresh (zeroed) branch storage; the cached prefixes stay."""
        self._branch_dims = (num_branches, branch_cap)
        for store in (self.branch_k, self.branch_v):
            store[:] = self._storage(len(store), self._branch_dims)

    def requests(self, start: int, end: int) -> KVCache:
        """A cache over requests ``start..end-1`` only: their prefixes are views of this
        cache's (shared, not copied); the branch part is empty (see :meth:`reset_branches`)."""
        view = KVCache.__new__(KVCache)
        view.__dict__.update(self.__dict__)
        view._prefix_dims = (end - start, self._prefix_dims[1])
        view._branch_dims = (0, self._branch_dims[1])
        view.prefix_k = [self._layer(self.prefix_k, i, True)[start:end]
                         for i in range(len(self.prefix_k))]
        view.prefix_v = [self._layer(self.prefix_v, i, True)[start:end]
                         for i in range(len(self.prefix_v))]
        view.branch_k = view._storage(len(self.branch_k), view._branch_dims)
        view.branch_v = view._storage(len(self.branch_v), view._branch_dims)
        return view


def _write(cache: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if slots.numel() == 0:
        return cache
    flat = cache.view((-1,) + tuple(cache.shape[2:]))
    if torch.is_grad_enabled() and src.requires_grad:
        return flat.index_copy(0, slots, src.to(cache.dtype)).view(cache.shape)
    flat.index_copy_(0, slots, src.to(cache.dtype))
    return cache


def take_rows(x: torch.Tensor, index: torch.Tensor, start: int | None) -> torch.Tensor:
    """x[index], or a view when the rows are known to be contiguous from ``start``."""
    return x[start : start + index.numel()] if start is not None else x[index]
