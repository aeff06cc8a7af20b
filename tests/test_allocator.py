"""glibc malloc tuning: applied once, switchable off, and freed activations are reused."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import resource, sys, torch
from genrec.utils.allocator import keep_freed_memory
applied = keep_freed_memory()
assert keep_freed_memory() == applied  # idempotent
def faults_of_one_forward_like_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):  # a layer's activations: several 24 MiB blocks alive at once
        blocks = [torch.empty(6 << 20).fill_(1.0) for _ in range(4)]
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_forward_like_step()  # first use grows the heap
print(applied, faults_of_one_forward_like_step())
"""


def _run(env_value: str | None) -> tuple[bool, int]:
    import os

    env = dict(os.environ)
    env.pop("GENREC_MALLOC_TUNING", None)
    # glibc's default threshold, fixed: its dynamic adjustment depends on the process's history
    env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=131072"
    if env_value is not None:
        env["GENREC_MALLOC_TUNING"] = env_value
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    applied, faults = _run(None)
    assert applied
    # 3 x 4 x 24 MiB: ~70,000 fresh pages if freed blocks went back to the kernel
    assert faults < 500
    applied_off, faults_off = _run("0")
    assert not applied_off
    assert faults_off > 5000
