"""API keys for the HTTP server (like vLLM's ``--api-key``), and the bind check that keeps a
server without keys on loopback.

Rules of :class:`ApiKeyMiddleware`:

- Only ``/v1`` and the routes below it are protected. ``/health``, ``/ready``, ``/metrics``
  and the OpenAPI documents (``/docs``, ``/redoc``, ``/openapi.json``: they describe the API
  and hold no data) stay open, as does anything else outside ``/v1``.
- With an **api key**, every ``/v1`` route needs ``Authorization: Bearer <api key>``.
- With an **admin key**, the catalog routes (``/v1/catalog`` and below: live catalog updates)
  need ``Authorization: Bearer <admin key>``; the api key does not open them. The admin key
  opens every other ``/v1`` route too (it is the stronger key).
- With an api key and no admin key, the api key opens the catalog routes as well; with
  neither key nothing is protected (then :func:`check_bind` keeps the server on loopback).
- Any other request to a protected route gets 401 with JSON ``{"detail": ...}`` and
  ``WWW-Authenticate: Bearer``, before its body is read. Keys are compared in constant time
  (``hmac.compare_digest`` on SHA-256 digests, so not even their length shows) and are never
  logged or repeated in an answer.

Keys come from the command line or the environment (:func:`keys_from_env`:
``GENREC_API_KEY``, ``GENREC_ADMIN_KEY``). A key is visible ASCII without spaces (a bearer
token), and the two keys must differ.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import posixpath
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

log = logging.getLogger("genrec.serving.auth")

API_KEY_ENV = "GENREC_API_KEY"
ADMIN_KEY_ENV = "GENREC_ADMIN_KEY"
PROTECTED_PREFIX = "/v1"
CATALOG_PREFIX = "/v1/catalog"
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})

_KEY_CHARS = re.compile(r"[\x21-\x7e]+")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def check_key(key: str | None, option: str) -> None:
    """Raise ``ValueError`` naming ``option`` (never the key) when ``key`` is not usable:
    empty, or not visible ASCII without spaces. ``None`` (no key) is fine."""
    if key is None:
        return
    if not isinstance(key, str) or not key:
        raise ValueError(f"{option}: the key is empty")
    if not _KEY_CHARS.fullmatch(key):
        raise ValueError(f"{option}: a key must be visible ASCII characters without spaces")


def check_keys(api_key: str | None, admin_key: str | None) -> None:
    """:func:`check_key` for both keys, and they must differ (``ValueError``)."""
    check_key(api_key, "--api-key")
    check_key(admin_key, "--admin-key")
    if api_key is not None and admin_key is not None and hmac.compare_digest(
            api_key.encode(), admin_key.encode()):
        raise ValueError("--admin-key: must differ from --api-key (without an admin key, "
                         "the api key opens the catalog routes)")


def keys_from_env(api_key: str | None, admin_key: str | None,
                  environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The (api key, admin key) to serve with: each option when given, else its environment
    variable (``GENREC_API_KEY``, ``GENREC_ADMIN_KEY``; an empty variable counts as unset),
    else ``None``. Raises ``ValueError`` for an unusable key (see :func:`check_keys`)."""
    env = os.environ if environ is None else environ
    resolved = []
    for given, name in ((api_key, API_KEY_ENV), (admin_key, ADMIN_KEY_ENV)):
        resolved.append(given if given is not None else (env.get(name) or None))
    check_keys(resolved[0], resolved[1])
    return resolved[0], resolved[1]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (what the server binds) is a loopback address: 127.0.0.0/8, ``::1``
    (bracketed or not, IPv4-mapped too) or ``localhost``."""
    name = host.strip().lower()
    if name in LOOPBACK_NAMES:
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a host name other than localhost, or an empty host: all interfaces
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def check_bind(host: str, api_key: str | None, admin_key: str | None,
               allow_insecure: bool) -> str | None:
    """Whether the server may listen on ``host``: a loopback address always; any other only
    with an api key (with an admin key alone the inference routes would be open to the
    network) or with ``allow_insecure``. Raises ``ValueError`` with a message saying so
    when refused; returns a warning line to log when allowed by ``allow_insecure`` only,
    else ``None``."""
    if api_key is not None or is_loopback(host):
        return None
    open_routes = ("the /v1 inference routes" if admin_key is not None
                   else "every /v1 route, catalog updates included,")
    if not allow_insecure:
        raise ValueError(
            f"refusing to listen on {host!r} without an API key: {open_routes} would be open "
            f"to the network. Set --api-key (or {API_KEY_ENV}) and --admin-key (or "
            f"{ADMIN_KEY_ENV}), listen on 127.0.0.1, or pass --allow-insecure to serve "
            f"without authentication")
    return (f"WARNING: listening on {host!r} without an API key (--allow-insecure): "
            f"{open_routes} accept requests from anyone who can reach this address")


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def _normalized(path: str) -> str:
    # the route a path could reach: repeated slashes folded, dot segments resolved, lower case
    return posixpath.normpath("/" + re.sub(r"/+", "/", path).lstrip("/")).lower()


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


class ApiKeyMiddleware:
    """ASGI middleware: bearer keys on the ``/v1`` routes (see the module docstring for the
    rules). ``app.add_middleware(ApiKeyMiddleware, api_key=..., admin_key=...)``; with both
    keys ``None`` it lets everything through."""

    def __init__(self, app: Callable[..., Awaitable[None]], api_key: str | None = None,
                 admin_key: str | None = None) -> None:
        check_keys(api_key, admin_key)
        self.app = app
        self.api_digest = None if api_key is None else _digest(api_key)
        self.admin_digest = None if admin_key is None else _digest(admin_key)

    def required(self, path: str) -> tuple[bytes, ...]:
        """Digests of the keys that open ``path`` (empty: the route is open)."""
        path = _normalized(path)
        if not _under(path, PROTECTED_PREFIX):
            return ()
        if self.admin_digest is not None:
            if _under(path, CATALOG_PREFIX):
                return (self.admin_digest,)
            return () if self.api_digest is None else (self.api_digest, self.admin_digest)
        return () if self.api_digest is None else (self.api_digest,)

    def refusal(self, scope: Scope, keys: tuple[bytes, ...]) -> str | None:
        """Why the request's credentials do not open a route needing ``keys`` (None: they
        do). Every key is compared, in constant time."""
        values = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        if not values:
            return "missing API key: send the header 'Authorization: Bearer <key>'"
        scheme, _, token = values[0].strip().partition(b" ")
        if len(values) > 1 or scheme.lower() != b"bearer" or not token.strip():
            return "malformed Authorization header: expected 'Bearer <key>'"
        given = _digest(token.strip())
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(given, key)
        if matched:
            return None
        if self.admin_digest is not None and keys == (self.admin_digest,):
            return "invalid admin key: the catalog routes need the admin key"
        return "invalid API key"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        keys = self.required(scope.get("path", ""))
        reason = self.refusal(scope, keys) if keys else None
        if reason is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        log.info("401 on %s %r from %s: %s", scope.get("method", "WEBSOCKET"),
                 scope.get("path", ""), client[0], reason)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
