"""Hypothesis strategies for the schema fuzzer (test_serving_fuzz.py; not a test module):
:func:`from_schema` turns a JSON schema of the OpenAPI spec into values (valid-shaped, with
boundary values, huge numbers and odd unicode, or broken in one place: a wrong type, a bound
crossed, a field missing or unknown), :func:`calls` into whole requests (those bodies, bodies
that are not JSON, wrong content types, odd deadline headers, missing or wrong keys).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

BIG = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**63) - 1]
ODD_TEXT = ["", " ", "<a_0> <b_0> <c_0>", "<a_4> <b_3> <c_2> <a_0> <b_1> <c_1>", "\x00",
            "<a_99999999999999999999> <b_0> <c_0>", "\ud800", "😀é\u202e\ufeff", "a" * 3000]
JUNK = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=6),
                 st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
LONG, LONGEST = 4096, 100_001  # longest list drawn valid / invalid (by repeating one element)
# Values of the tiny catalogs (40 items, 3-level IDs over 5 x 4 x 3 codes from token 3 on,
# user_dim 5, 15 text tokens; ranker items of 2 x 32 values), drawn for these fields
# (``Body.field`` or ``field``) three times in four instead of the schema's own: bodies that
# get past the checks to the engine.
SID = st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 2)).map(list)
ID = st.one_of(st.integers(0, 39), st.integers(40, 42))  # known items, or new ones
TOKENS = st.lists(st.integers(0, 14), min_size=1, max_size=4)
# the ranker's item vectors, [2, 32] (or one row or column short); vectors that are not
# numbers are a known 500 (test_serving_fuzz.py: test_vectors_that_are_not_numbers)
VECTORS = st.builds(lambda x, rows, cols: [[x] * cols] * rows, st.floats(-1, 1),
                    st.sampled_from([2] * 5 + [1]), st.sampled_from([32] * 5 + [31]))
HINTS = {"semantic_id": SID, "item_id": ID, "history": st.lists(ID, min_size=1, max_size=4),
         "exclude": st.lists(ID, max_size=4), "allow": st.lists(ID, max_size=30),
         "item_ids": st.lists(ID, min_size=1, max_size=3),
         "candidates": st.lists(ID, min_size=1, max_size=6),
         "CatalogUpsertBody.items": st.lists(st.one_of(
             st.fixed_dictionaries({"item_id": ID, "semantic_id": SID}),
             st.fixed_dictionaries({"item_id": ID, "vectors": VECTORS}),
             st.fixed_dictionaries({"item_id": ID, "semantic_id": SID, "vectors": VECTORS})),
             min_size=1, max_size=2, unique_by=lambda it: it["item_id"]),
         "user_vector": st.lists(st.floats(-2, 2), min_size=5, max_size=5),
         "label_token_ids": TOKENS, "query": TOKENS, "ScoreBody.items": st.lists(TOKENS),
         "prompt": st.one_of(st.lists(SID, max_size=3).map(
             lambda ids: " ".join(f"<a_{a}> <b_{b}> <c_{c}>" for a, b, c in ids)),
             st.lists(SID, max_size=3).map(
                 lambda ids: [0] + [t for a, b, c in ids for t in (3 + a, 8 + b, 12 + c)])),
         "use_beam_search": st.just(True), "stream": st.just(False)}


def from_schema(schema: dict, defs: dict, invalid: bool = False) -> st.SearchStrategy:
    """Values of a JSON schema (OpenAPI's subset: ``$ref``, ``anyOf``, object, array, integer,
    number, string, boolean, null); ``invalid``: values broken in one place (may still be
    valid where ``anyOf`` or lax types accept them)."""
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs, invalid) for s in schema["anyOf"]])
    kind = schema.get("type")
    if not isinstance(kind, str):
        return JUNK  # any value
    make = {"object": objects, "array": arrays}.get(kind, scalars)
    strategy = make(schema, defs, invalid)
    return st.one_of(strategy, strategy, JUNK) if invalid else strategy


def scalars(schema: dict, defs: dict, invalid: bool) -> st.SearchStrategy:
    """Integers (small, bounds, huge), numbers, strings (odd unicode, Semantic-ID-like
    text), booleans, null; ``invalid``: a bound crossed or a wrong type."""
    kind, most = schema["type"], schema.get("maxLength")
    if kind == "integer":
        lo = (int(schema["minimum"]) if "minimum" in schema else int(schema["exclusiveMinimum"])
              + 1 if "exclusiveMinimum" in schema else -(2**63))
        hi = int(schema["maximum"]) if "maximum" in schema else None
        if invalid:
            edges = [lo - 1, *([] if hi is None else [hi + 1]), *(v for v in BIG if v < lo)]
            return st.sampled_from([*edges, 1.5, 2.0, "3", True])
        top = hi if hi is not None else 2**63 - 1
        huge = [v for v in BIG if lo <= v and (hi is None or v <= hi)]
        return st.one_of(st.integers(lo, min(top, lo + 5)), st.integers(lo, min(top, lo + 45)),
                         st.sampled_from([lo, top, *huge]), st.integers(lo, top))
    if kind == "number":
        if invalid:
            return st.sampled_from([float("nan"), float("inf"), float("-inf"), "1.0", True])
        return st.one_of(st.floats(-4, 4), st.floats(allow_nan=False, allow_infinity=False),
                         st.integers(-3, 3), st.sampled_from([0.0, -0.0, 1e308, 5e-324]))
    if kind == "string":
        if invalid:
            return st.just("a" * (most + 1)) if most is not None else JUNK
        return st.one_of(st.text(max_size=24),
                         st.sampled_from([s for s in ODD_TEXT if len(s) <= (most or 1e9)]),
                         st.from_regex(r"(<[a-d]_[0-9]{1,2}> ?){0,7}", fullmatch=True))
    if kind == "boolean":
        return st.sampled_from([0, 1, "true", "no", None]) if invalid else st.booleans()
    return JUNK if invalid else st.none()


def arrays(schema: dict, defs: dict, invalid: bool) -> st.SearchStrategy:
    """Short lists, or lists of the bound lengths (one element repeated); ``invalid``: a bad
    element, or a length past a bound."""
    item = from_schema(schema["items"], defs)
    lo, hi = schema.get("minItems", 0), schema.get("maxItems")
    short = st.lists(item, min_size=lo, max_size=max(lo, min(hi or 8, 8)))
    repeat = lambda lengths: st.builds(lambda x, k: [x] * k, item, st.sampled_from(lengths))  # noqa: E731
    if not invalid:
        return st.one_of(short, repeat([k for k in (lo, hi) if k is not None and k <= LONG]))
    bad_item = st.builds(lambda xs, x, k: [*xs[:k], x, *xs[k:]], short,
                         from_schema(schema["items"], defs, True), st.integers(0, 8))
    lengths = [lo - 1] * (lo > 0) + ([hi + 1] if hi is not None and hi < LONGEST else [])
    return st.one_of(bad_item, repeat(lengths)) if lengths else bad_item


def objects(schema: dict, defs: dict, invalid: bool) -> st.SearchStrategy:
    """The required fields and some optional ones (:data:`HINTS` for theirs), extra ones
    where allowed; ``invalid``: a required field missing, one field bad, or an unknown one."""
    props, required = schema.get("properties", {}), schema.get("required", [])
    good = {k: from_schema(v, defs) for k, v in props.items()}
    hinted = list(required)  # and the fields with a hint, in half the bodies
    for k in props:
        hint = HINTS.get(f"{schema.get('title')}.{k}", HINTS.get(k))
        if hint is not None:
            good[k] = st.one_of(hint, hint, hint, good[k])
            hinted += [] if k in required else [k]
    valid = st.one_of([st.fixed_dictionaries(
        {k: good[k] for k in keys}, optional={k: s for k, s in good.items() if k not in keys})
        for keys in (required, hinted)])
    extra = schema.get("additionalProperties", True) is not False
    if extra:
        more = st.dictionaries(st.text(max_size=6), JUNK, max_size=2)
        valid = st.builds(lambda d, e: {**e, **d}, valid, st.one_of(st.just({}), more))
    if not invalid:
        return valid
    bad = {k: from_schema(v, defs, True) for k, v in props.items()}
    ways = [("missing", k) for k in required] + [("bad", k) for k in props]
    ways += [] if extra else [("unknown", "")]
    if not ways:
        return JUNK

    @st.composite
    def broken(draw: st.DrawFn) -> dict:
        body, (how, key) = draw(valid), draw(st.sampled_from(ways))
        if how == "missing":
            body.pop(key)
        elif how == "bad":
            body[key] = draw(bad[key])
        else:
            body[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in props))] = (
                draw(JUNK))
        return body

    return broken()


def raw_bodies(valid: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Bodies that are not (one) JSON document: bytes, truncated or re-encoded JSON, scalars,
    deep nesting, duplicate keys."""
    encoded = valid.map(lambda v: json.dumps(v).encode())
    utf8 = valid.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    odd = [b"", b"null", b"[]", b"{}", b'"x"', b"NaN", b"1e999", b"[" * 50_000,
           b'{"a":' * 50_000, b"\xef\xbb\xbf{}", b'{"history": [1], "history": "x"}']
    return st.one_of(st.binary(max_size=64), st.sampled_from(odd),
                     st.builds(lambda b, k: b[:k], encoded, st.integers(0, 200)),
                     utf8, encoded.map(lambda b: b.decode().encode("utf-16")))


@dataclass
class Call:
    """One request, and whether its key opens its route."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    params: dict[str, str]
    authorized: bool

    def has_deadline(self) -> bool:
        """Whether the request sets a deadline (header or body field)."""
        try:
            body = json.loads(self.body)
        except (ValueError, RecursionError):
            body = None
        return "x-deadline-ms" in self.headers or (isinstance(body, dict)
                                                   and "deadline_ms" in body)

    def repro(self) -> str:
        """The request as text, to send again by hand."""
        return (f"{self.method} {self.path} params={self.params} headers={self.headers}\n"
                f"body ({len(self.body)} bytes): {self.body[:1500]!r}")


CONTENT_TYPES = ["application/json"] * 40 + [None, "text/plain", "application/xml",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                 "application/json; charset=utf-16", "application/problem+json"]
DEADLINES = [None] * 40 + ["1", "250", "0", "-5", "nan", "inf", "1e400", "abc", "99999999999"]
BODIES = ["valid"] * 5 + ["broken"] * 2 + ["raw"]  # sampled_from: weights as written
KEYS = ["right"] * 30 + ["api", "admin", "none", "wrong", "malformed"]


def calls(methods: list[str], paths: list[str], schema: dict | None, defs: dict,
          api_key: str, admin_key: str) -> st.SearchStrategy[Call]:
    """Requests to ``paths`` with ``methods``: bodies valid for ``schema`` (or empty when
    None), broken in one place, or not JSON; odd headers; mostly the key that opens the
    route (the admin key for the catalog routes, else the api key), sometimes another."""
    shape = from_schema(schema, defs) if schema else st.just({})
    valid = shape.map(lambda v: json.dumps(v).encode())
    broken = (from_schema(schema, defs, True).map(lambda v: json.dumps(v).encode()) if schema
              else st.just(b""))
    bodies = {"valid": valid, "broken": broken, "raw": raw_bodies(shape)}

    @st.composite
    def call(draw: st.DrawFn) -> Call:
        method, path = draw(st.sampled_from(methods)), draw(st.sampled_from(paths))
        headers = {}
        for name, choices in (("content-type", CONTENT_TYPES), ("x-deadline-ms", DEADLINES)):
            value = draw(st.sampled_from(choices))
            if value is not None:
                headers[name] = value
        which = draw(st.sampled_from(KEYS))
        catalog = path.startswith("/v1/catalog")
        if which == "right":
            which = "admin" if catalog else "api"
        token = {"api": f"Bearer {api_key}", "admin": f"Bearer {admin_key}",
                 "wrong": "Bearer nope", "malformed": f"Basic {api_key}"}.get(which)
        if token is not None:
            headers["authorization"] = token
        ok = not path.startswith("/v1") or which == "admin" or (which == "api" and not catalog)
        params = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=2))
        body = draw(bodies[draw(st.sampled_from(BODIES))])
        return Call(method, path, headers, body, params, ok)

    return call()
