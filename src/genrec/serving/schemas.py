"""Request and response bodies of the HTTP API (pydantic models).

Items are named by the ids of the catalog's own table (:mod:`genrec.catalog.id_map`): a JSON
string, or a JSON integer naming the same id (``1`` and ``"1"`` are one item); answers name
items by their string ids. Unknown ids in ``history`` and ``exclude`` are skipped and listed
in the answer's ``ignored``; in ``allow``, ``candidates`` and retires they are an error (422
naming the field and the ids).

Bodies are validated strictly: token ids must be JSON integers (``true`` or ``1.5``
are rejected), floats must be finite (``NaN`` and ``Infinity``, which Python's JSON reader
accepts, are rejected), lists have upper bounds, and unknown fields are errors except in the
OpenAI/SGLang-compatible bodies, whose clients send extra fields.

Every ``/v1`` body takes ``min_catalog_version`` (also as the ``X-Min-Catalog-Version``
header; the larger counts): the answer is computed on that catalog
version or a later one (a replica behind catches up first, waiting at most about a second or
the request's deadline, else answers 503 with ``Retry-After``), and every answer says the
version it used (``catalog_version``; ``meta_info.catalog_version`` for ``/v1/score``). An
update's answer carries the version it made: sent as ``min_catalog_version`` to any replica,
it reads that write. A catalog update itself always runs on the newest version (it catches up
to the log's end first).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictInt

from genrec.catalog.id_map import check_key

# Upper bounds on list lengths: a request larger than these is rejected before any work.
MAX_HISTORY = 4096
MAX_CANDIDATES = 10000
MAX_FILTER = 1_000_000
MAX_USER_DIM = 65536
MAX_TOKENS = 65536
MAX_LABELS = 1024
MAX_CATALOG_BATCH = 100_000
MAX_BEAM = 1024
MAX_SID_LEVELS = 64
MAX_EMBEDDING = 65536  # values of a catalog item's embedding

# ids beyond int64 are refused here (422 naming the field), before any tensor is built
INT64_END = 2**63
# an item id: a string, or an integer naming its decimal string (parsed to the string)
ItemId = Annotated[str, PlainValidator(check_key, json_schema_input_type=str | int)]
TokenId = Annotated[StrictInt, Field(ge=0, lt=INT64_END)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
UserVector = Annotated[list[Finite], Field(min_length=1, max_length=MAX_USER_DIM)]
DeadlineMs = Annotated[StrictInt, Field(gt=0, le=3_600_000)]
MinVersion = Annotated[StrictInt, Field(ge=0, lt=INT64_END)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RecommendBody(_Strict):
    """``POST /v1/recommend``: top-n catalog items for one user by constrained beam search.

    ``rerank``: retrieve ``beam_width`` items, then order them with the loaded ranker.
    """

    history: Annotated[list[ItemId], Field(max_length=MAX_HISTORY)]
    user_vector: UserVector | None = None
    exclude: Annotated[list[ItemId], Field(max_length=MAX_FILTER)] | None = None
    allow: Annotated[list[ItemId], Field(max_length=MAX_FILTER)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_BEAM)] = 10
    beam_width: Annotated[StrictInt, Field(ge=1, le=MAX_BEAM)] = 20
    rerank: bool = False
    deadline_ms: DeadlineMs | None = None
    min_catalog_version: MinVersion | None = None


class RecommendResponse(BaseModel):
    """Items best first (their ids), their scores (summed log-probabilities, or ranker scores
    when reranked), the catalog version they were computed against, and the request's
    ``history`` / ``exclude`` ids the catalog does not have (skipped)."""

    items: list[str]
    scores: list[float]
    catalog_version: int
    ignored: list[str] = []


class RankBody(_Strict):
    """``POST /v1/rank``: scores of ``candidates`` for one user, by the loaded ranker."""

    history: Annotated[list[ItemId], Field(max_length=MAX_HISTORY)]
    candidates: Annotated[list[ItemId], Field(min_length=1, max_length=MAX_CANDIDATES)]
    user_vector: UserVector | None = None
    deadline_ms: DeadlineMs | None = None
    min_catalog_version: MinVersion | None = None


class RankResponse(BaseModel):
    """One score per candidate, in the request's order (higher is better); ``ignored``: the
    ``history`` ids the catalog does not have (skipped)."""

    scores: list[float]
    catalog_version: int
    ignored: list[str] = []


TokenList = Annotated[list[TokenId], Field(max_length=MAX_TOKENS)]


class ScoreBody(_Lenient):
    """``POST /v1/score`` (SGLang-compatible): probabilities of ``label_token_ids`` after
    ``query + item`` (or ``item + query`` with ``item_first``), for each item.

    Token-id inputs always work; text needs the server's ``--tokenizer``. ``query`` and
    ``items`` must be both text or both token ids.
    """

    query: Annotated[str, Field(max_length=MAX_TOKENS * 8)] | TokenList = ""
    items: (Annotated[str, Field(max_length=MAX_TOKENS * 8)]
            | Annotated[list[Annotated[str, Field(max_length=MAX_TOKENS * 8)]],
                        Field(max_length=MAX_CANDIDATES)]
            | Annotated[list[TokenList], Field(max_length=MAX_CANDIDATES)])
    label_token_ids: Annotated[list[TokenId], Field(min_length=1, max_length=MAX_LABELS)]
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None
    deadline_ms: DeadlineMs | None = None
    min_catalog_version: MinVersion | None = None


class ScoreResponse(BaseModel):
    """``scores[i][j]``: probability of label j after item i (SGLang's layout)."""

    scores: list[list[float]]
    model: str
    object: Literal["scoring"] = "scoring"
    usage: dict[str, int]
    meta_info: dict[str, Any]


class CompletionBody(_Lenient):
    """``POST /v1/completions`` (OpenAI-compatible subset, generative model only).

    Supported: ``use_beam_search: true`` (constrained beam search over the catalog), ``n``
    choices out of ``best_of`` beams (default ``n``), ``max_tokens`` (None, or at least the
    Semantic-ID length: one item is generated). ``prompt``: token ids ``[bos, (soft,) sid
    tokens of the history...]``, or text of Semantic-ID tokens ``"<a_3> <b_1> ..."``.
    """

    prompt: TokenList | Annotated[str, Field(max_length=MAX_TOKENS * 8)]
    model: str | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_BEAM)] = 1
    best_of: Annotated[StrictInt, Field(ge=1, le=MAX_BEAM)] | None = None
    use_beam_search: bool = False
    stream: bool = False
    user_vector: UserVector | None = None
    deadline_ms: DeadlineMs | None = None
    min_catalog_version: MinVersion | None = None


class CompletionChoice(BaseModel):
    """One generated item: its Semantic-ID tokens as text, its id, its summed log-prob."""

    index: int
    text: str
    item_id: str
    score: float
    logprobs: dict[str, Any] | None = None
    finish_reason: str = "length"


class CompletionResponse(BaseModel):
    """OpenAI ``text_completion`` object."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: dict[str, int]
    catalog_version: int


class ModelCard(BaseModel):
    """OpenAI's ``model`` object (``GET /v1/models``)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    """OpenAI's ``list`` of models (``GET /v1/models``)."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class CatalogItem(BaseModel):
    """One item to add or replace: ``item_id`` is its id in the catalog's table; an id the
    catalog does not have adds an item (with its ``semantic_id`` on a generative model).

    ``semantic_id`` (one code per level): the item joins the generative catalog (Semantic-ID
    index and trie), so ``/v1/recommend`` can return it; it must not be another item's.
    Without it, an index built by ``genrec index --from-text`` / ``--embeddings`` (its
    codebooks saved) assigns one from ``embedding`` (the index's embedding size) or from
    ``text`` (a string or ``{field: text}``, embedded by the index's sentence encoder; with a
    ranker, only when the index was built from text); an item with neither is added to the
    ranker only. Fields beyond these are passed to the ranker's catalog updater unchanged
    (its own format: ``text`` encoded by the item encoder, or ``vectors``); an item with them
    goes to the ranker as well.
    """

    model_config = ConfigDict(extra="allow")

    item_id: ItemId
    semantic_id: Annotated[list[Annotated[StrictInt, Field(ge=0, lt=INT64_END)]],
                           Field(min_length=1, max_length=MAX_SID_LEVELS)] | None = None
    embedding: Annotated[list[float], Field(min_length=1, max_length=MAX_EMBEDDING)] | None = None


class CatalogUpsertBody(_Strict):
    """``PUT /v1/catalog/items``."""

    items: Annotated[list[CatalogItem], Field(min_length=1, max_length=MAX_CATALOG_BATCH)]
    min_catalog_version: MinVersion | None = None


class CatalogRetireBody(_Strict):
    """``DELETE /v1/catalog/items``."""

    item_ids: Annotated[list[ItemId], Field(min_length=1, max_length=MAX_CATALOG_BATCH)]
    min_catalog_version: MinVersion | None = None


class CatalogResponse(BaseModel):
    """The catalog version after the update (one version for the whole service), how many
    items it touched, which catalogs took which item ids (``generative``: the engine's
    Semantic-ID catalog, ``ranker``: the ranker's item table), and the Semantic IDs assigned
    to items sent without one (absent when none was)."""

    catalog_version: int
    count: int
    catalogs: dict[str, list[str]]
    semantic_ids: dict[str, list[int]] | None = None


class ErrorResponse(BaseModel):
    """Every error of genrec's own routes: a message naming the offending field (the
    OpenAI-style routes: :func:`genrec.serving.openai_api.openai_error`)."""

    detail: str
