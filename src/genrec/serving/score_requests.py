"""The engine requests of a ``/v1/score`` body (:func:`score_requests`): text turned into
token ids by the server's tokenizer (:func:`encode_text`), every id checked against the model
(:func:`check_token_ids`), the query shared as prefix where it can be. Bad input raises
``ValueError`` naming the body field (HTTP 422); text without a tokenizer, :class:`ApiError`
(HTTP 400)."""

from __future__ import annotations

from typing import Any

from genrec.engine import Engine, ScoreRequest
from genrec.serving import schemas as S
from genrec.serving.api_errors import ApiError


def encode_text(tokenizer: Any, text: str, field: str, special: bool) -> list[int]:
    """The token ids of ``text`` (``special``: with the tokenizer's special tokens); raises
    :class:`ApiError` naming ``field`` when the server has no ``tokenizer``."""
    if tokenizer is None:
        raise ApiError(400, f"{field}: text input needs a tokenizer (start the server with "
                            f"--tokenizer DIR), or send token ids")
    return list(tokenizer.encode(text, add_special_tokens=special))


def check_token_ids(engine: Engine, ids: list[int], field: str) -> None:
    """Raise ``ValueError`` naming ``field`` when an id is past the model's text tokens and
    item rows."""
    limit = engine.model.config.vocab_size
    if engine.item_table is not None:
        limit += engine.item_table.num_rows
    bad = [t for t in ids if t >= limit]
    if bad:
        raise ValueError(f"{field}: token id {bad[0]} is out of range (0..{limit - 1})")


def score_requests(engine: Engine, tokenizer: Any, body: S.ScoreBody
                   ) -> tuple[list[ScoreRequest], bool, int]:
    """The engine requests of a score body, whether they share the query as prefix, and
    the number of prompt tokens."""
    items = [body.items] if isinstance(body.items, str) else list(body.items)
    text_query = isinstance(body.query, str) and body.query != ""
    text_items = any(isinstance(i, str) for i in items)
    if text_query and items and not text_items:
        raise ValueError("query: query is text but items are token ids (give both as text "
                         "or both as token ids)")
    query = (encode_text(tokenizer, body.query, "query", not body.item_first) if text_query
             else list(body.query or []))
    if text_items:
        items = [encode_text(tokenizer, t, f"items[{i}]", body.item_first)
                 for i, t in enumerate(items)]
    vocab_size = engine.model.config.vocab_size
    bad = [t for t in body.label_token_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"label_token_ids: {bad[0]} is not a text token "
                         f"(0..{vocab_size - 1})")
    check_token_ids(engine, query, "query")
    max_pos = engine.model.config.max_position_embeddings
    for i, item in enumerate(items):
        check_token_ids(engine, item, f"items[{i}]")
        if len(query) + len(item) > max_pos:
            raise ValueError(f"items[{i}]: query + item ({len(query) + len(item)} tokens) "
                             f"exceed the model's {max_pos} positions")
    n_tokens = len(query) + sum(len(i) for i in items)
    if not items:
        return [], False, 0
    if query and not body.item_first and all(items):
        return [ScoreRequest(prefix=query, candidates=items)], True, n_tokens
    requests = []  # no shared prefix: each sequence alone, scored at its last token
    for i, item in enumerate(items):
        seq = item + query if body.item_first else query + item
        if not seq:
            raise ValueError(f"items[{i}]: empty item and empty query")
        requests.append(ScoreRequest(prefix=seq[:-1], candidates=[seq[-1:]]))
    return requests, False, n_tokens + (len(query) * (len(items) - 1))
