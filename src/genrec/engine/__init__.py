"""The engine: composed inputs, packed prefix + branch batches, scoring, beam search."""

from genrec.engine.engine import Engine
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import Embeds, InputError
from genrec.engine.params import BeamParams, ScoreParams
from genrec.engine.requests import (
    Recommendation,
    RecommendRequest,
    RowRecommendation,
    RowRequest,
    ScoreRequest,
)

__all__ = [
    "BeamParams", "Embeds", "Engine", "EngineConfig", "InputError", "Recommendation",
    "RecommendRequest", "RowRecommendation", "RowRequest", "ScoreParams", "ScoreRequest",
]
