"""Initial weights: normal linear and embedding weights, zero biases."""

from __future__ import annotations

import torch
from torch import nn

from genrec.training.initialization import init_weights


def test_linear_and_embedding_weights_normal_biases_zero() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(400, 64), nn.Linear(64, 300), nn.LayerNorm(300))
    with torch.no_grad():
        model[2].weight.fill_(3.0)
    init_weights(model, std=0.05)
    for w in (model[0].weight, model[1].weight):
        assert abs(w.std().item() - 0.05) < 0.005 and abs(w.mean().item()) < 0.005
    assert torch.count_nonzero(model[1].bias) == 0
    assert torch.all(model[2].weight == 3.0)  # other modules keep theirs
