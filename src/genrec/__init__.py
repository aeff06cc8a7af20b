"""genrec: an inference engine for LLM-based recommendation."""

__version__ = "0.1.0"

from genrec.engine import Embeds, Engine, EngineConfig, InputError, ScoreParams, ScoreRequest

__all__ = ["Embeds", "Engine", "EngineConfig", "InputError", "ScoreParams", "ScoreRequest"]
