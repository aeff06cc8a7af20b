"""The plain-PyTorch BERT encoder: transformers' BertModel outputs, strict loading, context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from genrec.model.bert import (
    BertConfig,
    BertEncoder,
    load_bert_weights,
    read_bert_config,
    save_bert,
)


def tiny_bert(path: Path, seed: int = 0, vocab_size: int = 120) -> Path:
    """A random transformers BertModel saved as published checkpoints are (pooler included)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64)
    transformers.BertModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


def loaded(path: Path) -> BertEncoder:
    model = BertEncoder(read_bert_config(path))
    load_bert_weights(model, path, allow_unused=True)
    return model.eval()


def full_mask(b: int, t: int) -> torch.Tensor:
    return torch.ones(b, t, t, dtype=torch.bool)


def test_matches_transformers_bert_model(tmp_path: Path) -> None:
    import transformers

    path = tiny_bert(tmp_path / "bert")
    reference = transformers.BertModel.from_pretrained(path).eval()
    ids = torch.randint(0, 120, (2, 11))
    with torch.no_grad():
        want = reference(input_ids=ids).last_hidden_state
        got, kv = loaded(path)(ids, torch.arange(11).expand(2, 11), torch.zeros_like(ids),
                               full_mask(2, 11))
    assert torch.allclose(got, want, atol=1e-5)
    assert kv == []  # keys and values only when asked


def test_context_keys_equal_one_sequence_under_the_same_mask(tmp_path: Path) -> None:
    model = loaded(tiny_bert(tmp_path / "bert"))
    prefix, tail = torch.randint(0, 120, (1, 6)), torch.randint(0, 120, (1, 4))
    seq = torch.cat([prefix, tail], 1)
    mask = full_mask(1, 10)
    mask[0, :6, 6:] = False  # the prefix does not see the tail
    segments = torch.tensor([[0] * 6 + [1] * 4])
    with torch.no_grad():
        whole, _ = model(seq, torch.arange(10)[None], segments, mask)
        head, kv = model(prefix, torch.arange(6)[None], segments[:, :6], full_mask(1, 6),
                         keep_kv=True)
        rest, _ = model(tail, torch.arange(6, 10)[None], segments[:, 6:],
                        torch.ones(1, 4, 10, dtype=torch.bool), context=kv)
    assert torch.allclose(whole[:, :6], head, atol=1e-5)
    assert torch.allclose(whole[:, 6:], rest, atol=1e-5)


def test_loading_is_strict(tmp_path: Path) -> None:
    path = tiny_bert(tmp_path / "bert")
    model = BertEncoder(read_bert_config(path))
    with pytest.raises(ValueError, match="unexpected"):
        load_bert_weights(model, path)  # the pooler is only allowed when asked
    tensors = load_file(str(path / "model.safetensors"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((path / "config.json").read_text())
    save_file({k: v for k, v in tensors.items() if "layer.1.output.dense" not in k},
              str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        load_bert_weights(model, broken, allow_unused=True)
    tensors["embeddings.word_embeddings.weight"] = torch.zeros(121, 32)
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="shape"):
        load_bert_weights(model, broken, allow_unused=True)


def test_config_is_strict_and_round_trips(tmp_path: Path) -> None:
    path = tiny_bert(tmp_path / "bert")
    config = read_bert_config(path)
    assert (config.hidden_size, config.num_hidden_layers) == (32, 2)
    with pytest.raises(ValueError, match="unknown BERT config keys"):
        BertConfig.from_dict({**json.loads((path / "config.json").read_text()), "rope": 1})
    with pytest.raises(ValueError, match="is_decoder"):
        BertConfig.from_dict({"is_decoder": True})
    with pytest.raises(ValueError, match="gelu"):
        BertConfig(hidden_act="relu")
    with pytest.raises(ValueError, match="absolute"):
        BertConfig(position_embedding_type="relative_key")
    model = loaded(path)
    save_bert(model, config, tmp_path / "copy")
    again = BertEncoder(read_bert_config(tmp_path / "copy"))
    load_bert_weights(again, tmp_path / "copy")  # strict: exactly the model's tensors
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items(),
                                strict=True):
        assert k == k2 and torch.equal(v, v2)
