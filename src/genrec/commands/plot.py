"""``genrec plot``: validation curves of training runs as a PNG (needs the 'plot' extras).

Register in ``genrec.cli`` with one line::

    app.command("plot")(plot_command)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def read_history(run: Path) -> list[dict]:
    """The per-epoch records of a training output folder (or of a ``history.json`` file)."""
    path = run / "history.json" if run.is_dir() else run
    if not path.is_file():
        raise typer.BadParameter(f"{run}: no history.json (not a training output folder)")
    records = json.loads(path.read_text())
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise typer.BadParameter(f"{path}: expected a list of per-epoch records")
    return records


def _reference(text: str) -> tuple[str, str, float]:
    # "metric=value" or "metric=value=label"
    parts = text.split("=")
    try:
        value = float(parts[1])
    except (IndexError, ValueError):
        raise typer.BadParameter(f"--reference {text!r}: expected METRIC=VALUE[=LABEL]") from None
    return parts[0], parts[2] if len(parts) > 2 else f"{value:g}", value


def plot_command(
    runs: Annotated[list[Path], typer.Argument(help="Training output folders (history.json).")],
    out: Annotated[Path, typer.Option(help="PNG file to write.")],
    metrics: Annotated[str, typer.Option(help="Comma-separated metrics, one panel each.")] =
        "val_recall@10,val_ndcg@10",
    labels: Annotated[str | None, typer.Option(help="Comma-separated run names (default: "
                                                    "the folder names).")] = None,
    reference: Annotated[list[str] | None, typer.Option(help="A horizontal line: "
                                                              "METRIC=VALUE[=LABEL].")] = None,
    title: Annotated[str | None, typer.Option(help="Figure title.")] = None,
) -> None:
    """Plot per-epoch metrics of one or more training runs (e.g. validation Recall@10 and
    NDCG@10) into a PNG, with optional reference lines (e.g. a published figure)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        typer.echo("error: genrec plot needs matplotlib: pip install 'genrec[plot]'", err=True)
        raise typer.Exit(code=1) from None
    names = [m for m in metrics.split(",") if m]
    run_names = labels.split(",") if labels else [r.name for r in runs]
    if len(run_names) != len(runs):
        raise typer.BadParameter(f"--labels: {len(run_names)} names for {len(runs)} runs")
    refs = [_reference(r) for r in reference or []]
    histories = [read_history(r) for r in runs]
    for name in names:
        if not any(name in rec for h in histories for rec in h):
            raise typer.BadParameter(f"--metrics: no run records {name!r}")
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for run_name, history in zip(run_names, histories, strict=True):
            points = [(r["epoch"], r[name]) for r in history if name in r and "epoch" in r]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=run_name)
        for metric, label, value in refs:
            if metric == name:
                ax.axhline(value, linestyle="--", color="gray", label=label)
        ax.set_xlabel("epoch")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    tmp.replace(out)
    typer.echo(f"wrote {out}")
