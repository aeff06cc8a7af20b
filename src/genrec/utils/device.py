"""The torch device a command or server runs on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(device: str, threads: int | None = None) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; sets torch's CPU threads if given."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a host tensor goes to a GPU through pinned memory, as an
    asynchronous copy on the current stream (a plain copy from pageable memory blocks the
    host until the stream gets there)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
