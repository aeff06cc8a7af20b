"""genrec: an inference engine for LLM-based recommendation."""

__version__ = "0.1.0"

from genrec.engine import (  # noqa: E402
    BeamParams,
    Embeds,
    Engine,
    EngineConfig,
    InputError,
    Recommendation,
    RecommendRequest,
    ScoreParams,
    ScoreRequest,
)

__all__ = [
    "BeamParams", "Embeds", "Engine", "EngineConfig", "InputError", "Recommendation",
    "RecommendRequest", "ScoreParams", "ScoreRequest",
]
