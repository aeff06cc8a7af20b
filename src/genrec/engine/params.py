"""Parameters and requests of the public Engine API, as dataclasses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from genrec.engine.inputs import Part

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


@dataclass
class ScoreRequest:
    """One user: a shared prefix and the candidates to score after it."""

    prefix: Part
    candidates: Sequence[Part]
    user_vector: torch.Tensor | Sequence[float] | None = None


@dataclass
class EngineConfig:
    """Engine settings.

    ``soft_token_id``: the placeholder replaced by the user's soft token. ``max_batch_tokens``:
    requests packed into one scoring batch. ``chunk_tokens``: branches run in chunks of this
    many tokens after their prefixes (activations stay in cache; memory stays bounded).

    Beam search runs on static buffers per search shape (``genrec.engine.beam_runner``):
    ``cuda_graphs`` captures each as a CUDA graph on a GPU (``False``: the same runners,
    eager); ``search_request_buckets`` are the request counts a search is padded to (default:
    powers of two up to 64 on CUDA, none on the CPU, where padding only costs);
    ``static_search``: runners read the catalog and filter lists from capacity-sized copies,
    so one runner (one graph) serves every catalog version and filter size that fits
    (``genrec.engine.static_search``; default: with CUDA graphs). ``max_search_runners``
    runners and buffers up to half the memory budget are kept (least
    recently used dropped). The memory budget (``genrec.engine.memory``) is
    ``memory_fraction`` of the memory free when the engine is built (the device's; RAM on the
    CPU), or ``memory_budget_bytes`` where given; requests are admitted against it.
    ``score_runners``: scoring batches whose
    candidates have one length run on fixed grids (``genrec.engine.score_runner``; captured
    too with ``cuda_graphs``); default: on CUDA only.
    """

    max_batch_tokens: int = 65536
    soft_token_id: int | None = None
    chunk_tokens: int = 4096
    cuda_graphs: bool = True
    search_request_buckets: tuple[int, ...] | None = None
    max_search_runners: int = 8
    static_search: bool | None = None
    memory_fraction: float = 0.8
    memory_budget_bytes: int | None = None
    score_runners: bool | None = None


MAX_BEAM_WIDTH = 1024


# the head's weight chosen on validation (amazon18-scientific, amazon14-beauty: docs/results.md)
DEFAULT_ITEM_WEIGHT = 3.0


@dataclass
class BeamParams:
    """Constrained beam search: ``beam_width`` beams (<= 1024), the best ``n`` items returned.
    ``item_weight``: for a model with an item head, the beam's proposals, pooled with the
    head's ``head_proposals`` best items (default: ``beam_width``; 0: none), are ranked by
    ``log p(Semantic IDs) + item_weight * log p_head(item)`` (0: the Semantic IDs alone, the
    beam's order). See :mod:`genrec.engine.item_ranking`."""

    beam_width: int = 20
    n: int = 10
    item_weight: float = DEFAULT_ITEM_WEIGHT
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
        if isinstance(self.item_weight, bool) or not isinstance(self.item_weight, (int, float)) \
                or not 0.0 <= self.item_weight < float("inf"):
            raise ValueError(f"item_weight must be a finite number >= 0, got {self.item_weight!r}")
        h = self.head_proposals
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or not
                              0 <= h <= MAX_BEAM_WIDTH):
            raise ValueError(f"head_proposals must be an integer in [0, {MAX_BEAM_WIDTH}], "
                             f"got {h!r}")


@dataclass
class RecommendRequest:
    """One user for generative retrieval (:meth:`genrec.engine.Engine.recommend`), items named
    by the catalog's own ids (strings; an integer names its decimal string, as over HTTP):
    ``history`` (oldest first), an optional user vector (soft token), and optional item
    filters (``exclude`` removes, ``allow`` restricts). ``text``: text token ids put before
    the history's Semantic IDs (a model whose vocabulary extends a pretrained LM's; ``None``:
    the vocabulary's default text)."""

    history: Sequence[str | int]
    user_vector: torch.Tensor | Sequence[float] | None = None
    exclude: Sequence[str | int] | None = None
    allow: Sequence[str | int] | None = None
    text: Sequence[int] | None = None


@dataclass
class Recommendation:
    """Top items of one request (the catalog's ids), best first, with summed
    log-probabilities of their Semantic IDs; ``ignored``: the request's ``history`` and
    ``exclude`` ids the catalog does not have (left out)."""

    items: list[str]
    scores: list[float]
    ignored: list[str] = field(default_factory=list)


@dataclass
class RowRequest:
    """:class:`RecommendRequest` with items as the catalog's rows ``0 .. N-1``: the engine's
    internal form (a server, the batch job and evaluation translate ids once, then use
    :meth:`genrec.engine.Engine.recommend_rows`)."""

    history: Sequence[int]
    user_vector: torch.Tensor | Sequence[float] | None = None
    exclude: Sequence[int] | None = None
    allow: Sequence[int] | None = None
    text: Sequence[int] | None = None


@dataclass
class RowRecommendation:
    """Top items of one :class:`RowRequest` (rows), best first, with summed log-probabilities
    of their Semantic IDs."""

    items: list[int]
    scores: list[float]
