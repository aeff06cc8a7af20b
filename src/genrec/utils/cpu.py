"""What the CPU can do, detected once: decides genrec's bf16 path and the native kernel's flags.

genrec never assumes an instruction set. Detection reads the CPU itself (through torch's
cpuid probes and oneDNN's own bf16 check), so it is right under emulators and containers too.

``GENREC_CPU_ISA`` caps what genrec uses, for tests and for machines where a path misbehaves:
``avx2`` (as a CPU with AVX2 only), ``avx512`` (AVX-512 without bf16 instructions),
``avx512-bf16``, ``amx``, or ``baseline`` (no AVX2). A cap never enables what the CPU lacks.
It changes genrec's own choices (the bf16 path, the kernel's compile flags); oneDNN and ATen
have their own caps (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``).

``GENREC_BF16_COMPUTE`` picks how bf16 models multiply on the CPU: ``auto`` (default: bf16
products where the CPU has bf16 instructions, fp32 products elsewhere), ``fp32`` (always
widen) or ``native`` (bf16 products wherever oneDNN can run them; on a CPU where it cannot,
genrec warns once and widens).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass, replace

import torch

log = logging.getLogger(__name__)

# instruction-set levels, lowest first; a GENREC_CPU_ISA cap names one of them
ISA_LEVELS = ("baseline", "avx2", "avx512", "avx512-bf16", "amx")
BF16_MODES = ("auto", "fp32", "native")


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction sets genrec cares about (x86-64; all False elsewhere).

    ``avx512``: AVX-512 F, BW, VL and DQ (what oneDNN's bf16 path needs at the least);
    ``avx512_bf16`` / ``amx_bf16``: bf16 dot-product instructions (fast bf16 products);
    ``onednn_bf16``: oneDNN runs bf16 products at all (AVX-512 or AVX-NE-CONVERT; emulated,
    and slow, without bf16 instructions).
    """

    machine: str
    name: str
    avx2: bool = False
    avx512: bool = False
    avx512_bf16: bool = False
    amx_bf16: bool = False
    onednn_bf16: bool = False
    capped: str | None = None

    @property
    def level(self) -> str:
        """The highest of :data:`ISA_LEVELS` this CPU (as capped) has."""
        if self.amx_bf16:
            return "amx"
        if self.avx512_bf16:
            return "avx512-bf16"
        if self.avx512:
            return "avx512"
        return "avx2" if self.avx2 else "baseline"

    @property
    def bf16_native(self) -> bool:
        """bf16 products run in hardware (AVX512-BF16 or AMX)."""
        return self.avx512_bf16 or self.amx_bf16

    def describe(self) -> str:
        """One line for logs and benchmark records, e.g. ``AMD EPYC (x86_64, avx512-bf16)``."""
        cap = f", capped by GENREC_CPU_ISA={self.capped}" if self.capped else ""
        return f"{self.name} ({self.machine}, {self.level}{cap})"


def _probe(name: str) -> bool:
    # torch's private cpuid probes (torch.cpu._is_*_supported); absent in some builds
    fn = getattr(torch.cpu, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except RuntimeError:
        return False


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def detect_cpu() -> CpuFeatures:
    """The CPU's features, uncapped (see :func:`cpu_features` for the cached, capped ones)."""
    machine = platform.machine().lower()
    name = _cpu_name()
    if machine not in ("x86_64", "amd64"):
        return CpuFeatures(machine=machine, name=name)
    onednn = False
    if torch.backends.mkldnn.is_available():
        try:
            onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            onednn = False
    return CpuFeatures(
        machine=machine, name=name, avx2=_probe("_is_avx2_supported"),
        avx512=_probe("_is_avx512_supported"), avx512_bf16=_probe("_is_avx512_bf16_supported"),
        amx_bf16=_probe("_is_amx_tile_supported"), onednn_bf16=onednn,
    )


def cap_features(features: CpuFeatures, level: str) -> CpuFeatures:
    """``features`` with everything above ``level`` (one of :data:`ISA_LEVELS`) turned off."""
    if level not in ISA_LEVELS:
        raise ValueError(f"GENREC_CPU_ISA must be one of {list(ISA_LEVELS)}, got {level!r}")
    rank = ISA_LEVELS.index(level)
    return replace(
        features, capped=level,
        avx2=features.avx2 and rank >= 1,
        avx512=features.avx512 and rank >= 2,
        avx512_bf16=features.avx512_bf16 and rank >= 3,
        amx_bf16=features.amx_bf16 and rank >= 4,
        # below AVX-512 oneDNN's bf16 needs AVX-NE-CONVERT: treat a capped CPU as lacking it
        onednn_bf16=features.onednn_bf16 and rank >= 2,
    )


@functools.cache
def cpu_features() -> CpuFeatures:
    """The CPU's features as genrec uses them: detected once, capped by ``GENREC_CPU_ISA``."""
    features = detect_cpu()
    level = os.environ.get("GENREC_CPU_ISA", "").strip().lower()
    return cap_features(features, level) if level else features


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def bf16_products_native() -> bool:
    """Whether bf16 models multiply in bf16 on this CPU (else: fp32 products on widened
    inputs, results rounded back to bf16). See ``GENREC_BF16_COMPUTE`` above."""
    features = cpu_features()
    mode = os.environ.get("GENREC_BF16_COMPUTE", "auto").strip().lower()
    if mode not in BF16_MODES:
        _warn_once(f"GENREC_BF16_COMPUTE={mode!r} is not one of {list(BF16_MODES)}; using auto")
        mode = "auto"
    if mode == "native" and not features.onednn_bf16:
        _warn_once(
            f"GENREC_BF16_COMPUTE=native: this CPU ({features.describe()}) cannot run oneDNN's "
            "bf16 products (they need AVX-512 BW/VL/DQ or AVX-NE-CONVERT); bf16 models "
            "compute their products in fp32 instead"
        )
        return False
    if mode == "native":
        return True
    return mode == "auto" and features.bf16_native


def kernel_march() -> list[str]:
    """Compiler flags selecting the instruction set for genrec's native kernels: the detected
    (capped) level, never ``-march=native`` (which reads the compiler's host, wrong under an
    emulator or a cap); tuned for the host (tuning adds no instructions)."""
    features = cpu_features()
    if features.machine not in ("x86_64", "amd64"):
        return ["-march=native"] if features.capped is None else []
    level = features.level
    if level in ("avx512", "avx512-bf16", "amx"):
        return ["-march=x86-64-v4", "-mtune=native"]
    if level == "avx2":
        return ["-march=x86-64-v3", "-mtune=native"]
    return []  # the compiler's x86-64 default


def aten_capability() -> str:
    """ATen's vectorisation level for headers compiled into genrec's kernels, no higher than
    genrec's cap (``AVX512``, ``AVX2`` or ``DEFAULT``)."""
    cap = torch.backends.cpu.get_cpu_capability()
    level = cpu_features().level
    if cap == "AVX512" and level not in ("avx512", "avx512-bf16", "amx"):
        cap = "AVX2" if level == "avx2" else "DEFAULT"
    if cap == "AVX2" and level == "baseline":
        cap = "DEFAULT"
    return cap if cap in ("AVX512", "AVX2") else "DEFAULT"
