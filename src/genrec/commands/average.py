"""``genrec average``: the mean of several checkpoints' weights as a new checkpoint.

Register in ``genrec.cli`` with one line::

    app.command("average")(average_command)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def average_command(
    checkpoints: Annotated[list[Path], typer.Argument(
        help="Checkpoint folders of one run (e.g. OUT/epochs/038 OUT/epochs/039 ...).")],
    out: Annotated[Path, typer.Option(help="New checkpoint folder to write (must not exist).")],
) -> None:
    """Average the weights of checkpoints of one training run (e.g. its last epochs, kept with
    ``genrec train ... --keep-epochs``). Pick the epochs on validation (``genrec eval --split
    val``), not on test."""
    from genrec.training.averaging import AveragingError, average_checkpoints

    try:
        average_checkpoints(checkpoints, out)
    except AveragingError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(f"wrote {out}: the mean of {len(checkpoints)} checkpoints")
