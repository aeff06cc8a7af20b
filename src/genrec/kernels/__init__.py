"""Optional native CPU kernels, compiled on first use with the machine's C++ compiler.

:func:`cascade_attention_op` returns the compiled cascade attention op (see
``cascade_attention.cpp``), :func:`decoder_layers_op` the decoder's layers in one call
(``decoder_layers.cpp``), :func:`range_logprobs_op` a level's log-probabilities
(``lm_head.cpp``), :func:`trie_expand_op` a sparse trie level's edges (``trie_expand.cpp``),
:func:`beam_select_op` a search level's choice of beams (``beam_select.cpp``),
:func:`mkl_pack_op` and :func:`packed_linear_op` weights in MKL's packed-GEMM form and products
over either packed form (``mkl_gemm.cpp``); each is None where the kernels are unavailable, in
which case callers use their portable PyTorch path. All live in one shared library, built once
per source, torch version and CPU, under
``$GENREC_KERNEL_CACHE`` (default ``~/.cache/genrec/kernels``), written to a temporary file
and renamed into place (concurrent processes may build it at the same time).
``GENREC_CPU_KERNELS=0`` disables the kernels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from genrec.utils.cpu import aten_capability, cpu_features, kernel_march

log = logging.getLogger(__name__)

_SOURCES = tuple(Path(__file__).with_name(n) for n in (
    "cascade_attention.cpp", "beam_attention.cpp", "decoder_layers.cpp", "lm_head.cpp",
    "trie_expand.cpp", "mkl_gemm.cpp", "beam_select.cpp"))
_HEADERS = (Path(__file__).with_name("kernel_math.h"),)
_state: dict[str, Callable[..., torch.Tensor] | None] = {}


def _flags() -> list[str]:
    # the instruction set genrec detected (not -march=native: the compiler's host may differ
    # from the CPU torch runs on, under an emulator or a GENREC_CPU_ISA cap)
    cap = aten_capability()  # ATen's vector headers: AVX512, AVX2 or DEFAULT
    flags = ["-O3", *kernel_march(), "-fopenmp", "-shared", "-fPIC", "-std=c++17",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    if cap != "DEFAULT":
        flags += [f"-DCPU_CAPABILITY={cap}", f"-DCPU_CAPABILITY_{cap}"]
    return flags


def _build(compiler: str) -> Path:
    from torch.utils.cpp_extension import include_paths, library_paths

    flags = _flags()
    source = b"".join(p.read_bytes() for p in _SOURCES + _HEADERS)
    # one build per source, flags, torch, compiler and CPU (a shared home directory may serve
    # machines of several kinds)
    key = hashlib.sha256(source + " ".join(
        flags + [torch.__version__, compiler, cpu_features().describe()]).encode())
    cache = Path(os.environ.get("GENREC_KERNEL_CACHE",
                                Path.home() / ".cache" / "genrec" / "kernels"))
    target = cache / f"genrec_cpu-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    log.info("building genrec's CPU attention kernel for %s into %s (once per machine)",
             cpu_features().describe(), cache)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        built = Path(tmp) / target.name
        cmd = [compiler, *flags, *(f"-I{p}" for p in include_paths()), *(str(p) for p in _SOURCES),
               "-o", str(built), *(f"-L{p}" for p in library_paths()), "-ltorch_cpu", "-lc10"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        os.replace(built, target)
    return target


def _load() -> bool:
    # build and load the library once; False where it is disabled or cannot be built
    if "loaded" not in _state:
        ok = False
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        if (os.environ.get("GENREC_CPU_KERNELS", "1") != "0"
                and sys.platform.startswith("linux") and compiler
                and torch.backends.mkl.is_available()):
            try:
                torch.ops.load_library(str(_build(compiler)))
                ok = True
            except Exception as exc:  # no usable compiler or BLAS: the PyTorch path serves
                log.warning("genrec CPU kernels unavailable, using the PyTorch path: %s", exc)
        _state["loaded"] = ok  # type: ignore[assignment]
    return bool(_state["loaded"])


def cascade_attention_op() -> Callable[..., torch.Tensor] | None:
    """The native op ``(q, shared_k, shared_v, branch_k, branch_v, tasks, scale) -> out``,
    built and loaded on the first call; None where it is disabled or cannot be built."""
    return torch.ops.genrec_cpu.cascade_attention if _load() else None


def range_logprobs_op() -> Callable[..., torch.Tensor] | None:
    """The native op ``(hidden, packed head slices, slice rows, offset, size) -> [N, size]``:
    full-vocabulary log-probabilities of one token range in one call (see ``lm_head.cpp``);
    None where the kernels are disabled or cannot be built, or ``GENREC_NATIVE_LAYERS=0``."""
    if os.environ.get("GENREC_NATIVE_LAYERS", "1") == "0":
        return None
    return torch.ops.genrec_cpu.range_logprobs if _load() else None


def trie_expand_op() -> Callable[..., torch.Tensor] | None:
    """The native op ``(nodes, row_ptr, codes, k) -> edges [..., k]`` of a sparse trie level
    (see ``trie_expand.cpp``); None where the kernels are disabled or cannot be built."""
    return torch.ops.genrec_cpu.trie_expand if _load() else None


def trie_expand_dense_op() -> Callable[..., torch.Tensor] | None:
    """The native op ``(nodes, table) -> edges [..., k]`` of a dense trie level (see
    ``trie_expand.cpp``); None where the kernels are disabled or cannot be built."""
    return torch.ops.genrec_cpu.trie_expand_dense if _load() else None


def beam_select_op() -> Callable[..., list[torch.Tensor]] | None:
    """The native op ``(logp [R*B, K], scores [R, B], edges per part [R, B, K], width) ->
    [top, parent, code, *chosen edges per part]`` (see ``beam_select.cpp``); None where the
    kernels are disabled or cannot be built."""
    return torch.ops.genrec_cpu.beam_select if _load() else None


def decoder_layers_op() -> Callable[..., torch.Tensor] | None:
    """The native op running every decoder layer of a CPU fp32 forward in one call (see
    ``decoder_layers.cpp`` and :mod:`genrec.model.native_layers`); None where the kernels
    are disabled or cannot be built, or ``GENREC_NATIVE_LAYERS=0``."""
    if os.environ.get("GENREC_NATIVE_LAYERS", "1") == "0":
        return None
    return torch.ops.genrec_cpu.decoder_layers if _load() else None


def mkl_pack_op() -> Callable[..., torch.Tensor] | None:
    """The native op ``(weight [N, K] fp32) -> MKL's packed form of it`` (see
    ``mkl_gemm.cpp``); None where the kernels are disabled or cannot be built."""
    return torch.ops.genrec_cpu.mkl_pack if _load() else None


def packed_linear_op() -> Callable[..., torch.Tensor] | None:
    """The native op ``(x [M, K], packed weight, bias or None) -> [M, N]`` for a weight in
    either packed form (oneDNN's or MKL's), as the native layers multiply; None where the
    kernels are disabled or cannot be built."""
    return torch.ops.genrec_cpu.packed_linear if _load() else None
