"""``genrec recommend`` end to end on a tiny generated dataset whose users and items have
string ids: index -> train -> the batch job, its lines in the table's ids and equal to the
engine's answers, ``--users``, ``--include-history``, ``--ranker``, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_commands_train_generative import invoke, runner

from genrec import BeamParams, Engine
from genrec.cli import app
from genrec.engine import RowRequest

N_USERS, N_ITEMS = 30, 40
TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
        "--batch-tokens", "200", "--max-history", "5", "--val-users", "10", "--beam-width",
        "10", "--no-progress", "--device", "cpu", "--epochs", "1"]
JOB = ["--no-progress", "--device", "cpu", "--batch-size", "7"]


def song(i: int) -> str:
    return f"song-{i:03d}"


def write_named_dataset(folder: Path) -> Path:
    """Songs.inter.json (users walk their cluster) with ids like ``user-07`` / ``song-012``,
    Songs.item.json, and unique 3-level Semantic IDs."""
    g = np.random.default_rng(0)
    inter = {}
    for u in range(N_USERS):
        c, start = u % 4, int(g.integers(10))
        inter[f"user-{u:02d}"] = [song(c * 10 + (start + j) % 10)
                                  for j in range(int(g.integers(4, 9)))]
    items = {song(i): {"title": f"song {i}", "categories": [f"c{i // 10}"]}
             for i in range(N_ITEMS)}
    codes = {song(i): [f"<a_{i // 10}>", f"<b_{i % 5}>", f"<c_{(i // 5) % 2}>"]
             for i in range(N_ITEMS)}
    (folder / "sid-rqvae").mkdir(parents=True)
    (folder / "Songs.inter.json").write_text(json.dumps(inter))
    (folder / "Songs.item.json").write_text(json.dumps(items))
    (folder / "sid-rqvae" / "Songs.index.json").write_text(json.dumps(codes))
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(dataset folder, trained model folder, {user id: history of item ids})."""
    root = tmp_path_factory.mktemp("recommend")
    data = write_named_dataset(root / "songs")
    invoke("index", "--data", data, "--out", root / "index.json")
    invoke("train", "generative", "--data", data, "--index", root / "index.json", "--out",
           root / "run", *TINY)
    histories = json.loads((data / "Songs.inter.json").read_text())
    return data, root / "run", histories


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_user_in_the_tables_ids(trained: tuple[Path, Path, dict], tmp_path: Path) -> None:
    data, run, histories = trained
    out = tmp_path / "recs.jsonl"
    printed = invoke("recommend", "--model", run, "--data", data, "--out", out, "--n", "5",
                     "--beam-width", "8", *JOB)
    assert f"{N_USERS} users in" in printed and "users/s" in printed
    lines = read_lines(out)
    assert [line["user_id"] for line in lines] == sorted(histories)
    engine = Engine.from_pretrained(run / "model")  # the run's final model, its item weight
    ids = engine.vocab.index.item_ids
    for line in lines:
        history = histories[line["user_id"]]
        rows = [ids.index(i) for i in history]
        want = engine.recommend_rows([RowRequest(rows, exclude=sorted(set(rows)))],
                                BeamParams(8, 5))[0]
        assert line["items"] == [ids[i] for i in want.items]
        assert line["scores"] == pytest.approx(want.scores, abs=1e-4)
        assert all(i.startswith("song-") for i in line["items"]) and len(line["items"]) == 5
        assert not set(line["items"]) & set(history)
        assert line["scores"] == sorted(line["scores"], reverse=True)


def test_users_file_and_history(trained: tuple[Path, Path, dict], tmp_path: Path) -> None:
    data, run, histories = trained
    users = tmp_path / "users.txt"
    users.write_text("user-07\n\nuser-02\nuser-07\n")
    out = tmp_path / "some.jsonl"
    invoke("recommend", "--model", run, "--data", data, "--out", out, "--users", users,
           "--n", "20", "--include-history", *JOB)
    lines = read_lines(out)
    assert [line["user_id"] for line in lines] == ["user-07", "user-02"]
    assert any(set(line["items"]) & set(histories[line["user_id"]]) for line in lines)


@pytest.mark.parametrize(("args", "message"), [
    (["--users", "USERS"], "2 user ids not in the dataset: 'user-99', 'nobody'"),
    (["--n", "30", "--beam-width", "10"], "n (30) must not exceed beam_width (10)"),
    (["--item-store", "x"], "--item-store goes with --ranker"),
    (["--ranker", "MODEL"], "not a DuoLM student"),
])
def test_errors_are_named(trained: tuple[Path, Path, dict], tmp_path: Path, args: list[str],
                          message: str) -> None:
    data, run, _ = trained
    users = tmp_path / "users.txt"
    users.write_text("user-01\nuser-99\nnobody\n")
    args = [str(users) if a == "USERS" else str(run) if a == "MODEL" else a for a in args]
    out = tmp_path / "recs.jsonl"
    result = runner.invoke(app, ["recommend", "--model", str(run), "--data", str(data),
                                 "--out", str(out), *args, *JOB])
    assert result.exit_code != 0 and message in " ".join(result.output.split()), result.output
    assert not out.exists()


def test_ranker_reranks_the_beam(trained: tuple[Path, Path, dict], tmp_path: Path) -> None:
    """--ranker: each user's --beam-width items ordered by the DuoLM student's scores, the best
    --n kept (the same items as the beam, in the ranker's order); the catalog encoded on the
    spot or read from an item store gives the same answer."""
    from genrec.commands.eval_ranker import load_student
    from genrec.data import load_json_dataset
    from genrec.duolm.requests import RankRequest

    data, run, _ = trained
    duo = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1",
           "--max-history", "5", "--negatives", "4", "--users-per-step", "8", "--val-users",
           "6", "--val-negatives", "9", "--no-progress", "--device", "cpu", "--epochs", "1"]
    teacher, student = tmp_path / "teacher", tmp_path / "student"
    invoke("train", "teacher", "--data", data, "--out", teacher, "--max-title-tokens", "4",
           "--max-text-tokens", "8", *duo)
    invoke("train", "duolm", "--data", data, "--out", student, "--teacher", teacher,
           "--backend", "decoder", "--max-text-tokens", "8", *duo)
    plain, ranked, stored = (tmp_path / f"{n}.jsonl" for n in ("plain", "ranked", "stored"))
    invoke("recommend", "--model", run, "--data", data, "--out", plain, "--n", "8", *JOB)
    invoke("recommend", "--model", run, "--data", data, "--out", ranked, "--n", "3",
           "--beam-width", "8", "--ranker", student, *JOB)
    invoke("encode-catalog", "--model", student, "--data", data, "--out", tmp_path / "store",
           "--no-progress", "--device", "cpu")
    invoke("recommend", "--model", run, "--data", data, "--out", stored, "--n", "3",
           "--beam-width", "8", "--ranker", student, "--item-store", tmp_path / "store", *JOB)
    ds = load_json_dataset(data)
    ranker = load_student(student / "best", None, ds, False, "cpu")
    for beam, line, again in zip(read_lines(plain), read_lines(ranked), read_lines(stored),
                                 strict=True):
        history = ds.sequences[ds.user_ids.index(beam["user_id"])]
        ranking = ranker.rank([RankRequest([ds.item_ids[h] for h in history],
                                           beam["items"])])[0]  # the public id path
        assert sorted(ranking.items) == sorted(beam["items"]) and not ranking.ignored
        assert line["items"] == ranking.items[:3]
        assert line["scores"] == pytest.approx(ranking.scores[:3], abs=1e-5)
        assert again["items"] == line["items"]

