"""The DuoLM ranker: offline item encoder, versioned item store, student and teacher rankers."""

from genrec.duolm.encoder import EncoderConfig, ItemEncoder, ItemFeatures
from genrec.duolm.prompts import StudentPrompts, TeacherPrompts
from genrec.duolm.ranker import DuoRanker, TeacherRanker
from genrec.duolm.requests import Ranking, RankRequest, RowRankRequest
from genrec.duolm.store import StoreVersion, load_store, write_store

__all__ = [
    "DuoRanker",
    "EncoderConfig",
    "ItemEncoder",
    "ItemFeatures",
    "RankRequest",
    "Ranking",
    "RowRankRequest",
    "StoreVersion",
    "StudentPrompts",
    "TeacherPrompts",
    "TeacherRanker",
    "load_store",
    "write_store",
]
