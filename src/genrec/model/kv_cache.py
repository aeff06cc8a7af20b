"""The KV cache of a prefix + branches forward: one prefix per request, one tail per branch."""

from __future__ import annotations

from typing import NamedTuple

import torch


class RowWrite(NamedTuple):
    """New rows of one cache part: packed rows ``tokens`` [N] (rows ``first ..`` when the
    write is contiguous) go to flat slots ``slots`` [N] of the prefix part (``prefix``) or the
    branch part; ``fills``: those slots are the whole part, 0, 1, ... in packed order."""

    prefix: bool
    tokens: torch.Tensor
    slots: torch.Tensor
    first: int
    fills: bool


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

    def keep(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, prefix: tuple[int, int],
        branch: tuple[int, int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Make k, v [T, Hkv, D] the whole storage of ``layer``: the first ``prefix`` (R, P)
        rows its prefix part, the rest its branch part of ``branch`` (NB, L) rows; returns the
        layer's cache."""
        n_p = prefix[0] * prefix[1]
        for store, src, dims in ((self.prefix_k, k[:n_p], prefix),
                                 (self.prefix_v, v[:n_p], prefix),
                                 (self.branch_k, k[n_p:], branch),
                                 (self.branch_v, v[n_p:], branch)):
            store[layer] = src.to(self._dtype).contiguous().view(dims + self._row)
        return (self.prefix_k[layer], self.prefix_v[layer], self.branch_k[layer],
                self.branch_v[layer])

    def write_slot(
        self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write k, v [NB, Hkv, D] into slot ``slot`` of every branch row of ``layer``, in
        place (static buffers); returns the layer's cache."""
        self._layer(self.branch_k, layer, False)[:, slot].copy_(k)
        self._layer(self.branch_v, layer, False)[:, slot].copy_(v)
        return (self.prefix_k[layer], self.prefix_v[layer], self.branch_k[layer],
                self.branch_v[layer])

    def write_rows(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, parts: tuple[RowWrite, ...],
        contiguous: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store rows of k, v [T, Hkv, D] of ``layer`` as ``parts`` say (``contiguous``: each
        part's rows are ``first ..``, read as slices); returns the layer's cache. A transient
        cache keeps a part's rows themselves where they fill it; writes under autograd go out
        of place."""
        for prefix, tokens, slots, first, fills in parts:
            if not tokens.numel():
                continue
            dims = self._prefix_dims if prefix else self._branch_dims
            stores = (self.prefix_k, self.prefix_v) if prefix else (self.branch_k, self.branch_v)
            for store, src in zip(stores, (k, v), strict=True):
                rows = take_rows(src, tokens, first if contiguous else None)
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
