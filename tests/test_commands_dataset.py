"""The dataset options every command shares: the table flags reach the loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import genrec.data
from genrec.cli import app

runner = CliRunner()
FLAGS = ["--user-col", "uid", "--item-col", "sku", "--time-col", "when", "--rating-col", "stars",
         "--min-rating", "4", "--items-id-col", "id", "--text-cols", "name, notes"]
LOADED = {"user_col": "uid", "item_col": "sku", "time_col": "when", "rating_col": "stars",
          "min_rating": 4.0, "items_id_col": "id", "text_cols": ["name", "notes"]}


# Each command that takes --interactions, with its other required options ({tmp}: tmp_path;
# {tmp}/student holds a duolm.json, so that eval and encode-catalog read it as a student).
COMMANDS = {
    "index": ["index", "--out", "{tmp}/out"],
    "train generative": ["train", "generative", "--index", "{tmp}/i.json", "--out", "{tmp}/out"],
    "train teacher": ["train", "teacher", "--out", "{tmp}/out"],
    "train duolm": ["train", "duolm", "--out", "{tmp}/out"],
    "encode-catalog": ["encode-catalog", "--model", "{tmp}/student", "--out", "{tmp}/out"],
    "eval": ["eval", "--model", "{tmp}"],
    "eval (ranker)": ["eval", "--model", "{tmp}/student"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_passes_the_flags_to_the_loader(tmp_path, monkeypatch, command):
    seen: dict[str, Any] = {}

    def loader(interactions: Path, items: Path | None, **kwargs: Any) -> None:
        seen.update(kwargs, interactions=interactions, items=items)
        raise ValueError("loader reached")

    monkeypatch.setattr(genrec.data, "load_table_dataset", loader)
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "duolm.json").write_text(json.dumps({"kind": "student"}))
    args = [*(a.format(tmp=tmp_path) for a in COMMANDS[command]), "--interactions", "a.csv",
            "--items", "b.csv", *FLAGS, "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "error: loader reached" in result.output, result.output
    assert seen == {**LOADED, "interactions": Path("a.csv"), "items": Path("b.csv")}


def test_movielens_files_through_the_cli(tmp_path):
    (tmp_path / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "".join(
            f"{u},{(u + t) % 6 + 1},{1 + (u + t) % 5},{t}\n" for u in range(6) for t in range(5)))
    (tmp_path / "movies.csv").write_text(
        "movieId,title,genres\n" + "".join(f"{i},Movie {i},Drama\n" for i in range(1, 8)))
    np.save(tmp_path / "emb.npy", np.random.default_rng(0).normal(size=(7, 4)).astype("f4"))
    args = ["index", "--interactions", str(tmp_path / "ratings.csv"), "--items",
            str(tmp_path / "movies.csv"), "--embeddings", str(tmp_path / "emb.npy"),
            "--levels", "1", "--codebook-size", "2", "--out", str(tmp_path / "idx.json"),
            "--device", "cpu"]
    result = runner.invoke(app, [*args, "--min-rating", "3"])
    assert result.exit_code == 0, result.output
    assert ("ratings.csv: user 'userId', item 'movieId', time 'timestamp', rating 'rating' >= 3, "
            "items id 'movieId', text 'title', 'genres'") in result.output
    assert json.loads((tmp_path / "idx.json").read_text())["item_ids"] == [str(i) for i in
                                                                           range(1, 8)]
    result = runner.invoke(app, [*args, "--user-col", "user"])
    assert result.exit_code == 1
    assert ("error: ratings.csv: no column 'user' (given by --user-col / user_col=); the file has "
            "columns 'userId', 'movieId', 'rating', 'timestamp'") in result.output


def test_table_flags_go_with_interactions(tmp_path):
    result = runner.invoke(app, ["index", "--data", str(tmp_path), "--user-col", "u",
                                 "--min-rating", "4", "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    assert "--user-col, --min-rating go with --interactions" in result.output
    result = runner.invoke(app, ["index", "--interactions", "a.csv", "--text-cols", " , ",
                                 "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "--text-cols: no column names" in result.output
