"""``genrec serve``: the HTTP server (FastAPI + uvicorn) around the engine.

Register in ``genrec.cli`` with one line::

    app.command("serve")(serve)

Heavy modules are imported inside the function so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from genrec.commands.common import DeviceOpt, fail
from genrec.training.run_layout import model_folder


def serve(
    model_arg: Annotated[Path | None, typer.Argument(
        metavar="MODEL", help="Checkpoint directory of the generative model (with its "
                              "Semantic-ID vocabulary); or give --model.",
        show_default=False)] = None,
    model: Annotated[Path | None, typer.Option(help="The same as MODEL.",
                                               show_default=False)] = None,
    served_model_name: Annotated[str | None, typer.Option(
        help="The model's name in /v1/models and the answers' 'model'; /v1/completions "
             "naming another model gets 404 [default: MODEL's folder name].",
        show_default=False)] = None,
    ranker: Annotated[Path | None, typer.Option(help="DuoLM ranker directory: enables "
                                                     "/v1/rank and rerank.")] = None,
    ensemble: Annotated[list[Path] | None, typer.Option(
        help="Another generative model over --model's index: /v1/recommend ranks by the "
             "mean log-probability of all of them (repeat for more).")] = None,
    item_store: Annotated[Path | None, typer.Option(
        "--item-store", help="Item store of the ranker: enables /v1/catalog/items.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Requests per engine batch.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(min=0, help="Longest wait for a batch to "
                                                           "fill, after its first request.")] = 5,
    max_queue: Annotated[int, typer.Option(min=1, help="Requests waiting before 503.")] = 256,
    tokenizer: Annotated[Path | None, typer.Option(help="Hugging Face tokenizer folder, for "
                                                        "text in /v1/score.")] = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 | float16 (default: "
                                                   "the checkpoint's).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch.")] = None,
    engine_process: Annotated[bool, typer.Option(
        "--engine-process", help="Run the engine in its own process (the HTTP handling then "
                                 "does not take turns with it; the model is loaded twice).")
    ] = False,
    overlap: Annotated[bool | None, typer.Option(
        "--overlap/--no-overlap", help="Pack the next batch while the engine runs this one "
                                       "(default: on a GPU only).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    ray: Annotated[bool, typer.Option("--ray", help="Serve as a Ray Serve deployment (needs "
                                                    "the 'ray' extras); each replica loads "
                                                    "the model itself.")] = False,
    replicas: Annotated[int, typer.Option(min=1, help="Ray Serve replicas (with --ray).")] = 1,
    api_key: Annotated[str | None, typer.Option(
        help="Require 'Authorization: Bearer KEY' on /v1 (default: $GENREC_API_KEY).",
        show_default=False)] = None,
    admin_key: Annotated[str | None, typer.Option(
        help="Require this key instead on /v1/catalog (default: $GENREC_ADMIN_KEY).",
        show_default=False)] = None,
    catalog_state: Annotated[Path | None, typer.Option(
        help="Directory where live catalog updates are logged (fsync'd before the answer) "
             "and replayed from on start [default: MODEL/catalog-state].",
        show_default=False)] = None,
    volatile_catalog: Annotated[bool, typer.Option(
        "--volatile-catalog", help="Keep live catalog updates in memory only (lost on "
                                   "restart).")] = False,
    allow_insecure: Annotated[bool, typer.Option(
        "--allow-insecure", help="Listen on a non-loopback address without an API key.")
    ] = False,
) -> None:
    """Serve the model over HTTP: /v1/recommend, /v1/rank, /v1/score, /v1/completions,
    /v1/models, /v1/catalog/items, /health, /ready, /metrics. SIGTERM drains and exits.

    With --ray --replicas N: the same application in N Ray Serve replicas behind Ray Serve's
    HTTP proxy on --host/--port (a local Ray instance, or the cluster at RAY_ADDRESS). The
    replicas, like plain servers started on one --catalog-state, share the catalog: each
    follows the directory's log and takes updates, and an answer's catalog_version, sent back
    as min_catalog_version, reads that version on any of them."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        typer.echo(f"error: genrec serve needs the 'serve' extras: pip install 'genrec[serve]' "
                   f"({err})", err=True)
        raise typer.Exit(code=1) from None
    given = served_model(model_arg, model)
    model = model_folder(given)  # a training run's folder serves its best checkpoint
    if served_model_name is not None and not served_model_name.strip():
        raise typer.BadParameter("--served-model-name: empty name")
    from genrec.serving.auth import keys_from_env
    from genrec.serving.launch import LaunchConfig, launch
    from genrec.serving.spec import AppSpec, ServeConfig

    server = LaunchConfig(host=host, port=port, log_level=log_level, ray=ray, replicas=replicas,
                          allow_insecure=allow_insecure)
    if (conflict := server.conflict(ServeConfig(engine_process=engine_process))) is not None:
        raise fail(conflict) from None
    try:
        api_key, admin_key = keys_from_env(api_key, admin_key)
        config = ServeConfig(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                             max_queue=max_queue,
                             model_name=served_model_name or given.expanduser().absolute().name,
                             engine_process=engine_process, overlap=overlap, api_key=api_key,
                             admin_key=admin_key,
                             catalog_state=catalog_state_dir(model, catalog_state,
                                                             volatile_catalog))
        warning = server.bind_warning(config)
    except ValueError as err:
        raise fail(err, code=2) from None
    if warning is not None:
        typer.echo(warning, err=True)
    spec = AppSpec.of(model, ranker, item_store, tokenizer, device=device, dtype=dtype,
                      threads=threads, config=config, ensemble=tuple(ensemble or ()))
    try:
        launch(spec, server, echo=typer.echo)
    except KeyboardInterrupt:
        pass
    except (ValueError, ImportError) as err:
        raise fail(err) from None
    except Exception as err:  # with Ray, a replica failed to start: Ray's error names the cause
        if ray:
            raise fail(f"Ray Serve deployment failed: {err}") from None
        if isinstance(err, (RuntimeError, OSError)):  # CheckpointError, missing packages
            raise fail(err) from None
        raise


def served_model(positional: Path | None, option: Path | None) -> Path:
    """The model of ``genrec serve MODEL`` or ``--model MODEL`` (``typer.BadParameter`` when
    neither is given, or both and they differ)."""
    if positional is None and option is None:
        raise typer.BadParameter("give the model: genrec serve MODEL (or --model MODEL)")
    if positional is not None and option is not None and (
            positional.expanduser().absolute() != option.expanduser().absolute()):
        raise typer.BadParameter(f"MODEL {positional} and --model {option} differ: give one")
    return positional if positional is not None else option  # type: ignore[return-value]


def catalog_state_dir(model: Path, given: Path | None, volatile: bool) -> str | None:
    """The durable catalog's directory (absolute; default ``MODEL/catalog-state``), or
    ``None`` with ``--volatile-catalog`` (updates in memory only); ``ValueError`` when the
    default cannot be written. Every server process on one directory (Ray replicas, or
    ``genrec serve`` processes on other ports) follows it and takes updates: the log orders
    them all."""
    if volatile:
        return None
    if given is None and model.is_dir() and not (model / "catalog-state").exists() and (
            not os.access(model, os.W_OK)):
        # a read-only checkpoint: say so now rather than acknowledge updates it cannot keep
        raise ValueError(f"--model {model} is not writable, so the catalog's update log "
                         f"cannot live in it: give --catalog-state DIR (a writable directory) "
                         f"or --volatile-catalog (updates in memory only)")
    return str((given if given is not None else model / "catalog-state").expanduser().absolute())
