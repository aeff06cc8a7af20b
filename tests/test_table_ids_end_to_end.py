"""A user's own tables, end to end in real processes: string ids (and MovieLens' integer ids)
go ``genrec index --from-text`` -> ``genrec train generative`` -> ``genrec serve`` -> the
``genrec recommend`` batch job, and only the tables' ids are ever seen; a new item added by its
text through ``PUT /v1/catalog/items`` is recommended at once."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest
from serving_support import post
from test_commands_serve import start
from test_commands_train_generative import invoke

TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
        "--batch-tokens", "400", "--max-history", "5", "--val-users", "0", "--no-progress",
        "--device", "cpu", "--epochs", "1"]
GENRES = ["jazz", "rock", "folk", "techno"]


def write_tables(folder: Path, movielens: bool
                 ) -> tuple[Path, Path, dict[str, list[str]], list[str]]:
    """events + items tables (and the users' histories, every item id); string ids
    (``u-007``, ``B0…``) or MovieLens' integer ones."""
    rng = random.Random(0)
    items = [str(10 * k + 1) if movielens else f"B{k:04d}XQ" for k in range(40)]
    users = [str(u + 1) if movielens else f"u-{u:03d}" for u in range(25)]
    history = {u: [items[(j % 4) * 10 + rng.randrange(10)] for _ in range(rng.randrange(4, 8))]
               for j, u in enumerate(users)}
    folder.mkdir(parents=True, exist_ok=True)
    events, table = folder / "events.csv", folder / "items.csv"
    head = "userId,movieId,rating,timestamp" if movielens else "user_id,item_id,timestamp"
    rows = [head] + [f"{u},{i},4,{1_700_000_000 + t}" if movielens else
                     f"{u},{i},{1_700_000_000 + t}"
                     for u, seq in history.items() for t, i in enumerate(seq)]
    events.write_text("\n".join(rows) + "\n")
    names = "movieId,title,genres" if movielens else "item_id,title"
    lines = [names] + [f"{i},{GENRES[k // 10]} record {k},{GENRES[k // 10]}" if movielens
                       else f"{i},{GENRES[k // 10]} record number {k}"
                       for k, i in enumerate(items)]
    table.write_text("\n".join(lines) + "\n")
    return events, table, history, items


@pytest.mark.parametrize("movielens", [False, True], ids=["string-ids", "movielens-ids"])
def test_index_train_serve_and_batch_speak_the_tables_ids(tmp_path: Path,
                                                          movielens: bool) -> None:
    events, items, history, catalog = write_tables(tmp_path / "data", movielens)
    known = set(catalog)  # every item of the items table is in the index
    index, model = tmp_path / "index.json", tmp_path / "model"
    invoke("index", "--interactions", events, "--items", items, "--from-text", "--levels", "2",
           "--codebook-size", "4", "--out", index)
    invoke("train", "generative", "--interactions", events, "--items", items, "--index", index,
           "--out", model, *TINY)
    user, seq = next(iter(history.items()))
    proc, url = start(model)
    try:
        ids = [int(i) for i in seq] if movielens else list(seq)  # JSON ints name the same ids
        r = post(url, "/v1/recommend", {"history": [*ids, "never-seen"], "n": 5,
                                        "beam_width": 10})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["ignored"] == ["never-seen"]
        assert len(answer["items"]) == 5 and set(answer["items"]) <= known
        # a new item by its text: an ID from the saved codebooks, recommendable at once
        r = httpx.put(url + "/v1/catalog/items", json={"items": [
            {"item_id": "new-1", "text": f"{GENRES[0]} record number 99"}]}, timeout=120)
        assert r.status_code == 200, r.text
        assert list(r.json()["semantic_ids"]) == ["new-1"]
        r = post(url, "/v1/recommend", {"history": ids, "allow": ["new-1"], "n": 1,
                                        "beam_width": 4})
        assert r.status_code == 200 and r.json()["items"] == ["new-1"], r.text
    finally:
        proc.kill()
        proc.wait(30)
    out = tmp_path / "recs.jsonl"
    invoke("recommend", "--model", model, "--interactions", events, "--items", items,
           "--n", "5", "--out", out, "--no-progress", "--device", "cpu")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["user_id"] for line in lines} == set(history)
    for line in lines:
        seen = set(history[line["user_id"]])
        assert set(line["items"]) <= known and not set(line["items"]) & seen
