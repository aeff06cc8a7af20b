"""Training a tiny decoder from scratch on Semantic-ID token sequences (next-token
cross-entropy): a user's sequence is ``SidVocab.prompt(items)``, ``bos sid(i_1) sid(i_2) ...``,
the same prompt the engine builds when it serves, so every SID token after ``bos`` is a target.

Sequences of a batch are packed one after another into a single forward
(``build_layout([L1, L2, ...], [], [])``): each is its own causal sequence, so no padding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from genrec.model import DecoderLM, ModelConfig, build_layout
from genrec.training.initialization import init_weights


def tiny_config(vocab_size: int, max_positions: int = 64) -> ModelConfig:
    """A tiny Qwen3-architecture config: hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16."""
    return ModelConfig(
        architecture="Qwen3ForCausalLM", vocab_size=vocab_size, hidden_size=64,
        intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions,
        rope_theta=10000.0, tie_word_embeddings=True,
    )


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation budget and hyper-parameters (a fixed number of steps, seeded)."""

    steps: int = 300
    batch_size: int = 64
    lr: float = 5e-3
    weight_decay: float = 0.01
    warmup: int = 20
    seed: int = 0


def pack_batch(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Token sequences -> (packed ids [T], next-token targets [T] with -100 at each sequence's
    last token, lengths)."""
    lengths = [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    targets = torch.tensor(
        [t for s in seqs for t in (*s[1:], -100)], dtype=torch.long
    )
    return ids, targets, lengths


def sequence_loss(model: DecoderLM, seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Mean next-token cross-entropy over the packed sequences ``seqs``."""
    ids, targets, lengths = pack_batch(seqs)
    layout = build_layout(lengths, [], []).to(model.device)
    embeds = model.model.embed_tokens(ids.to(model.device))
    hidden = model(embeds, layout.positions, layout)
    return F.cross_entropy(model.logits(hidden), targets.to(model.device), ignore_index=-100)


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def train_model(
    model_config: ModelConfig, sequences: Sequence[Sequence[int]], cfg: TrainConfig,
    progress: bool = True,
) -> tuple[DecoderLM, list[float]]:
    """Train a fresh :class:`DecoderLM` on token ``sequences`` for ``cfg.steps`` steps.

    Each step draws ``cfg.batch_size`` sequences at random (seeded). Returns the model (in eval
    mode) and the loss of every step.
    """
    if not sequences:
        raise ValueError("no training sequences")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = DecoderLM(model_config)
    init_weights(model)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay,
                                                               "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: _lr_factor(s, cfg))
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc="train", disable=not progress, leave=True)
    for _ in bar:
        pick = rng.choice(len(sequences), size=min(cfg.batch_size, len(sequences)), replace=False)
        loss = sequence_loss(model, [sequences[i] for i in pick])
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    return model.eval(), losses
