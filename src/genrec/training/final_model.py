"""A run's final model, ``OUT/model``: its best validation epoch, or the mean of the weights of
the epochs around it when that validates better (checkpoint averaging, chosen on validation).

With ``LoopConfig.average`` K > 0 the loop keeps, under ``OUT/epochs/NNN``, every epoch a
window around the best epoch may need (older ones are pruned unless ``keep_epochs``). When the
run ends, the means of epochs best-k..best+k for k = 1..K (of those present; a window that adds
no epoch is skipped) are validated beside the best epoch, the winner is written as
``OUT/model`` and ``OUT/model.json`` records every candidate's validation metrics and the
choice. Commands given a run folder load ``OUT/model`` (:func:`genrec.training.run_layout
.model_folder`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from genrec.training.averaging import AveragingError, average_checkpoints
from genrec.training.checkpoints import STATE_FILE, swap_in
from genrec.training.run_layout import BEST, EPOCHS, MODEL, epoch_folder
from genrec.utils.atomic import atomic_write_json

SUMMARY_FILE = "model.json"

# validation of a model: its metrics, or None without validation data
Validate = Callable[[nn.Module], dict[str, float] | None]
# load a checkpoint folder's weights into a model
LoadInto = Callable[[nn.Module, Path], None]
# a task's last word on the final model (given with its folder, before it is published):
# what to add to the summary (e.g. a ranking setting chosen on validation, saved in the folder)
Refine = Callable[[nn.Module, Path], dict[str, Any]]


def prune_epochs(out: Path, best_epoch: int | None, window: int) -> None:
    """Remove the kept epochs no window of the best epoch +-``window`` can use any more (the
    best epoch only rises, so those before best - window)."""
    if best_epoch is None:
        return
    for folder in sorted((out / EPOCHS).glob("[0-9][0-9][0-9]")):
        if int(folder.name) < best_epoch - window:
            shutil.rmtree(folder, ignore_errors=True)


def windows(out: Path, best_epoch: int, window: int) -> list[list[int]]:
    """The epochs of each window best-k..best+k (k = 1..``window``) kept under ``OUT/epochs``,
    those of two or more epochs, each adding at least one epoch to the previous."""
    found: list[list[int]] = []
    for k in range(1, window + 1):
        epochs = [e for e in range(best_epoch - k, best_epoch + k + 1)
                  if (epoch_folder(out, e) / "config.json").is_file()]
        if len(epochs) >= 2 and (not found or len(epochs) > len(found[-1])):
            found.append(epochs)
    return found


def _label(epochs: list[int]) -> str:
    return f"mean of epochs {epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else f"epoch {epochs[0]}"


def has_final_model(out: Path) -> bool:
    """Whether the run in ``out`` has written its final model (``model/`` and ``model.json``)."""
    return (out / SUMMARY_FILE).is_file() and (out / MODEL / "config.json").is_file()


def finish_run(model: nn.Module, out: Path, window: int, monitor: str, state: dict[str, Any],
               validate: Validate, load_into: LoadInto, refine: Refine | None = None,
               validate_final: Validate | None = None) -> dict[str, Any]:
    """Choose and write the run's final model (``OUT/model``, ``OUT/model.json``) and leave
    ``model`` holding its weights; returns the summary written to ``model.json``, with what
    ``refine`` (called with the chosen model and its folder before it is published) adds.

    ``state``: the loop's (``epoch``, ``best_epoch``, ``best_metric``). Without validation
    metrics the best epoch (the last one) is the final model. ``validate_final``: the
    candidates' validation (default ``validate``; another, e.g. on a larger sample, measures
    the best epoch again too, when there are means to compare it with). A summary of the same
    finished epoch is kept as it is (a finished run resumed)."""
    summary_file = out / SUMMARY_FILE
    if has_final_model(out):
        summary = json.loads(summary_file.read_text())
        if summary.get("epoch") == state["epoch"]:
            load_into(model, out / MODEL)
            return summary
    best_epoch, best_metric = state["best_epoch"], state["best_metric"]
    means = windows(out, best_epoch, window) if window > 0 and best_metric is not None else []
    if validate_final is not None and means:  # the best epoch measured as the means will be
        load_into(model, out / BEST)
        best_metric = (validate_final(model.eval()) or {}).get(monitor)
    validate = validate_final or validate
    candidates: list[dict[str, Any]] = [{"model": _label([best_epoch]), "epochs": [best_epoch],
                                         monitor: best_metric}]
    chosen, chosen_folder = candidates[0], out / BEST
    for epochs in means:
        folder = out / f".{MODEL}-{epochs[0]}-{epochs[-1]}.tmp"
        shutil.rmtree(folder, ignore_errors=True)
        try:
            average_checkpoints([epoch_folder(out, e) for e in epochs], folder)
        except AveragingError as err:  # e.g. epochs of a run resumed with other settings
            candidates.append({"model": _label(epochs), "epochs": epochs, monitor: None,
                               "error": str(err)})
            continue
        load_into(model, folder)
        metrics = validate(model.eval()) or {}
        entry = {"model": _label(epochs), "epochs": epochs, monitor: metrics.get(monitor)}
        candidates.append(entry)
        if entry[monitor] is not None and entry[monitor] > chosen[monitor]:
            if chosen_folder != out / BEST:
                shutil.rmtree(chosen_folder, ignore_errors=True)
            chosen, chosen_folder = entry, folder
        else:
            shutil.rmtree(folder, ignore_errors=True)
    if chosen_folder == out / BEST:
        tmp = out / f".{MODEL}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(out / BEST, tmp, ignore=shutil.ignore_patterns(STATE_FILE))
        chosen_folder = tmp
    load_into(model, chosen_folder)
    extra = refine(model, chosen_folder) if refine is not None else {}
    swap_in(chosen_folder, out / MODEL)
    summary = {"epoch": state["epoch"], "chosen": chosen["model"], "monitor": monitor,
               "candidates": candidates, **extra}
    atomic_write_json(summary_file, summary)
    return summary
