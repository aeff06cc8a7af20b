"""The folders of a training run (no torch here, so commands can name them cheaply).

``OUT/last`` (the latest epoch, resumable), ``OUT/best`` (the best validation epoch) and, with
``--keep-epochs``, ``OUT/epochs/NNN``.
"""

from __future__ import annotations

from pathlib import Path

LAST, BEST, EPOCHS = "last", "best", "epochs"


def model_folder(path: Path) -> Path:
    """The checkpoint a path names: a training run's folder means its ``best`` checkpoint; any
    other folder is taken as it is."""
    path = Path(path)
    return path / BEST if (path / BEST / "config.json").is_file() else path
