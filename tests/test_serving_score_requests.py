"""A ``/v1/score`` body -> the engine's score requests: the query shared as prefix, each
sequence alone without one, text through the tokenizer, and bad input refused naming the
field."""

from __future__ import annotations

import pytest
from serving_support import CharTokenizer, tiny_engine

from genrec.engine import ScoreRequest
from genrec.serving.api_errors import ApiError
from genrec.serving.schemas import ScoreBody
from genrec.serving.score_requests import check_token_ids, encode_text, score_requests

ENGINE = tiny_engine()
VOCAB = ENGINE.model.config.vocab_size
ROWS = ENGINE.item_table.num_rows  # item rows: token ids VOCAB.. VOCAB + ROWS - 1


def test_a_query_is_shared_as_the_prefix_of_every_item() -> None:
    body = ScoreBody(query=[1, 4], items=[[5], [6, 7]], label_token_ids=[3])
    assert score_requests(ENGINE, None, body) == (
        [ScoreRequest(prefix=[1, 4], candidates=[[5], [6, 7]])], True, 5)


def test_without_a_shared_prefix_each_sequence_is_scored_at_its_last_token() -> None:
    body = ScoreBody(query=[1, 4], items=[[5], [6, 7]], label_token_ids=[3], item_first=True)
    requests, shared, n_tokens = score_requests(ENGINE, None, body)
    assert requests == [ScoreRequest(prefix=[5, 1], candidates=[[4]]),
                        ScoreRequest(prefix=[6, 7, 1], candidates=[[4]])]
    assert not shared and n_tokens == 7
    assert score_requests(ENGINE, None, ScoreBody(query=[1], items=[], label_token_ids=[3])) == (
        [], False, 0)


def test_text_goes_through_the_tokenizer() -> None:
    tok = CharTokenizer()
    body = ScoreBody(query="ab", items=["c", "de"], label_token_ids=[3])
    [request], shared, _ = score_requests(ENGINE, tok, body)
    assert shared and request.prefix == tok.encode("ab")
    assert request.candidates == [tok.encode("c", False), tok.encode("de", False)]
    assert encode_text(tok, "x", "query", True) == tok.encode("x")
    with pytest.raises(ApiError, match="query: text input needs a tokenizer") as err:
        score_requests(ENGINE, None, body)
    assert err.value.status_code == 400


@pytest.mark.parametrize(("body", "message"), [
    ({"query": "ab", "items": [[5]]}, "query: query is text but items are token ids"),
    ({"query": [1], "items": [[5]], "label_token_ids": [VOCAB]}, "label_token_ids: "),
    ({"query": [VOCAB + ROWS], "items": [[5]]}, "query: token id"),
    ({"query": [1], "items": [[5], [VOCAB + ROWS + 2]]}, r"items\[1\]: token id"),
    ({"query": [1] * 60, "items": [[5] * 5]}, r"items\[0\]: query \+ item \(65 tokens\)"),
    ({"items": [[5], []]}, r"items\[1\]: empty item and empty query"),
])
def test_bad_input_names_the_field(body: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        score_requests(ENGINE, CharTokenizer(), ScoreBody(**{"label_token_ids": [3], **body}))


def test_item_rows_are_token_ids_past_the_text_vocabulary() -> None:
    check_token_ids(ENGINE, [0, VOCAB, VOCAB + ROWS - 1], "items[0]")
    with pytest.raises(ValueError, match=rf"items\[0\]: token id {VOCAB + ROWS} is out"):
        check_token_ids(ENGINE, [VOCAB + ROWS], "items[0]")
