"""Starting a server: the app of an :class:`~genrec.serving.spec.AppSpec`
(:func:`load_app`), its batches run here or in an engine process."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from genrec.serving.components import build_worker, load_components
from genrec.serving.engine_process import EngineProcess
from genrec.serving.http_app import build_app
from genrec.serving.spec import AppSpec
from genrec.serving.worker import BatchWorker

if TYPE_CHECKING:
    from fastapi import FastAPI


def load_app(spec: AppSpec, device: str | None = None) -> FastAPI:
    """Load what ``spec`` names (:func:`load_components`) into a
    :class:`~genrec.serving.worker.Worker` and build the app around it
    (:func:`genrec.serving.http_app.build_app`); with ``spec.config.engine_process``, the batches
    run in a child process that loads the same
    (:class:`~genrec.serving.engine_process.EngineProcess`; the local worker then checks
    requests and mirrors catalog updates).

    Raises ValueError / RuntimeError / OSError (a bad checkpoint, a missing package).
    """
    if device is not None:
        spec = replace(spec, device=device)
    parts = load_components(spec)
    # with an engine process, the child logs the updates and this copy only mirrors them
    # (its replay done before the child can write)
    local = build_worker(parts, spec.config, writable=not spec.config.engine_process)
    worker: BatchWorker = EngineProcess(spec, local) if spec.config.engine_process else local
    return build_app(worker, tokenizer=parts.tokenizer, config=spec.config)
