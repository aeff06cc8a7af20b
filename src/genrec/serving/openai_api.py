"""What OpenAI's clients (and vLLM's users) expect of the OpenAI-style routes: the model list
(``GET /v1/models``), a 404 for a request naming another model, and errors in OpenAI's shape.

On ``/v1/completions`` and ``/v1/models`` an error is
``{"error": {"message", "type", "param", "code"}}`` (what the ``openai`` SDK reads into its
exceptions: ``message``, ``param``, ``type``, ``code``), with the status and headers (e.g.
``Retry-After``) the server gives it elsewhere; the message is genrec's own, naming the field,
and ``param`` is that field. genrec's own routes keep ``{"detail": ...}``.
:class:`OpenAIErrors` reshapes every error answer of those routes in one place, whichever
layer made it (schema check, service, body limit, drain, API key, unknown route).
"""

from __future__ import annotations

import json
import re
from typing import Any

from genrec.serving.api_errors import ApiError
from genrec.serving.auth import Receive, Scope, Send

COMPLETIONS = "/v1/completions"
MODELS = "/v1/models"
OWNED_BY = "genrec"

# vLLM's error types by HTTP status (its ``ErrorResponse.type``); ``code`` is the status
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
          405: "MethodNotAllowedError", 413: "RequestTooLargeError",
          422: "UnprocessableEntityError", 503: "ServiceUnavailableError",
          504: "TimeoutError"}
# the field a genrec message names first: "prompt: ...", "items[3].text: ..."
_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


def is_openai_route(path: str) -> bool:
    """Whether ``path`` is an OpenAI-style route (its errors take OpenAI's shape)."""
    return path in (COMPLETIONS, MODELS) or path.startswith(MODELS + "/")


def openai_error(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error object for an answer of HTTP ``status`` with genrec's ``message``;
    ``param`` is the field the message names first (``None`` when it names none)."""
    found = _FIELD.match(message)
    kind = _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind,
                      "param": found.group(1) if found else None, "code": status}}


def model_card(name: str, created: int) -> dict[str, Any]:
    """One entry of ``GET /v1/models`` (OpenAI's model object)."""
    return {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}


def model_list(name: str, created: int) -> dict[str, Any]:
    """``GET /v1/models``: OpenAI's list of the one served model."""
    return {"object": "list", "data": [model_card(name, created)]}


def check_model(requested: str | None, served: str) -> None:
    """Raise :class:`~genrec.serving.api_errors.ApiError` 404 naming ``model`` when a request
    names a model this server does not serve; ``None`` (not named) is the served one."""
    if requested is not None and requested != served:
        raise ApiError(404, f"model: the model '{requested}' does not exist (this server serves "
                          f"'{served}')")


def _reshaped(status: int, body: bytes) -> bytes:
    """An error body ``{"detail": ...}`` (or any other) as OpenAI's error object."""
    try:
        data = json.loads(body)
    except ValueError:
        data = body.decode("utf-8", "replace")
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return body  # already OpenAI's shape
    detail = data.get("detail", data) if isinstance(data, dict) else data
    message = detail if isinstance(detail, str) else json.dumps(detail)
    return json.dumps(openai_error(status, message)).encode()


class OpenAIErrors:
    """ASGI middleware: on the OpenAI-style routes, every answer of status 400 or more gets
    OpenAI's error body (same status and headers; ``Content-Length`` recomputed); all other
    answers (and any answer to ``HEAD``, which has no body) pass through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or not is_openai_route(scope["path"])
                or scope["method"] == "HEAD"):  # no body to reshape
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] | None = None  # an error answer's start, held until its body
        chunks: list[bytes] = []

        async def reshape(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _reshaped(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", [])
                       if k.lower() not in (b"content-length", b"content-type")]
            headers += [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshape)
