"""Request bodies: strict ids, finite floats, bounds, unknown fields, validation messages."""

from __future__ import annotations

import json

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from genrec.serving import schemas as S
from genrec.serving.http_errors import validation_detail


def _fields(model: type, raw: str) -> list[str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate_json(raw)
    return [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]


def test_recommend_defaults() -> None:
    body = S.RecommendBody.model_validate({"history": [1, 2]})
    assert (body.n, body.beam_width, body.rerank, body.user_vector) == (10, 20, False, None)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"history": [1.5]}', "history.0"),
        ('{"history": [true]}', "history.0"),
        ('{"history": [""]}', "history.0"),
        ('{"history": [null]}', "history.0"),
        ('{"history": [[1]]}', "history.0"),
        ('{"history": "1,2"}', "history"),
        ('{"history": [1], "user_vector": [NaN, 1.0]}', "user_vector.0"),
        ('{"history": [1], "user_vector": [Infinity]}', "user_vector.0"),
        ('{"history": [1], "user_vector": []}', "user_vector"),
        ('{"history": [1], "n": 0}', "n"),
        ('{"history": [1], "beam_width": 1025}', "beam_width"),
        ('{"history": [1], "deadline_ms": 0}', "deadline_ms"),
        ('{"history": [1], "colour": "red"}', "colour"),
        ("{}", "history"),
        ('{"history": [' + ",".join(["1"] * (S.MAX_HISTORY + 1)) + "]}", "history"),
    ],
)
def test_bad_recommend_bodies_name_the_field(raw: str, field: str) -> None:
    assert field in _fields(S.RecommendBody, raw)


def test_rank_needs_candidates() -> None:
    assert "candidates" in _fields(S.RankBody, '{"history": [1], "candidates": []}')
    body = S.RankBody.model_validate({"history": [], "candidates": [3]})
    assert body.candidates == ["3"]


def test_score_accepts_text_or_token_ids_and_ignores_extra_fields() -> None:
    ids = S.ScoreBody.model_validate({"query": [1, 2], "items": [[3], [4, 5]],
                                      "label_token_ids": [7], "temperature": 0})
    assert ids.items == [[3], [4, 5]] and ids.apply_softmax is False
    text = S.ScoreBody.model_validate({"query": "q", "items": "one item",
                                       "label_token_ids": [7], "item_first": True})
    assert text.items == "one item" and text.item_first
    assert "label_token_ids" in _fields(S.ScoreBody, '{"items": [[1]], "label_token_ids": []}')
    assert any(f.startswith("items") for f in
               _fields(S.ScoreBody, '{"items": [[1, -2]], "label_token_ids": [1]}'))


def test_completion_and_catalog_bodies() -> None:
    body = S.CompletionBody.model_validate({"prompt": [0, 5, 9], "use_beam_search": True,
                                            "n": 3, "best_of": 5, "top_p": 1.0})
    assert body.n == 3 and body.best_of == 5
    up = S.CatalogUpsertBody.model_validate({"items": [{"item_id": 4, "text": "a lamp"}]})
    assert up.items[0].model_dump(exclude_none=True) == {"item_id": "4", "text": "a lamp"}
    assert "items" in _fields(S.CatalogUpsertBody, '{"items": []}')
    assert "item_ids.0" in _fields(S.CatalogRetireBody, '{"item_ids": [1.5]}')


def test_validation_detail_is_one_message_naming_fields() -> None:
    try:
        S.RecommendBody.model_validate(json.loads('{"history": [1, 2.5], "n": -1}'))
    except ValidationError as err:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in err.errors()]
    detail = validation_detail(RequestValidationError(errors))
    assert detail.startswith("history[1]: ") and "n: " in detail
    bad_json = RequestValidationError([{"type": "json_invalid", "loc": ("body", 3),
                                        "msg": "JSON decode error",
                                        "ctx": {"error": "Expecting value"}}])
    assert validation_detail(bad_json) == "body: invalid JSON (Expecting value)"
    missing = RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "required"}])
    assert validation_detail(missing) == "body: a JSON object is required"


def test_item_ids_are_the_tables_strings() -> None:
    body = S.RecommendBody.model_validate_json(
        '{"history": [1, "1", "B00X", 18446744073709551616], "exclude": ["spotify:track:x"]}')
    assert body.history == ["1", "1", "B00X", "18446744073709551616"]
    assert body.exclude == ["spotify:track:x"]
    rank = S.RankBody.model_validate({"history": [], "candidates": [7, "sku-1"]})
    assert rank.candidates == ["7", "sku-1"]
    assert "item_ids.1" in _fields(S.CatalogRetireBody, '{"item_ids": ["a", true]}')
    assert "candidates.0" in _fields(S.RankBody, '{"history": [], "candidates": ["a\\u0000"]}')
