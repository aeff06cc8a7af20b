"""HTTP errors of the server: every error is JSON ``{"detail": "<message naming the field>"}``.

Bad input 422 (schema or engine ``InputError``), missing or wrong API key 401
(:mod:`genrec.serving.auth`), unavailable feature 400, unknown model 404, body too large or a
request over the memory budget 413, queue full, draining or a batch that does not fit in memory
now (or ran out of it) 503 with ``Retry-After`` (also when the engine process is gone), deadline
passed 504. On the OpenAI-style routes (``/v1/completions``, ``/v1/models``) the same errors
come in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``
(:mod:`genrec.serving.openai_api`). :data:`ERROR_TABLE` maps the exceptions of a refused
request to their answer; :func:`map_errors` registers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from genrec.serving.admission import MemoryBusyError, RequestTooLargeError
from genrec.serving.api_errors import ApiError, CatalogBehindError
from genrec.serving.engine_process import EngineGoneError
from genrec.serving.prometheus import ServerMetrics
from genrec.serving.scheduler import DeadlineExceededError, DrainingError, QueueFullError
from genrec.serving.spec import ServeConfig


@dataclass(frozen=True)
class ErrorAnswer:
    """How a refused request is answered: HTTP ``status``, the ``/metrics`` reject
    ``reason`` it is counted under (``None``: not counted), and whether ``Retry-After``
    says when to come back."""

    status: int
    reason: str | None = None
    retry: bool = False


ERROR_TABLE: dict[type[Exception], ErrorAnswer] = {
    QueueFullError: ErrorAnswer(503, "queue_full", retry=True),
    CatalogBehindError: ErrorAnswer(503, "catalog_behind", retry=True),
    DrainingError: ErrorAnswer(503, "draining", retry=True),
    EngineGoneError: ErrorAnswer(503, retry=True),
    RequestTooLargeError: ErrorAnswer(413, "too_large"),
    MemoryBusyError: ErrorAnswer(503, "memory", retry=True),
    DeadlineExceededError: ErrorAnswer(504, "deadline"),
}


def error_response(status: int, detail: str, headers: dict[str, str] | None = None
                   ) -> JSONResponse:
    """The JSON error ``{"detail": detail}`` with ``status``."""
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def validation_detail(err: RequestValidationError) -> str:
    """One message naming the fields of a schema error (at most three listed)."""
    messages = []
    for e in err.errors()[:3]:
        if e.get("type") == "json_invalid":
            messages.append(f"body: invalid JSON ({e.get('ctx', {}).get('error', e['msg'])})")
        elif e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",):
            messages.append("body: a JSON object is required")
        elif e.get("type") == "model_attributes_type" and tuple(e.get("loc", ())) == ("body",):
            messages.append("body: expected a JSON object (with Content-Type: "
                            "application/json)")
        else:
            messages.append(f"{_field(tuple(e.get('loc', ())))}: {e['msg']}")
    more = len(err.errors()) - 3
    return "; ".join(messages) + (f" (and {more} more errors)" if more > 0 else "")



def map_errors(app: FastAPI, metrics: ServerMetrics, config: ServeConfig) -> None:
    """Exceptions -> JSON errors: schema errors and ``ValueError`` 422, :class:`ApiError`
    its own status, each of :data:`ERROR_TABLE` as it says there."""
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(422, validation_detail(err))

    @app.exception_handler(ApiError)
    async def _api(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status_code, err.detail)

    @app.exception_handler(ValueError)
    async def _value(_: Request, err: ValueError) -> JSONResponse:
        return error_response(422, str(err))

    retry = {"Retry-After": str(config.retry_after_s)}
    for kind, answer in ERROR_TABLE.items():
        app.add_exception_handler(kind, _refusal(answer, metrics, retry))


def _refusal(answer: ErrorAnswer, metrics: ServerMetrics, retry: dict[str, str]) -> Any:
    # the handler of one kind of refusal (a function per entry: its own ``answer``)
    async def handler(_: Request, err: Exception) -> JSONResponse:
        if answer.reason is not None:
            metrics.reject(answer.reason)
        return error_response(answer.status, str(err), retry if answer.retry else None)
    return handler
