"""Building dataclasses from dictionaries strictly: unknown keys are an error."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def strict_from_dict(cls: type[T], data: dict[str, Any], what: str) -> T:
    """``cls(**data)``, raising ValueError naming ``what`` when ``data`` has unknown keys."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} keys: {unknown}")
    return cls(**data)
