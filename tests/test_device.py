"""``resolve_device``: ``auto`` picks CUDA when there is one, a named device stays, threads set."""

from __future__ import annotations

import torch

from genrec.utils.device import resolve_device


def test_auto_named_devices_and_threads() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    before = torch.get_num_threads()
    try:
        assert resolve_device("cpu", threads=1) == "cpu" and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
