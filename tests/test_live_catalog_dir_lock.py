"""A state directory's lock: held by one open file at a time, in this process or another;
let go when the file is closed or unlocked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import genrec
from genrec.live_catalog.dir_lock import LOCK_FILE, can_lock, lock_dir, try_lock, unlock
from genrec.live_catalog.log_format import CatalogLogError

pytestmark = pytest.mark.skipif(not can_lock(), reason="no flock on this platform")

TAKE = ("import sys; from pathlib import Path; from genrec.live_catalog.dir_lock import lock_dir;"
        "lock_dir(Path(sys.argv[1]))")


def _take_elsewhere(directory: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(genrec.__file__).parents[1])}
    return subprocess.run([sys.executable, "-c", TAKE, str(directory)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_second_process_cannot_take_the_lock(tmp_path: Path) -> None:
    held = lock_dir(tmp_path)
    assert (tmp_path / LOCK_FILE).exists()
    other = _take_elsewhere(tmp_path)
    assert other.returncode != 0 and "in use by another process" in other.stderr
    held.close()
    assert _take_elsewhere(tmp_path).returncode == 0


def test_one_open_file_holds_it_until_it_lets_go(tmp_path: Path) -> None:
    held = lock_dir(tmp_path)
    with pytest.raises(CatalogLogError, match="in use by another process"):
        lock_dir(tmp_path)
    with open(tmp_path / LOCK_FILE, "a") as second:
        assert not try_lock(second, 0.0)
        unlock(held)
        assert try_lock(second, 0.0)
    held.close()
