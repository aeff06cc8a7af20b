"""``genrec serve``: the HTTP server (FastAPI + uvicorn) around the engine.

Register in ``genrec.cli`` with one line::

    app.command("serve")(serve)

Heavy modules are imported inside the function so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def serve(
    model: Annotated[Path, typer.Option(help="Checkpoint directory of the generative model "
                                             "(with its Semantic-ID vocabulary).")],
    ranker: Annotated[Path | None, typer.Option(help="DuoLM ranker directory: enables "
                                                     "/v1/rank and rerank.")] = None,
    catalog: Annotated[Path | None, typer.Option(help="Item store of the ranker: enables "
                                                      "/v1/catalog/items.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Requests per engine batch.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(min=0, help="Longest wait for a batch to "
                                                           "fill, after its first request.")] = 5,
    max_queue: Annotated[int, typer.Option(min=1, help="Requests waiting before 503.")] = 256,
    tokenizer: Annotated[Path | None, typer.Option(help="Hugging Face tokenizer folder, for "
                                                        "text in /v1/score.")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:N].")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 | float16 (default: "
                                                   "the checkpoint's).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch.")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the model over HTTP: /v1/recommend, /v1/rank, /v1/score, /v1/completions,
    /v1/catalog/items, /health, /ready, /metrics. SIGTERM drains and exits."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        typer.echo(f"error: genrec serve needs the 'serve' extras: pip install 'genrec[serve]' "
                   f"({err})", err=True)
        raise typer.Exit(code=1) from None
    from genrec.commands.generative import resolve_device
    from genrec.engine import Engine
    from genrec.serving import ServeConfig, create_app, run_server
    from genrec.serving.backends import load_catalog_updater, load_ranker, load_tokenizer

    try:
        dev = resolve_device(device, threads)
        engine = Engine.from_pretrained(model, dtype=dtype, device=dev)
        loaded_ranker = load_ranker(ranker, catalog, dev, dtype) if ranker is not None else None
        updater = load_catalog_updater(catalog, loaded_ranker) if catalog is not None else None
        tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    except (ValueError, RuntimeError, OSError) as err:  # CheckpointError, missing packages
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    config = ServeConfig(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                         max_queue=max_queue, model_name=model.name)
    app = create_app(engine, ranker=loaded_ranker, catalog_updater=updater, tokenizer=tok,
                     config=config)
    run_server(app, host=host, port=port, log_level=log_level)
