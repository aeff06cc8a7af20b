"""The errors the endpoints raise besides bad input (``ValueError``, HTTP 422): a feature the
server does not have as configured (:class:`ApiError`) and a catalog behind a request's
``min_catalog_version`` (:class:`CatalogBehindError`). :mod:`genrec.serving.http_errors` maps
them to their HTTP answers."""

from __future__ import annotations


class ApiError(Exception):
    """A request the server cannot serve as configured: HTTP ``status_code`` with ``detail``."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


class CatalogBehindError(RuntimeError):
    """The served catalog has not reached a request's ``min_catalog_version`` in time: retry
    later (HTTP 503 with ``Retry-After``; ``/metrics`` counts it as ``catalog_behind``)."""

    def __init__(self, wanted: int, version: int) -> None:
        super().__init__(f"min_catalog_version: {wanted} not reached here yet (catalog "
                         f"version {version}); retry")
