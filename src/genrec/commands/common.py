"""What the commands share: the ``train`` command group, option types, input errors.

Heavy modules are imported inside the functions so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

train_app = typer.Typer(help="Train models.", no_args_is_help=True)

DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | cuda[:N].")]
ThreadsOpt = Annotated[int | None, typer.Option(min=1, help="CPU threads for torch (default: "
                                                           "torch's; 1 is faster on a busy CPU).")]
NprocOpt = Annotated[int, typer.Option(min=1, help="Data-parallel processes on this machine (runs "
                                                  "the command under torchrun: gloo on the "
                                                  "CPU, NCCL on GPUs).")]
GradAccumOpt = Annotated[int, typer.Option(min=1, help="Batches per optimizer step.")]
PrecisionOpt = Annotated[str, typer.Option(help="fp32 | bf16 (autocast; fp32 master weights).")]
FsdpOpt = Annotated[bool, typer.Option(help="With several ranks: shard weights, gradients and "
                                            "optimizer state over them (PyTorch FSDP2).")]
# errors a command reports as "error: ..." with exit code 1 (bad input, not a crash)
INPUT_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def fail(err: object, code: int = 1) -> typer.Exit:
    """Print ``err`` as the command's error and return the exit (``code``) to raise."""
    typer.echo(f"error: {err}", err=True)
    return typer.Exit(code=code)
