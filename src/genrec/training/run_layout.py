"""The folders of a training run (no torch here, so commands can name them cheaply).

``OUT/last`` (the latest epoch, resumable), ``OUT/best`` (the best validation epoch),
``OUT/model`` (the final model: the best epoch or the mean of the epochs around it, chosen on
validation; :mod:`genrec.training.final_model`) and ``OUT/epochs/NNN`` (kept epochs).
"""

from __future__ import annotations

from pathlib import Path

LAST, BEST, MODEL, EPOCHS = "last", "best", "model", "epochs"
HISTORY = "history.json"  # one entry per finished epoch


def epoch_folder(out: Path, epoch: int) -> Path:
    """``OUT/epochs/NNN``: the kept copy of ``epoch`` (1-based)."""
    return Path(out) / EPOCHS / f"{epoch:03d}"


def model_folder(path: Path) -> Path:
    """The checkpoint a path names: a training run's folder means its final ``model``
    checkpoint, else (a run still training, or one from before ``model``) its ``best``; any
    other folder is taken as it is."""
    path = Path(path)
    for name in (MODEL, BEST):
        if (path / name / "config.json").is_file():
            return path / name
    return path
