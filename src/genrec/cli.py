"""The ``genrec`` command line.

Each command is a thin function: it parses its options and calls into a module, which it
imports lazily so that ``genrec --help`` stays fast. To add a command, decorate a function with
``@app.command()`` here, or define it in ``genrec.commands`` and register it below with
``app.command("name")(function)`` (a group of subcommands: ``app.add_typer(sub_app, name=...)``).
The function's docstring is its help text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from genrec.commands.common import DeviceOpt, ThreadsOpt

app = typer.Typer(
    name="genrec",
    help="genrec: inference engine, training and evaluation for LLM-based recommendation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def parse_ids(text: str, what: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]`` (spaces allowed); raises ``typer.BadParameter``."""
    compact = text.replace(" ", "")
    if not compact:
        raise typer.BadParameter(f"{what}: no token ids in {text!r}")
    try:
        return [int(x) for x in compact.split(",")]
    except ValueError:
        raise typer.BadParameter(
            f"{what}: expected comma-separated integers, got {text!r}"
        ) from None


def parse_candidates(text: str) -> list[list[int]]:
    """``"4,5;6,7"`` -> ``[[4, 5], [6, 7]]``: candidates separated by ``;``."""
    return [parse_ids(c, f"candidate {i}") for i, c in enumerate(text.split(";"))]


@app.command()
def demo(
    out: Annotated[
        Path | None,
        typer.Option(help="Checkpoint directory (default: ~/.cache/genrec/demo)."),
    ] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Training steps (default 300).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of data, training and evaluation.")] = 0,
    progress: Annotated[bool, typer.Option(help="Show the training progress bar.")] = True,
    threads: Annotated[int, typer.Option(min=1, help="Torch intra-op threads.")] = 1,
    serve: Annotated[bool, typer.Option(help="Keep serving after the printout, until "
                                             "Ctrl-C (--no-serve: stop).")] = True,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Server port on 127.0.0.1 "
                                                             "(0: a free one).")] = 0,
) -> None:
    """Main job: nothing -> a running recommender. Trains a tiny generative-retrieval model
    on synthetic data, starts genrec's server and shows a real /v1/recommend answer."""
    from genrec.demo import SyntheticConfig, TrainConfig, run_demo

    train = TrainConfig(seed=seed) if steps is None else TrainConfig(steps=steps, seed=seed)
    try:
        run_demo(out, SyntheticConfig(seed=seed), train, progress=progress, echo=typer.echo,
                 num_threads=threads, serve=serve, port=port)
    except (OSError, RuntimeError) as err:  # port in use, unwritable --out, failed request
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None


@app.command()
def score(
    model: Annotated[Path, typer.Option(help="Checkpoint directory (HF config.json + "
                                             "safetensors).")],
    prefix: Annotated[str, typer.Option(help='Prefix token ids, e.g. "1,2,3".')],
    candidates: Annotated[str, typer.Option(help='Candidates separated by ";", e.g. "4,5;6,7".')],
    mode: Annotated[str, typer.Option(help="labels | loglik | head.")] = "labels",
    labels: Annotated[str | None, typer.Option(help='Label token ids for --mode labels, '
                                                    'e.g. "0,1".')] = None,
    apply_softmax: Annotated[bool, typer.Option(help="labels mode: softmax over the label "
                                                     "logits alone.")] = False,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16.")] = "float32",
    device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON.")] = False,
) -> None:
    """Score candidates after a shared prefix (one request; the prefix is computed once)."""
    from genrec.engine import Engine, ScoreParams
    from genrec.utils.device import resolve_device

    prefix_ids = parse_ids(prefix, "prefix")
    cands = parse_candidates(candidates)
    label_ids = parse_ids(labels, "labels") if labels is not None else None
    try:
        engine = Engine.from_pretrained(model, dtype=dtype,
                                        device=resolve_device(device, threads))
        params = ScoreParams(mode=mode, label_token_ids=label_ids, apply_softmax=apply_softmax)
        scores = engine.score(prefix_ids, cands, params)
    except ValueError as err:  # CheckpointError, InputError and bad parameters
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    rows = scores.tolist()
    if as_json:
        typer.echo(json.dumps({"mode": mode, "labels": label_ids, "scores": rows}))
        return
    header = [f"label {i}" for i in label_ids] if mode == "labels" else [mode]
    typer.echo("candidate  " + "  ".join(f"{h:>12}" for h in header) + "  tokens")
    for i, (cand, row) in enumerate(zip(cands, rows, strict=True)):
        values = row if isinstance(row, list) else [row]
        text = "  ".join(f"{v:>12.6f}" for v in values)
        typer.echo(f"{i:>9}  {text}  {','.join(map(str, cand))}")


# Commands defined in genrec.commands are registered here, one line each.
from genrec.commands.average import average_command  # noqa: E402
from genrec.commands.common import train_app  # noqa: E402
from genrec.commands.eval_generative import eval_command  # noqa: E402
from genrec.commands.index import index_command  # noqa: E402
from genrec.commands.plot import plot_command  # noqa: E402
from genrec.commands.recommend import recommend_command  # noqa: E402
from genrec.commands.serve import serve  # noqa: E402
from genrec.commands.train_duolm import encode_catalog  # noqa: E402  (also adds train teacher/duolm)
from genrec.commands.train_generative import train_generative  # noqa: E402, F401 (adds the command)

app.add_typer(train_app, name="train")
app.command("eval")(eval_command)
app.command("index")(index_command)
app.command("serve")(serve)
app.command("recommend")(recommend_command)
app.command("encode-catalog")(encode_catalog)
app.command("plot")(plot_command)
app.command("average")(average_command)


if __name__ == "__main__":
    app()
