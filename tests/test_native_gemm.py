"""The packed weight forms of the native CPU products (oneDNN's and MKL's packed GEMM): equal
to a float64 product for any row count, bias or row stride; the form chosen per shape as
``GENREC_CPU_GEMM`` says, measured once per process under ``auto``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import genrec.kernels as kernels
import genrec.model.native_gemm as native_gemm
from genrec.model.native_gemm import FORMS, gemm_form, gemm_setting, pack_weight, row_invariant

pytestmark = pytest.mark.numerics


def _op():
    op = kernels.packed_linear_op()
    if op is None:
        pytest.skip("the native CPU kernels are not built here (no C++ compiler or MKL)")
    return op


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [0, 1, 7, 32, 97])
@pytest.mark.parametrize(("n", "k"), [(512, 256), (1027, 96), (5, 3)])
def test_products_equal_float64(form: str, rows: int, n: int, k: int) -> None:
    op = _op()
    g = torch.Generator().manual_seed(rows * 7 + n)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    wide = torch.randn(rows, 2 * k, generator=g)
    packed = pack_weight(w, form)
    for x in (wide[:, :k].contiguous(), wide[:, k:]):  # contiguous, and rows 2k apart
        for bias in (None, b):
            with torch.inference_mode():
                got = op(x, packed, bias)
            ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            assert got.shape == (rows, n) and got.dtype == torch.float32
            if rows:
                assert (got.double() - ref).abs().max().item() < 1e-4 * (1 + k ** 0.5)


def test_mkl_form_refuses_inputs_of_another_width() -> None:
    op = _op()
    packed = pack_weight(torch.randn(64, 256), "mkl")
    with pytest.raises(RuntimeError, match="packed for inputs of 256 columns, not 512"):
        op(torch.randn(4, 512), packed, None)
    with pytest.raises(RuntimeError, match="not an MKL-packed weight"):
        op(torch.randn(4, 256), torch.randn(64, 256), None)


def test_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENREC_CPU_GEMM", "fast")
    with pytest.raises(ValueError, match="GENREC_CPU_GEMM"):
        gemm_setting()
    with pytest.raises(ValueError, match="unknown weight form"):
        pack_weight(torch.randn(4, 4), "fast")


def test_forced_forms_and_auto_measured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _op()
    for form in FORMS:
        monkeypatch.setenv("GENREC_CPU_GEMM", form)
        assert gemm_form(48, 32) == form
    monkeypatch.setenv("GENREC_CPU_GEMM", "auto")
    measured: list[tuple[int, int]] = []
    real = native_gemm._measure

    def counted(n: int, k: int) -> str:
        measured.append((n, k))
        return real(n, k)

    monkeypatch.setattr(native_gemm, "_measure", counted)
    monkeypatch.setattr(native_gemm, "_chosen", {})
    first = gemm_form(48, 32)
    assert first in FORMS
    assert [gemm_form(48, 32) for _ in range(3)] == [first] * 3
    gemm_form(64, 32)
    assert measured == [(48, 32), (64, 32)]


def test_without_kernels_the_form_is_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "mkl_pack_op", lambda: None)
    monkeypatch.setenv("GENREC_CPU_GEMM", "mkl")
    assert gemm_form(48, 32) == "onednn"
    with pytest.raises(RuntimeError, match="native CPU kernels"):
        pack_weight(torch.randn(4, 4), "mkl")


@pytest.mark.parametrize(("n", "k"), [(48, 32), (96, 48), (256, 128), (256, 256)])
def test_auto_keeps_mkl_only_where_a_row_does_not_depend_on_the_batch(
    n: int, k: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a score must not depend on its batch: MKL's products of some shapes (few input columns,
    # or under an AVX2 cap) give a row other bits with another row count; oneDNN's never
    _op()
    monkeypatch.setenv("GENREC_CPU_GEMM", "auto")
    monkeypatch.setattr(native_gemm, "_chosen", {})
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n))
    assert row_invariant(pack_weight(w, "onednn"), k)
    if gemm_form(n, k) == "mkl":
        assert row_invariant(pack_weight(w, "mkl"), k)
