"""Device-resident item-representation table read through virtual token ids."""

from __future__ import annotations

import torch


class ItemTable:
    """k vectors per item, [num_items, k, hidden], on the model's device.

    Item i's j-th vector is virtual token ``vocab_size + i * k + j``. The table is immutable;
    updates build a new table and swap the reference (see later catalog work), so a request
    always reads one consistent version. ``active`` [num_items] marks items that may be read;
    retired items keep their rows (ids stay stable) but :meth:`item_tokens` rejects them.
    """

    def __init__(
        self, vectors: torch.Tensor, version: int = 0, active: torch.Tensor | None = None
    ) -> None:
        if vectors.dim() != 3:
            shape = tuple(vectors.shape)
            raise ValueError(f"item table must be [num_items, k, hidden], got {shape}")
        if not torch.isfinite(vectors).all():
            raise ValueError("item table contains NaN or infinite values")
        if active is not None and active.shape != (vectors.shape[0],):
            raise ValueError(f"active must be [{vectors.shape[0]}], got {tuple(active.shape)}")
        self.vectors = vectors
        self.version = version
        self.active = active.to(device="cpu", dtype=torch.bool) if active is not None else None

    @property
    def num_items(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def tokens_per_item(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.vectors.shape[2])

    @property
    def num_rows(self) -> int:
        return self.num_items * self.tokens_per_item

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Vectors of flat rows ``item * k + j``: [N] -> [N, hidden]."""
        return self.vectors.view(-1, self.hidden_size)[rows]

    def item_tokens(self, item_ids: torch.Tensor | list[int], vocab_size: int) -> torch.Tensor:
        """Virtual token ids of items: [N] -> [N, k]."""
        items = torch.as_tensor(item_ids, dtype=torch.long)
        if items.numel() and (int(items.min()) < 0 or int(items.max()) >= self.num_items):
            bad = items[(items < 0) | (items >= self.num_items)][0].item()
            raise ValueError(f"item id {bad} is outside the item table (0..{self.num_items - 1})")
        self.check_active(items)
        k = self.tokens_per_item
        return vocab_size + items[:, None] * k + torch.arange(k)[None, :]

    def check_active(self, items: torch.Tensor) -> None:
        """Raise ValueError when one of ``items`` (valid ids) is retired."""
        if self.active is None or not items.numel():
            return
        retired = ~self.active[items]
        if bool(retired.any()):
            raise ValueError(f"item id {int(items[retired][0])} is retired from the catalog")

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> ItemTable:
        return ItemTable(self.vectors.to(device=device, dtype=dtype), self.version, self.active)
