"""The engine: composed inputs, packed prefix + branch batches, scoring."""

from genrec.engine.engine import Engine
from genrec.engine.inputs import Embeds, InputError
from genrec.engine.params import EngineConfig, ScoreParams, ScoreRequest

__all__ = ["Embeds", "Engine", "EngineConfig", "InputError", "ScoreParams", "ScoreRequest"]
