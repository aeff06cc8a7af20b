"""A BERT encoder in plain PyTorch (all-MiniLM-L6-v2 and other ``BertModel`` checkpoints).

Hugging Face's names and ``config.json`` keys, loaded strictly, so a published BERT checkpoint
loads as is and what genrec writes is a ``BertModel`` checkpoint plus its own head. Unlike
``transformers.BertModel`` the forward takes any [B, T, T] attention pattern and explicit
positions and segments, which multi-item scoring needs (each candidate attends to the shared
prefix and to itself, its positions continuing the prefix's).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from genrec.utils.atomic import atomic_write, atomic_write_json
from genrec.utils.strict import strict_from_dict

WEIGHTS_FILE = "model.safetensors"
# config.json keys of published BERT checkpoints that describe nothing this encoder needs
_IGNORED_KEYS = {"_name_or_path", "architectures", "transformers_version", "gradient_checkpointing",
                 "use_cache", "initializer_range", "pad_token_id", "classifier_dropout",
                 "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "tie_word_embeddings"}
# keys that must be false: an encoder without cross-attention
_FALSE_KEYS = ("is_decoder", "add_cross_attention")
# tensors of published checkpoints this encoder does not use (the [CLS] pooler, a buffer)
_UNUSED_TENSORS = ("pooler.", "embeddings.position_ids")


@dataclass
class BertConfig:
    """A BERT ``config.json`` (unknown keys are rejected, except those in ``_IGNORED_KEYS``)."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    model_type: str = "bert"
    position_embedding_type: str = "absolute"

    def __post_init__(self) -> None:
        if self.model_type != "bert" or self.position_embedding_type != "absolute":
            raise ValueError("only BERT checkpoints with absolute positions are supported, got "
                             f"{self.model_type} / {self.position_embedding_type}")
        if self.hidden_act != "gelu":
            raise ValueError(f"hidden_act must be gelu, got {self.hidden_act!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        for key in _FALSE_KEYS:
            if data.get(key):
                raise ValueError(f"BERT config: {key} must be false (an encoder only)")
        data = {k: v for k, v in data.items() if k not in _FALSE_KEYS}
        return strict_from_dict(cls, {k: v for k, v in data.items() if k not in _IGNORED_KEYS},
                                "BERT config")

    def to_dict(self) -> dict[str, Any]:
        return {"architectures": ["BertModel"], **asdict(self)}


def _layer(c: BertConfig) -> nn.ModuleDict:
    h, norm = c.hidden_size, lambda: nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
    return nn.ModuleDict({
        "attention": nn.ModuleDict({
            "self": nn.ModuleDict({"query": nn.Linear(h, h), "key": nn.Linear(h, h),
                                   "value": nn.Linear(h, h)}),
            "output": nn.ModuleDict({"dense": nn.Linear(h, h), "LayerNorm": norm()}),
        }),
        "intermediate": nn.ModuleDict({"dense": nn.Linear(h, c.intermediate_size)}),
        "output": nn.ModuleDict({"dense": nn.Linear(c.intermediate_size, h), "LayerNorm": norm()}),
    })


class BertEncoder(nn.Module):
    """Token, position and segment embeddings, then post-LayerNorm transformer layers."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        c, h = config, config.hidden_size
        self.config = c
        self.embeddings = nn.ModuleDict({
            "word_embeddings": nn.Embedding(c.vocab_size, h),
            "position_embeddings": nn.Embedding(c.max_position_embeddings, h),
            "token_type_embeddings": nn.Embedding(c.type_vocab_size, h),
            "LayerNorm": nn.LayerNorm(h, eps=c.layer_norm_eps),
        })
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(
            _layer(c) for _ in range(c.num_hidden_layers))})
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor,
        mask: torch.Tensor, context: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        keep_kv: bool = False,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Hidden states [B, T, H] of ``input_ids`` [B, T] at ``positions`` / ``segments``
        [B, T], and (``keep_kv``) each layer's keys and values [B, heads, T, head_dim].

        ``mask`` [B, T, S] bool: token i may attend to key j (every row needs one). Without
        ``context`` S = T; with it, ``context[l]`` (keys, values [B, heads, P, head_dim] of
        layer l, e.g. a shared prefix's) come before the row's own keys and S = P + T.
        """
        e = self.embeddings
        x = (e["word_embeddings"](input_ids) + e["position_embeddings"](positions)
             + e["token_type_embeddings"](segments))
        x = self.dropout(e["LayerNorm"](x))
        b, t, h = x.shape
        heads = self.config.num_attention_heads
        p_attn = self.config.attention_probs_dropout_prob if self.training else 0.0
        attn_mask = mask[:, None]  # [B, 1, T, T]
        kvs = []
        for i, layer in enumerate(self.encoder["layer"]):
            sa, ao = layer["attention"]["self"], layer["attention"]["output"]
            q, k, v = (sa[n](x).view(b, t, heads, h // heads).transpose(1, 2)
                       for n in ("query", "key", "value"))  # [B, heads, T, head_dim]
            if keep_kv:
                kvs.append((k, v))
            if context is not None:
                k, v = torch.cat([context[i][0], k], 2), torch.cat([context[i][1], v], 2)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p_attn)
            a = a.transpose(1, 2).reshape(b, t, h)
            x = ao["LayerNorm"](x + self.dropout(ao["dense"](a)))
            inner = F.gelu(layer["intermediate"]["dense"](x))
            x = layer["output"]["LayerNorm"](x + self.dropout(layer["output"]["dense"](inner)))
        return x, kvs


def read_bert_config(path: str | Path) -> BertConfig:
    return BertConfig.from_dict(json.loads((Path(path) / "config.json").read_text()))


def load_bert_weights(module: nn.Module, path: str | Path, allow_unused: bool = False) -> None:
    """Load ``path``'s ``model.safetensors`` into ``module`` strictly: every parameter must be
    there with its shape; tensors it does not have are an error unless ``allow_unused`` (then
    only a published checkpoint's pooler and position-id buffer may be left over)."""
    tensors = load_file(str(Path(path) / WEIGHTS_FILE))
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    extra = sorted(k for k in set(tensors) - set(own)
                   if not (allow_unused and k.startswith(_UNUSED_TENSORS)))
    if missing or extra:
        raise ValueError(f"{path}: checkpoint does not match the model (missing {missing[:5]}, "
                         f"unexpected {extra[:5]})")
    for k, v in own.items():
        if tensors[k].shape != v.shape:
            raise ValueError(f"{path}: {k} has shape {tuple(tensors[k].shape)}, the model "
                             f"{tuple(v.shape)}")
    module.load_state_dict({k: tensors[k].to(v.dtype) for k, v in own.items()})


def save_bert(module: nn.Module, config: BertConfig, path: str | Path) -> None:
    """``config.json`` and ``model.safetensors`` (every tensor of ``module``), atomically."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous().cpu() for k, v in module.state_dict().items()}
    atomic_write(path / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp)))
    atomic_write_json(path / "config.json", config.to_dict())
