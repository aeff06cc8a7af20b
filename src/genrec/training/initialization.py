"""Initial weights of models trained from scratch (and of rows added to pretrained ones)."""

from __future__ import annotations

from torch import nn


def init_weights(model: nn.Module, std: float = 0.02) -> None:
    """Normal(0, std) linear and embedding weights, zero biases (as HF initialises)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
