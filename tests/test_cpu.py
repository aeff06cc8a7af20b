"""CPU feature detection: levels, GENREC_CPU_ISA caps, the bf16 path and the kernel's flags."""

from __future__ import annotations

import logging

import pytest
import torch

from genrec.utils import cpu
from genrec.utils.cpu import (
    ISA_LEVELS,
    CpuFeatures,
    aten_capability,
    bf16_products_native,
    cap_features,
    cpu_features,
    detect_cpu,
    kernel_march,
)

pytestmark = pytest.mark.numerics

FULL = CpuFeatures(machine="x86_64", name="test CPU", avx2=True, avx512=True,
                   avx512_bf16=True, amx_bf16=True, onednn_bf16=True)


def test_detection_agrees_with_torch() -> None:
    found = detect_cpu()
    assert found.name and found.capped is None
    if found.machine in ("x86_64", "amd64"):
        assert found.avx2 == torch.cpu._is_avx2_supported()
        assert found.avx512 == torch.cpu._is_avx512_supported()
        assert found.onednn_bf16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert found.level in ISA_LEVELS


@pytest.mark.parametrize("level", ISA_LEVELS)
def test_caps_only_remove_features(level: str) -> None:
    capped = cap_features(FULL, level)
    assert capped.level == level and capped.capped == level
    assert capped.onednn_bf16 == (ISA_LEVELS.index(level) >= 2)
    # a cap never adds what the CPU lacks
    bare = CpuFeatures(machine="x86_64", name="old CPU")
    assert cap_features(bare, level).level == "baseline"
    assert level in capped.describe()


def test_unknown_cap_is_refused(cpu_isa) -> None:
    cpu_isa("avx9000")
    with pytest.raises(ValueError, match="GENREC_CPU_ISA"):
        cpu_features()


def test_forced_native_bf16_on_an_avx2_cpu_warns_once_and_widens(
    cpu_isa, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cpu_isa("avx2")
    cpu._warn_once.cache_clear()
    monkeypatch.setenv("GENREC_BF16_COMPUTE", "native")
    with caplog.at_level(logging.WARNING, logger="genrec.utils.cpu"):
        assert not bf16_products_native()
        assert not bf16_products_native()
    warned = [r for r in caplog.records if "GENREC_BF16_COMPUTE=native" in r.message]
    assert len(warned) == 1 and "AVX-NE-CONVERT" in warned[0].message


def test_bf16_modes(cpu_isa, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENREC_BF16_COMPUTE", "fp32")
    assert not bf16_products_native()
    monkeypatch.setenv("GENREC_BF16_COMPUTE", "auto")
    assert bf16_products_native() == cpu_features().bf16_native
    cpu_isa("avx512")  # AVX-512 without bf16 instructions: widened by default
    assert not bf16_products_native()
    monkeypatch.setenv("GENREC_BF16_COMPUTE", "native")
    assert bf16_products_native() == detect_cpu().onednn_bf16
    monkeypatch.setenv("GENREC_BF16_COMPUTE", "bogus")
    assert not bf16_products_native()  # unknown value: warned, treated as auto


@pytest.mark.parametrize("level", ["avx2", "baseline"])
def test_kernel_flags_follow_the_cap(cpu_isa, level: str) -> None:
    if detect_cpu().machine not in ("x86_64", "amd64"):
        pytest.skip("x86-64 instruction-set flags")
    cpu_isa(level)
    flags = kernel_march()
    assert "-march=native" not in flags
    assert ("-march=x86-64-v3" in flags) == (level == "avx2" and detect_cpu().avx2)
    assert "AVX512" not in aten_capability()
    if level == "baseline":
        assert aten_capability() == "DEFAULT"
