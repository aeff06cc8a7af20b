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


def test_to_device_keeps_a_tensor_where_it_is_and_copies_it_elsewhere() -> None:
    import torch

    from genrec.utils.device import to_device

    t = torch.arange(3)
    assert to_device(t, "cpu") is t
    if torch.cuda.is_available():  # the pinned, asynchronous copy
        moved = to_device(t, "cuda")
        assert moved.device.type == "cuda" and moved.cpu().tolist() == [0, 1, 2]
