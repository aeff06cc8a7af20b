"""A "no host sync" test mode: fail wherever the host reads tensor data.

On a GPU such a read (``item()``, ``bool(t)``, ``nonzero``, a mask index, ``tolist()``...) is
a device-to-host sync: it stalls the pipeline and breaks CUDA-graph capture. On every device
:func:`no_host_sync` raises :class:`HostSyncError` on them (so the CPU emulates a device: data
made in the block from Python numbers is trapped too); on CUDA it also sets
``torch.cuda.set_sync_debug_mode("error")``, which sees blocking copies too. State is per
thread (CUDA's debug mode excepted).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SCALAR, _SHAPE = "Tensor.item / int() / float() / bool() of a tensor", "data-dependent shape"
_ALWAYS = {  # op packets always trapped: what the host reads
    "_local_scalar_dense": _SCALAR, "item": _SCALAR, "is_nonzero": "bool() of a tensor",
    "equal": "a Python bool", "allclose": "a Python bool", "nonzero": _SHAPE,
    "nonzero_numpy": _SHAPE, "argwhere": _SHAPE, "masked_select": _SHAPE, "_unique": _SHAPE,
    "_unique2": _SHAPE, "unique_dim": _SHAPE, "unique_consecutive": _SHAPE,
    "unique_dim_consecutive": _SHAPE, "bincount": _SHAPE,
    "_linalg_check_errors": "linalg error check reads info",
}
_TRAPPED = {getattr(torch.ops.aten, name): why for name, why in _ALWAYS.items()}
_TENSOR_READS = {"tolist": "Python lists of the data", "numpy": "a NumPy view of the data"}
_OWN = {name: torch.Tensor.__dict__.get(name) for name in _TENSOR_READS}
_patch_lock, _patch_users = threading.Lock(), 0
_NULL = contextlib.nullcontext()


class HostSyncError(RuntimeError):
    """A read of tensor data by the host inside :func:`no_host_sync`."""


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[str] = []  # "trap", "allow" or "host", innermost last
        self.mode: _TrapMode | None = None
        self.cuda_base = 0  # CUDA sync debug mode before the outermost trap


_tls = _State()


def _top() -> str:
    return _tls.stack[-1] if _tls.stack else ""


def _conditional(func: Any, args: tuple, kwargs: dict) -> str | None:
    # overloads that read the data only with some arguments
    aten, name = torch.ops.aten, func.overloadpacket
    if name is aten.repeat_interleave and func is not aten.repeat_interleave.self_int:
        return None if kwargs.get("output_size") is not None else "repeats without output_size"
    if name in (aten.index, aten.index_put, aten.index_put_) and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
        return "boolean mask index: " + _SHAPE
    if func in (aten.where.default, aten.narrow.Tensor):
        return _SHAPE if func is aten.where.default else "reads its tensor start"
    return None


@functools.cache
def _composite(func: Any) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


class _TrapMode(TorchDispatchMode):
    """Raises on reads; other ops run unchanged, composite ones decomposed under the mode (as
    autograd's dispatch does outside inference mode) so that reads inside them are seen."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _top() != "trap":
            return func(*args, **kwargs)
        why = _TRAPPED.get(func.overloadpacket) or _conditional(func, args, kwargs)
        if why:
            raise HostSyncError(f"{func.overloadpacket} ({why}) inside no_host_sync(); wrap "
                                "a legitimate read in allow_host_sync()")
        if _composite(func):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _reader(name: str, original: Any) -> Any:
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _top() == "trap":
            raise HostSyncError(f"Tensor.{name} ({_TENSOR_READS[name]}) inside no_host_sync()")
        return original(self, *args, **kwargs)

    return read


def _patch(on: bool) -> None:
    # Tensor.tolist / numpy read without dispatch: patched while a thread is in a trap
    global _patch_users
    with _patch_lock:
        _patch_users += 1 if on else -1
        for name, own in _OWN.items() if _patch_users == int(on) else ():
            if on:
                setattr(torch.Tensor, name, _reader(name, getattr(torch.Tensor, name)))
            elif own is None:  # back to the inherited method
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)


def _apply_cuda() -> None:
    # CUDA's own check: on under a trap or host_side, the mode before the trap otherwise
    if _tls.mode is not None and torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode(2 if _top() in ("trap", "host") else _tls.cuda_base)


@contextlib.contextmanager
def _push(kind: str) -> Iterator[None]:
    _tls.stack.append(kind)
    _apply_cuda()
    try:
        yield
    finally:
        _tls.stack.pop()
        _apply_cuda()


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Raise :class:`HostSyncError` on host reads of tensor data inside the block (see the
    module docstring). Nests; everything is restored on exit, also on an exception."""
    outer = _tls.mode is None
    if outer:
        _tls.cuda_base = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
        _tls.mode = _TrapMode().__enter__()
        _patch(True)
    try:
        with _push("trap"):
            yield
    finally:
        if outer:  # (leaving "trap" restored CUDA's mode)
            mode, _tls.mode = _tls.mode, None
            _patch(False)
            mode.__exit__(None, None, None)


def allow_host_sync() -> contextlib.AbstractContextManager[None]:
    """Lift :func:`no_host_sync` (CUDA's check included) inside the block, e.g. for the copy
    of a final result; the trap is back on exit. A no-op outside a trap."""
    return _push("allow")


def host_side() -> contextlib.AbstractContextManager[None]:
    """Mark a block that works on host tensors only: the CPU emulation is lifted there (it
    cannot tell host tensors from device ones), CUDA's check stays on. Cheap outside a trap."""
    return _NULL if _tls.mode is None else _push("host")
