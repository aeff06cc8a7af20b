"""The torch device a command or server runs on."""

from __future__ import annotations


def resolve_device(device: str, threads: int | None = None) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; sets torch's CPU threads if given."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
