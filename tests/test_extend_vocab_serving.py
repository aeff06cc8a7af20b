"""A vocabulary-extended model served (``/v1/completions`` with text + Semantic-ID prompts,
``/v1/recommend``) and the ``train generative --init-from --extend-vocab`` command end to end."""

from __future__ import annotations

from pathlib import Path

import torch
from extend_vocab_support import N_ITEMS, SIZES, TEXT, extended_model, write_checkpoint

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.embeddings import bundled_model_path
from genrec.engine import RowRequest
from genrec.training.extend_vocab import encode_text, load_text_tokenizer
from genrec.vocab.sid_vocab import SidVocab


def test_completions_accept_mixed_text_and_sid_prompts(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from genrec.serving import create_app
    from genrec.serving.completions import item_text

    model, vocab = extended_model(write_checkpoint(tmp_path, tied=False))
    engine = Engine(model, config=EngineConfig(soft_token_id=vocab.soft_id), vocab=vocab)
    tok = load_text_tokenizer(bundled_model_path())
    history, query = [5, 11], "Looking for a microscope."
    sids = "".join(item_text(engine.catalog, i).replace(" ", "") for i in history)
    with torch.inference_mode():
        [want] = engine.recommend_rows([RowRequest(history, text=encode_text(tok, query))],
                                  BeamParams(beam_width=8, n=3))
        [plain] = engine.recommend_rows([RowRequest(history)], BeamParams(beam_width=8, n=3))
    with TestClient(create_app(engine, tokenizer=tok)) as http:
        body = {"prompt": f"{query} {sids}", "use_beam_search": True, "n": 3, "best_of": 8}
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        got = r.json()
        assert [c["item_id"] for c in got["choices"]] == [str(i) for i in want.items]
        assert got["usage"]["prompt_tokens"] == len(encode_text(tok, query)) + 2 * len(SIZES)
        ids = vocab.prompt(history, text=encode_text(tok, query))  # the same as token ids
        r = http.post("/v1/completions", json={**body, "prompt": ids})
        assert [c["item_id"] for c in r.json()["choices"]] == [str(i) for i in want.items]
        r = http.post("/v1/completions", json={**body, "prompt": sids})  # default text
        assert [c["item_id"] for c in r.json()["choices"]] == [str(i) for i in plain.items]
        r = http.post("/v1/recommend", json={"history": history, "n": 3, "beam_width": 8})
        assert r.status_code == 200 and r.json()["items"] == [str(i) for i in plain.items]
        r = http.post("/v1/completions", json={**body, "prompt": f"{sids} and then text"})
        assert r.status_code == 422 and "text must come before" in r.text
    with TestClient(create_app(engine)) as http:  # no tokenizer: text is refused, by field
        r = http.post("/v1/completions", json={**body, "prompt": f"{query} {sids}"})
        assert r.status_code == 400 and "prompt" in r.text and "tokenizer" in r.text


def test_train_extend_vocab_command_end_to_end(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from genrec.cli import app

    ckpt = write_checkpoint(tmp_path / "lm", tied=True)
    data = tmp_path / "toy"
    (data / "sid-rqvae").mkdir(parents=True)
    inter = {str(u): [(u % 4) * 10 + (u + j) % 10 for j in range(5 + u % 3)] for u in range(24)}
    items = {str(i): {"title": f"{['lens', 'flask', 'scale', 'laser'][i // 10]} {i}"}
             for i in range(N_ITEMS)}
    codes = {str(i): [f"<a_{i // 10}>", f"<b_{i % 10}>"] for i in range(N_ITEMS)}
    (data / "Toy.inter.json").write_text(json.dumps(inter))
    (data / "Toy.item.json").write_text(json.dumps(items))
    (data / "sid-rqvae" / "Toy.index.json").write_text(json.dumps(codes))
    runner = CliRunner()

    def invoke(*args: object) -> str:
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output + repr(result.exception)
        return result.output

    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    run = tmp_path / "run"
    common = ["--data", data, "--index", tmp_path / "index.json", "--out", run, "--init-from",
              ckpt, "--extend-vocab", "--max-history", "4", "--val-users", "6", "--beam-width",
              "12", "--batch-tokens", "400", "--no-progress", "--device", "cpu"]
    out = invoke("train", "generative", *common, "--epochs", "1", "--sid-init", "text",
                 "--prompt-text", TEXT)
    assert "best epoch" in out
    best = run / "best"
    vocab = SidVocab.load(best)
    assert vocab.text_vocab == 30522 and vocab.text_ids
    assert load_text_tokenizer(best).encode(TEXT) == load_text_tokenizer(ckpt).encode(TEXT)
    invoke("train", "generative", *common, "--epochs", "2", "--resume")
    assert SidVocab.load(run / "last").base == vocab.base
    out = invoke("eval", "--model", run, "--data", data, "--beam-width", "12", "--no-progress",
                 "--device", "cpu")
    assert "ndcg@10" in out
    result = runner.invoke(app, [str(a) for a in ["train", "generative", "--data", data,
                                                  "--index", tmp_path / "index.json", "--out",
                                                  tmp_path / "x", "--extend-vocab"]])
    assert result.exit_code == 1 and "--extend-vocab needs --init-from" in result.output
