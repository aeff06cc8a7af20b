"""The generative model's size, dropout and schedule picked from the data size.

``genrec train generative`` uses :func:`recipe_for` for every one of these settings the user
does not give. The measure of data is the number of training interactions (all of each
user's items but the last two, which leave-one-out keeps for validation and test).

Where the tiers come from (docs/results.md): on amazon18-scientific (41,858 training
interactions) and amazon14-beauty (153,776), a 1.92M-parameter model (hidden 192, 6 heads of
32, 4 layers) with dropout 0.15 over 30 epochs beat the 0.92M model without dropout on
validation and test on both. The tier below keeps the 0.92M model without dropout (no run
here says otherwise for small data); the tier above follows the measured direction (a larger
model, as TIGER's 13M parameters at Beauty's scale) and has not been measured here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """Model shape (``head_dim`` x ``heads`` need not equal ``hidden``, as in Qwen3), dropout
    on the embeddings and residual branches, and epochs."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dropout: float
    epochs: int
    tier: str

    def describe(self) -> str:
        return (f"{self.tier}: hidden {self.hidden}, {self.layers} layers, {self.heads} heads "
                f"of {self.head_dim} ({self.kv_heads} KV), dropout {self.dropout}, "
                f"{self.epochs} epochs")


SMALL = Recipe(128, 4, 4, 2, 32, 0.0, 20, "small data (< 20k training interactions)")
MEDIUM = Recipe(192, 4, 6, 2, 32, 0.15, 30, "medium data (20k-500k training interactions)")
LARGE = Recipe(256, 6, 8, 2, 32, 0.1, 20, "large data (>= 500k training interactions)")


def recipe_for(train_interactions: int) -> Recipe:
    """The recipe for a dataset of ``train_interactions`` training interactions."""
    if train_interactions < 0:
        raise ValueError(f"train_interactions: must be >= 0, got {train_interactions}")
    if train_interactions < 20_000:
        return SMALL
    return MEDIUM if train_interactions < 500_000 else LARGE
