"""The parameters of the Engine's calls, as dataclasses: scoring and beam search."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from genrec.utils.atomic import atomic_write_json

ScoreMode = Literal["labels", "loglik", "head"]


@dataclass
class ScoreParams:
    """How a candidate is scored, read at its last position.

    - ``labels``: log-probabilities of ``label_token_ids`` (full-vocabulary log-softmax), or with
      ``apply_softmax`` the softmax over the label logits alone (SGLang ``/v1/score``).
      Result per candidate: [len(label_token_ids)].
    - ``loglik``: summed log-likelihood of the candidate's tokens given the prefix. Result: scalar.
    - ``head``: the model's scalar score head. Result: scalar.
    """

    mode: ScoreMode = "labels"
    label_token_ids: list[int] | None = None
    apply_softmax: bool = False

    def validate(self, vocab_size: int, has_score_head: bool) -> None:
        if self.mode not in ("labels", "loglik", "head"):
            raise ValueError(f"mode must be 'labels', 'loglik' or 'head', got {self.mode!r}")
        if self.mode == "labels":
            ids = self.label_token_ids
            if not ids:
                raise ValueError("label_token_ids must be a non-empty list in 'labels' mode")
            bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < vocab_size]
            if bad:
                raise ValueError(f"label_token_ids {bad} are not text tokens (0..{vocab_size - 1})")
        if self.mode == "head" and not has_score_head:
            raise ValueError("mode 'head' needs a model with a score head")


MAX_BEAM_WIDTH = 1024


# the head's weight of a model that saved none (amazon18-scientific, amazon14-beauty:
# docs/results.md); training chooses each model's own on validation
DEFAULT_ITEM_WEIGHT = 3.0
# a checkpoint's ranking defaults, as HF keeps generation defaults beside config.json
GENERATION_CONFIG = "generation_config.json"


def saved_item_weight(folder: str | Path) -> float | None:
    """The item weight a checkpoint folder's ``generation_config.json`` holds (None: none)."""
    path = Path(folder) / GENERATION_CONFIG
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("item_weight")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < float("inf"):
        raise ValueError(f"{path}: item_weight must be a finite number >= 0, got {value!r}")
    return float(value)


def save_item_weight(folder: str | Path, weight: float) -> None:
    """Record ``weight`` as the checkpoint's item weight (``generation_config.json``, other
    keys kept; written atomically)."""
    path = Path(folder) / GENERATION_CONFIG
    data = json.loads(path.read_text()) if path.is_file() else {}
    atomic_write_json(path, data | {"item_weight": float(weight)})


@dataclass
class BeamParams:
    """Constrained beam search: ``beam_width`` beams (<= 1024), the best ``n`` items returned.
    ``item_weight``: for a model with an item head, the beam's proposals, pooled with the
    head's ``head_proposals`` best items (default: ``beam_width``; 0: none), are ranked by
    ``log p(Semantic IDs) + item_weight * log p_head(item)`` (0: the Semantic IDs alone, the
    beam's order; None: the engine's, by default the model's own). See
    :mod:`genrec.engine.item_ranking`."""

    beam_width: int = 20
    n: int = 10
    item_weight: float | None = None
    head_proposals: int | None = None

    def validate(self) -> None:
        for name in ("beam_width", "n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.beam_width > MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width {self.beam_width} is over the limit of {MAX_BEAM_WIDTH}")
        if self.n > self.beam_width:
            raise ValueError(f"n ({self.n}) must not exceed beam_width ({self.beam_width})")
        w = self.item_weight
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float))
                              or not 0.0 <= w < float("inf")):
            raise ValueError(f"item_weight must be a finite number >= 0, got {self.item_weight!r}")
        h = self.head_proposals
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or not
                              0 <= h <= MAX_BEAM_WIDTH):
            raise ValueError(f"head_proposals must be an integer in [0, {MAX_BEAM_WIDTH}], "
                             f"got {h!r}")
