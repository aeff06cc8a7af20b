"""The endpoints' own errors carry what their HTTP answer says: a status and detail, or the
versions of a catalog behind a request."""

from __future__ import annotations

from genrec.serving.api_errors import ApiError, CatalogBehindError


def test_errors_carry_their_answer() -> None:
    err = ApiError(400, "rerank: no ranker loaded")
    assert (err.status_code, err.detail, str(err)) == (400, "rerank: no ranker loaded",
                                                        "rerank: no ranker loaded")
    behind = CatalogBehindError(wanted=9, version=4)
    assert str(behind) == "min_catalog_version: 9 not reached here yet (catalog version 4); retry"
