"""The engine's memory budget, taken once when the engine is built.

Like vLLM's ``--gpu-memory-utilization``: a fraction (``EngineConfig.memory_fraction``) of the
memory free at that moment (on CUDA ``torch.cuda.mem_get_info``, after the weights are loaded;
on the CPU the RAM the kernel reports available, ``MemAvailable`` of ``/proc/meminfo``, else
``psutil`` where installed, else the physical pages), or a size given outright
(``EngineConfig.memory_budget_bytes``). Kept search buffers may take
:data:`SEARCH_BUFFER_SHARE` of it (:class:`genrec.engine.runner_pool.RunnerPool`); requests
are admitted against the whole (:mod:`genrec.engine.admission`). The budget bounds what genrec
allocates; it reserves nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

SEARCH_BUFFER_SHARE = 0.5
GIB = 1 << 30
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryBudget:
    """``total`` bytes genrec may allocate beyond its weights: ``fraction`` of ``free`` bytes
    found at start (``source`` says where), or given outright (``fraction`` 1, ``source``
    ``"given"``)."""

    total: int
    free: int
    fraction: float
    source: str

    @property
    def search_buffers(self) -> int:
        """Bytes of search buffer sets kept between searches."""
        return int(self.total * SEARCH_BUFFER_SHARE)

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.source == "given":
            how = "given"
        else:
            how = f"{self.fraction:g} of {self.free / GIB:.1f} GiB free ({self.source})"
        return (f"memory budget {self.total / GIB:.2f} GiB ({how}); search buffers kept up "
                f"to {self.search_buffers / GIB:.2f} GiB")


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_memory(device: torch.device) -> tuple[int, str]:
    """Bytes free on ``device`` now and where the figure comes from."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"{device} free"
    found = _meminfo_available()
    if found is not None:
        return found, "MemAvailable"
    try:
        import psutil  # optional: not a dependency
    except ImportError:
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
        return int(pages) * os.sysconf("SC_PAGE_SIZE") if pages else 0, "available pages"
    return int(psutil.virtual_memory().available), "psutil"


def take_budget(device: torch.device, fraction: float, given: int | None = None
                ) -> MemoryBudget:
    """The budget of an engine on ``device`` (logged once at info level). Raises
    ``ValueError`` for a fraction outside (0, 1] or a given size below 1."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {fraction!r}")
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"memory_budget_bytes must be a positive integer, got {given!r}")
        budget = MemoryBudget(given, given, 1.0, "given")
    else:
        free, source = free_memory(torch.device(device))
        budget = MemoryBudget(int(free * fraction), free, fraction, source)
    _log.info("genrec engine on %s: %s", device, budget.describe())
    return budget
