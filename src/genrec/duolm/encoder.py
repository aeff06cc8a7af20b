"""DuoLM item encoder: an item's text -> k vectors in the ranker's hidden size.

Two backends (``EncoderConfig.backend``):

- ``minilm``: the bundled all-MiniLM-L6-v2 sentence encoder (frozen) embeds the text once;
  a trained MLP maps that embedding to k vectors. The frozen embeddings are the item
  *features*, computed once per catalog and cached.
- ``decoder``: a small Qwen3-architecture decoder over the text's WordPiece tokens followed by
  k learned summary tokens; the summary tokens' last hidden states, projected, are the k
  vectors. The token ids are the features; the whole encoder trains end to end.

Either way :meth:`ItemEncoder.forward` is differentiable, so encoder and ranker train together.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from genrec.duolm.prompts import NO_TEXT
from genrec.model.config import ModelConfig
from genrec.model.decoder import DecoderLM
from genrec.model.layout import build_layout
from genrec.utils.atomic import atomic_write, atomic_write_json
from genrec.utils.strict import strict_from_dict

CONFIG_FILE = "encoder_config.json"
WEIGHTS_FILE = "encoder.safetensors"
BACKENDS = ("minilm", "decoder")


@dataclass
class EncoderConfig:
    """Item-encoder settings; unknown keys are rejected on load."""

    backend: str = "minilm"
    k: int = 2
    hidden_size: int = 128  # the ranker's hidden size (output)
    max_text_tokens: int = 128
    feature_dim: int = 384  # minilm: sentence-embedding size
    inner_size: int = 512  # minilm: MLP width
    text_vocab_size: int = 30522  # decoder: WordPiece vocabulary
    enc_hidden: int = 128
    enc_layers: int = 2
    enc_heads: int = 4
    enc_kv_heads: int = 2

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "backend" and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{f.name} must be a positive integer, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        return strict_from_dict(cls, data, "encoder config")


@dataclass
class ItemFeatures:
    """Frozen per-item inputs of the encoder: sentence embeddings [N, feature_dim] (minilm) or
    token ids (decoder)."""

    embeddings: torch.Tensor | None = None
    token_ids: list[list[int]] | None = None

    @property
    def num_items(self) -> int:
        if self.embeddings is not None:
            return int(self.embeddings.shape[0])
        return len(self.token_ids or [])

    def _check_kind(self, other: ItemFeatures) -> None:
        if (self.embeddings is None) != (other.embeddings is None):
            raise ValueError("features: cannot combine sentence-embedding and token-id features")

    def extend(self, other: ItemFeatures) -> ItemFeatures:
        """Features of this catalog followed by ``other``'s items."""
        self._check_kind(other)
        if self.embeddings is not None and other.embeddings is not None:
            return ItemFeatures(embeddings=torch.cat([self.embeddings, other.embeddings]))
        return ItemFeatures(token_ids=list(self.token_ids or []) + list(other.token_ids or []))

    def replace(self, rows: Sequence[int], other: ItemFeatures) -> ItemFeatures:
        """A copy with items ``rows`` taking ``other``'s features (in order)."""
        self._check_kind(other)
        if self.embeddings is not None and other.embeddings is not None:
            emb = self.embeddings.clone()
            emb[torch.as_tensor(list(rows), dtype=torch.long)] = other.embeddings
            return ItemFeatures(embeddings=emb)
        ids = list(self.token_ids or [])
        for r, t in zip(rows, other.token_ids or [], strict=True):
            ids[r] = t
        return ItemFeatures(token_ids=ids)


def compute_features(
    config: EncoderConfig, texts: Sequence[str], progress: bool = True, batch_size: int = 64,
) -> ItemFeatures:
    """Frozen features of item texts for ``config.backend`` (empty text: ``"(no text)"``)."""
    from genrec.catalog.embeddings import SentenceEncoder, bundled_model_path

    texts = [t if t.strip() else NO_TEXT for t in texts]
    if config.backend == "minilm":
        enc = SentenceEncoder(max_length=config.max_text_tokens)
        if enc.dim != config.feature_dim:
            raise ValueError(f"feature_dim {config.feature_dim} != sentence encoder's {enc.dim}")
        return ItemFeatures(embeddings=enc.encode(texts, batch_size, progress))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bundled_model_path(), local_files_only=True)
    if len(tok) > config.text_vocab_size:
        raise ValueError(f"text_vocab_size {config.text_vocab_size} < the tokenizer's {len(tok)}")
    ids = tok(list(texts), add_special_tokens=False, truncation=True,
              max_length=config.max_text_tokens)["input_ids"]
    return ItemFeatures(token_ids=[list(t) for t in ids])


class ItemEncoder(nn.Module):
    """features of items -> [n, k, hidden_size] item representations (differentiable)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        if c.backend == "minilm":
            self.fc1 = nn.Linear(c.feature_dim, c.inner_size)
            self.fc2 = nn.Linear(c.inner_size, c.k * c.hidden_size)
            self.decoder = None
        else:
            cfg = ModelConfig(
                vocab_size=c.text_vocab_size + c.k, hidden_size=c.enc_hidden,
                intermediate_size=3 * c.enc_hidden, num_hidden_layers=c.enc_layers,
                num_attention_heads=c.enc_heads, num_key_value_heads=c.enc_kv_heads,
                head_dim=c.enc_hidden // c.enc_heads, rope_theta=10000.0,
                max_position_embeddings=c.max_text_tokens + c.k, tie_word_embeddings=True,
            )
            self.decoder = DecoderLM(cfg)
            self.proj = nn.Linear(c.enc_hidden, c.hidden_size)
        self.out_scale = nn.Parameter(torch.ones(c.hidden_size))
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    @property
    def device(self) -> torch.device:
        return self.out_scale.device

    def forward(self, features: ItemFeatures, items: torch.Tensor) -> torch.Tensor:
        """Representations of ``items`` [n] (indices into ``features``) -> [n, k, hidden]."""
        c = self.config
        if c.backend == "minilm":
            if features.embeddings is None:
                raise ValueError("the minilm encoder needs sentence-embedding features")
            x = features.embeddings[items.cpu()].to(self.device, self.fc1.weight.dtype)
            h = self.fc2(F.gelu(self.fc1(x))).view(-1, c.k, c.hidden_size)
        else:
            h = self._decode(features, items.tolist())
        return F.rms_norm(h, (c.hidden_size,)) * self.out_scale

    def _decode(self, features: ItemFeatures, items: list[int]) -> torch.Tensor:
        c = self.config
        if features.token_ids is None:
            raise ValueError("the decoder encoder needs token-id features")
        if not items:  # the attention kernels need at least one sequence
            return self.proj.weight.new_zeros(0, c.k, c.hidden_size)
        summary = list(range(c.text_vocab_size, c.text_vocab_size + c.k))
        seqs = [features.token_ids[i][: c.max_text_tokens] + summary for i in items]
        lengths = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=self.device)
        layout = build_layout(lengths, [], []).to(self.device)
        hidden = self.decoder(self.decoder.model.embed_tokens(ids), layout.positions, layout)
        ends = torch.cumsum(torch.tensor(lengths), 0).to(self.device)
        rows = ends[:, None] - c.k + torch.arange(c.k, device=self.device)[None, :]  # [n, k]
        return self.proj(hidden[rows])

    @torch.no_grad()
    def encode_all(
        self, features: ItemFeatures, batch_size: int = 256, progress: bool = False,
    ) -> torch.Tensor:
        """Representations of every item: [N, k, hidden] fp32 on CPU."""
        from tqdm.auto import tqdm

        was_training = self.training
        self.eval()
        n = features.num_items
        out = torch.empty(n, self.config.k, self.config.hidden_size)
        for start in tqdm(range(0, n, batch_size), desc="encode items", unit="batch",
                          disable=not progress):
            idx = torch.arange(start, min(n, start + batch_size))
            out[idx] = self(features, idx).float().cpu()
        self.train(was_training)
        return out

    def save(self, path: str | Path) -> None:
        """Write ``encoder_config.json`` and ``encoder.safetensors`` atomically."""
        path = Path(path)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.decoder is not None:
            state.pop("decoder.lm_head.weight", None)  # tied to the embeddings
        atomic_write(path / WEIGHTS_FILE, lambda t: save_file(state, t))
        atomic_write_json(path / CONFIG_FILE, dataclasses.asdict(self.config))

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> ItemEncoder:
        """Load strictly: missing or unexpected weights are errors."""
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{path}: no {CONFIG_FILE} (not an item encoder)")
        config = EncoderConfig.from_dict(json.loads((path / CONFIG_FILE).read_text()))
        encoder = cls(config)
        state = load_file(path / WEIGHTS_FILE)
        if encoder.decoder is not None and "decoder.model.embed_tokens.weight" in state:
            state["decoder.lm_head.weight"] = state["decoder.model.embed_tokens.weight"]
        missing, unexpected = encoder.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path / WEIGHTS_FILE}: missing {missing}, unexpected {unexpected}")
        return encoder.to(device)
