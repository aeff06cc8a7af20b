"""API keys (genrec.serving.auth): the middleware's rules on a small FastAPI app, key sources,
and the bind check."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from genrec.serving.auth import (
    ApiKeyMiddleware,
    check_bind,
    is_loopback,
    keys_from_env,
)

API, ADMIN = "api-key-1f6b0c", "admin-key-93e2d7"
OPEN = ["/health", "/ready", "/metrics", "/openapi.json", "/docs"]


def client(api_key: str | None, admin_key: str | None) -> TestClient:
    app = FastAPI()

    @app.post("/v1/x")
    async def x() -> dict:
        return {"route": "x"}

    @app.put("/v1/catalog/items")
    async def items() -> dict:
        return {"route": "catalog"}

    for path in ("/health", "/ready", "/metrics"):
        app.add_api_route(path, lambda: {"status": "ok"}, methods=["GET"])
    app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_key=admin_key)
    return TestClient(app)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def status(http: TestClient, path: str, headers: dict[str, str] | None = None) -> int:
    method = "PUT" if path.startswith("/v1/catalog") else "POST" if path.startswith("/v1") \
        else "GET"
    return http.request(method, path, headers=headers or {}).status_code


def test_api_key_required_on_v1() -> None:
    http = client(API, None)
    for headers in (None, bearer("wrong"), bearer(API + "x"), {"Authorization": API},
                    {"Authorization": f"Basic {API}"}, {"Authorization": "Bearer "}):
        r = http.post("/v1/x", headers=headers or {})
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer"
        assert set(r.json()) == {"detail"} and API not in r.text
    assert http.post("/v1/x", headers=bearer(API)).json() == {"route": "x"}
    assert http.post("/v1/x", headers={"authorization": f"bearer  {API}"}).status_code == 200
    # without an admin key the api key opens the catalog routes
    assert status(http, "/v1/catalog/items", bearer(API)) == 200
    assert status(http, "/v1/catalog/items") == 401


def test_admin_key_rules() -> None:
    http = client(API, ADMIN)
    r = http.put("/v1/catalog/items", headers=bearer(API))
    assert r.status_code == 401 and "admin key" in r.json()["detail"]
    assert API not in r.text and ADMIN not in r.text
    assert status(http, "/v1/catalog/items") == 401
    assert status(http, "/v1/catalog/items", bearer(ADMIN)) == 200
    assert status(http, "/v1/x", bearer(ADMIN)) == 200  # the admin key opens every /v1 route
    assert status(http, "/v1/x", bearer(API)) == 200
    # paths that could reach the catalog routes count as catalog routes
    for path in ("/v1//catalog/items", "/v1/x/../catalog/items", "/V1/Catalog/items",
                 "/v1/catalog", "/v1/catalog/items/"):
        assert status(http, path, bearer(API)) == 401, path


def test_admin_key_alone_protects_only_the_catalog() -> None:
    http = client(None, ADMIN)
    assert status(http, "/v1/x") == 200
    assert status(http, "/v1/catalog/items") == 401
    assert status(http, "/v1/catalog/items", bearer("wrong")) == 401
    assert status(http, "/v1/catalog/items", bearer(ADMIN)) == 200


def test_open_routes_and_no_keys() -> None:
    for http in (client(API, ADMIN), client(None, None)):
        for path in OPEN:
            assert status(http, path) == 200, path
    http = client(None, None)
    assert status(http, "/v1/x") == 200 and status(http, "/v1/catalog/items") == 200
    assert status(client(API, None), "/v1/nope") == 401  # unknown /v1 routes too


def test_keys_never_logged_or_echoed(caplog: pytest.LogCaptureFixture) -> None:
    http = client(API, ADMIN)
    caplog.set_level(logging.DEBUG)
    answers = [http.post("/v1/x", headers=bearer(f"{API}-{ADMIN}")),
               http.put("/v1/catalog/items", headers=bearer(API)),
               http.post("/v1/x", headers={"Authorization": f"Token {ADMIN}"})]
    assert all(r.status_code == 401 for r in answers)
    assert caplog.records, "a refusal is logged"
    for record in caplog.records:
        assert API not in record.getMessage() and ADMIN not in record.getMessage()
    for r in answers:
        assert API not in r.text and ADMIN not in r.text
        assert not any(API in v or ADMIN in v for v in r.headers.values())


def test_bad_keys_refused() -> None:
    for api, admin in (("", None), (None, ""), ("with space", None), ("ключ", None),
                       (API, API)):
        with pytest.raises(ValueError) as err:
            ApiKeyMiddleware(FastAPI(), api, admin)
        assert "ключ" not in str(err.value) and "with space" not in str(err.value)


def test_keys_from_env() -> None:
    env = {"GENREC_API_KEY": "env-api", "GENREC_ADMIN_KEY": "env-admin"}
    assert keys_from_env(None, None, env) == ("env-api", "env-admin")
    assert keys_from_env("cli-api", None, env) == ("cli-api", "env-admin")
    assert keys_from_env(None, "cli-admin", env) == ("env-api", "cli-admin")
    assert keys_from_env(None, None, {"GENREC_API_KEY": ""}) == (None, None)
    assert keys_from_env(None, None, {}) == (None, None)
    with pytest.raises(ValueError, match="--api-key"):
        keys_from_env("", None, {})
    with pytest.raises(ValueError, match="differ"):
        keys_from_env(None, None, {"GENREC_API_KEY": "same", "GENREC_ADMIN_KEY": "same"})


def test_is_loopback() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "localhost", "LocalHost", "::1", "[::1]",
                 "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "[::]", "", "10.0.0.5", "192.168.1.2", "example.com",
                 "localhost.example.com", "::ffff:10.0.0.1", "fe80::1%eth0"):
        assert not is_loopback(host), host


def test_check_bind() -> None:
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com"):
        with pytest.raises(ValueError, match="--allow-insecure") as err:
            check_bind(host, None, None, allow_insecure=False)
        assert "without an API key" in str(err.value)
        with pytest.raises(ValueError, match="inference routes"):
            check_bind(host, None, ADMIN, allow_insecure=False)  # admin key alone: not enough
        warning = check_bind(host, None, None, allow_insecure=True)
        assert warning is not None and "--allow-insecure" in warning
        assert check_bind(host, API, None, allow_insecure=False) is None
        assert check_bind(host, API, ADMIN, allow_insecure=False) is None
    for host in ("127.0.0.1", "::1", "localhost"):
        assert check_bind(host, None, None, allow_insecure=False) is None
        assert check_bind(host, None, None, allow_insecure=True) is None
