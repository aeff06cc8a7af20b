"""Soft-token projector: a user vector -> one token embedding (Embedding-to-Prefix)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SoftTokenProjector(nn.Module):
    """Two-layer MLP with SiLU and a residual path: [N, user_dim] -> [N, hidden]."""

    def __init__(self, user_dim: int, hidden: int) -> None:
        super().__init__()
        self.user_dim = user_dim
        self.fc1 = nn.Linear(user_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm_scale = nn.Parameter(torch.ones(hidden))

    def forward(self, user: torch.Tensor) -> torch.Tensor:
        h = self.fc1(user)
        h = h + self.fc2(F.silu(h))
        return F.rms_norm(h, (h.shape[-1],)) * self.norm_scale
