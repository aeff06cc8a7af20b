"""``genrec plot``: per-epoch validation curves of training runs as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genrec.cli import app

pytest.importorskip("matplotlib")


def run_folder(tmp_path: Path, name: str, values: list[float]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    history = [{"epoch": k + 1, "train_loss": 2.0 - 0.1 * k, "val_recall@10": v,
                "val_ndcg@10": v / 2} for k, v in enumerate(values)]
    (folder / "history.json").write_text(json.dumps(history))
    return folder


def flat(text: str) -> str:
    """Typer's error box as one line: box characters and line breaks removed."""
    return " ".join(text.replace("│", " ").split())


def test_plot_writes_a_png_of_every_run(tmp_path: Path) -> None:
    a = run_folder(tmp_path, "plain", [0.01, 0.03, 0.05])
    b = run_folder(tmp_path, "soft", [0.02, 0.025])
    out = tmp_path / "img" / "curves.png"
    result = CliRunner().invoke(app, ["plot", str(a), str(b), "--out", str(out), "--reference",
                                      "val_recall@10=0.0648=TIGER", "--title", "test"])
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not list(out.parent.glob(".*tmp"))


def test_plot_names_bad_options(tmp_path: Path) -> None:
    a = run_folder(tmp_path, "plain", [0.01])
    out = tmp_path / "x.png"
    cases = [
        (["--metrics", "val_mrr"], "no run records 'val_mrr'"),
        (["--labels", "a,b"], "2 names for 1 runs"),
        (["--reference", "val_ndcg@10"], "METRIC=VALUE"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(app, ["plot", str(a), "--out", str(out), *extra])
        assert result.exit_code == 2 and message in flat(result.output), result.output
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "none"), "--out", str(out)])
    assert result.exit_code == 2 and "no history.json" in flat(result.output)
    assert not out.exists()
