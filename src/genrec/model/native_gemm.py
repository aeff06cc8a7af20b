"""The packed form of the fp32 weights the native CPU kernels multiply.

Two forms: oneDNN's blocked weight (``torch.ops.mkldnn._reorder_linear_weight``, the form the
PyTorch path multiplies) and MKL's packed-GEMM buffer (``genrec_cpu::mkl_pack``, multiplied by
``cblas_sgemm_compute``; see ``kernels/mkl_gemm.cpp``). Which is faster depends on the CPU and
the shape: on a 2-core Intel Xeon with AVX-512, 32-row products ran 1.3-2.1x faster through
MKL's packed form; on a 2-core AMD EPYC, MKL's plain GEMM ran at half of oneDNN's speed. And
MKL's results for a row may depend on how many rows are multiplied with it (seen for inputs of
32 or 48 columns, and under an AVX2 cap), which would make a score depend on its batch;
oneDNN's do not. So by default each weight shape is checked once per process: MKL's form is
kept where its rows come out bitwise the same for every row count checked
(:data:`CHECKED_ROWS` against :data:`REFERENCE_ROWS`) and it beats oneDNN by :data:`MARGIN` on
a product of :data:`GEMM_ROWS` rows (both timed, calls alternating). MKL's form costs memory:
its buffer holds about 7 MB beside each matrix.

``GENREC_CPU_GEMM``: ``auto`` (default), ``mkl`` or ``onednn`` (every weight in that form;
``mkl`` unchecked).
"""

from __future__ import annotations

import os
import time

import torch

from genrec.kernels import mkl_pack_op, packed_linear_op

FORMS = ("onednn", "mkl")
GEMM_ROWS = 32  # a beam step's rows at width 32: the products that decide a search's speed
MARGIN = 1.1  # MKL's form is picked where it is at least this much faster
REPEATS = 15
REFERENCE_ROWS = 300
CHECKED_ROWS = (*range(1, 25), 31, 33, 64, 97, 200)  # where MKL's results were seen to vary

_chosen: dict[tuple[int, int, int], str] = {}


def gemm_setting() -> str:
    """``GENREC_CPU_GEMM`` checked: ``auto``, ``mkl`` or ``onednn``."""
    value = os.environ.get("GENREC_CPU_GEMM", "auto")
    if value not in ("auto", *FORMS):
        raise ValueError(f"GENREC_CPU_GEMM: expected auto, mkl or onednn, got {value!r}")
    return value


def gemm_form(out_features: int, in_features: int) -> str:
    """The form (``"onednn"`` or ``"mkl"``) for an fp32 weight [out_features, in_features]
    multiplied by the native kernels: as ``GENREC_CPU_GEMM`` says, ``auto`` checked and
    measured once per process, shape and thread count; ``"onednn"`` where the kernels are not
    built."""
    setting = gemm_setting()
    if mkl_pack_op() is None:
        return "onednn"
    if setting != "auto":
        return setting
    key = (out_features, in_features, torch.get_num_threads())
    if key not in _chosen:
        _chosen[key] = _measure(out_features, in_features)
    return _chosen[key]


def pack_weight(weight: torch.Tensor, form: str) -> torch.Tensor:
    """``weight`` [N, K] in ``form``: oneDNN's blocked tensor, or MKL's packed buffer (fp32
    only; a dense tensor [N, *] that must not be copied elsewhere: MKL's layout is bound to
    its address)."""
    if form == "mkl":
        op = mkl_pack_op()
        if op is None:
            raise RuntimeError("MKL's packed form needs genrec's native CPU kernels")
        return op(weight.detach().contiguous())
    if form != "onednn":
        raise ValueError(f"unknown weight form {form!r}")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def row_invariant(packed: torch.Tensor, in_features: int) -> bool:
    """Whether products over ``packed`` give each row the same bits whatever the number of
    rows multiplied with it: :data:`CHECKED_ROWS` against one of :data:`REFERENCE_ROWS`."""
    op = packed_linear_op()
    x = torch.randn(REFERENCE_ROWS, in_features, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = op(x, packed, None)
        return all(torch.equal(op(x[:rows], packed, None), reference[:rows])
                   for rows in CHECKED_ROWS)


def _measure(n: int, k: int) -> str:
    # MKL's form where it is faster and its rows do not depend on the row count: both forms
    # of one random weight on GEMM_ROWS rows, calls alternating (the same machine state for
    # both), best of REPEATS after a warm-up; then the check, where MKL won
    g = torch.Generator().manual_seed(0)
    weight, x = torch.randn(n, k, generator=g), torch.randn(GEMM_ROWS, k, generator=g)
    op = packed_linear_op()
    with torch.inference_mode():
        packed = {form: pack_weight(weight, form) for form in FORMS}
        best = dict.fromkeys(FORMS, float("inf"))
        for _ in range(REPEATS + 1):
            for form, w in packed.items():
                start = time.perf_counter()
                op(x, w, None)
                best[form] = min(best[form], time.perf_counter() - start)
        faster = best["mkl"] * MARGIN < best["onednn"]
        return "mkl" if faster and row_invariant(packed["mkl"], k) else "onednn"
