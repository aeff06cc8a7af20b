"""A server's settings (:class:`ServeConfig`) and where it loads its model from
(:class:`AppSpec`, what each engine process or Ray Serve replica receives)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ServeConfig:
    """Server settings: dynamic batching, queue bound, draining, body size, whether the
    engine batches run in a child process (``engine_process``; used by :func:`load_app`), and
    the generative catalog's delta size that starts a background compaction
    (``compact_threshold``; ``None``: 1% of the catalog within [4096, 65536]; 0: never), and
    the API keys (``api_key``, ``admin_key``: :class:`~genrec.serving.auth.ApiKeyMiddleware`;
    ``None``: that key is not required), and ``catalog_state``: the directory where catalog
    updates are logged durably and replayed from on start (``None``: in memory only)."""

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 256
    model_name: str = "genrec"
    drain_timeout_s: float = 30.0
    max_body_bytes: int = 64 * 1024 * 1024
    retry_after_s: int = 1
    engine_process: bool = False  # run engine batches in a child process (engine_process.py)
    compact_threshold: int | None = None  # see serving/compaction.py
    # Bearer keys (serving/auth.py): ``api_key`` opens /v1, ``admin_key`` the catalog routes;
    # never shown in a repr or a log line
    api_key: str | None = field(default=None, repr=False)
    admin_key: str | None = field(default=None, repr=False)
    # directory of the durable catalog (live_catalog/log.py); None: updates in memory only
    catalog_state: str | None = None
    # pack batch k+1 while batch k runs (serving/scheduler.py Stages); None: on a GPU only
    overlap: bool | None = None


@dataclass(frozen=True)
class AppSpec:
    """Where a server loads its model from, and its settings: what each replica receives."""

    model: str
    ranker: str | None = None
    catalog: str | None = None
    tokenizer: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    threads: int | None = None
    config: ServeConfig = field(default_factory=ServeConfig)
    # further generative models over the model's index: /v1/recommend ranks with all of them
    # (genrec.engine.ensemble)
    ensemble: tuple[str, ...] = ()

    @classmethod
    def of(cls, model: Path | str, ranker: Path | str | None = None,
           catalog: Path | str | None = None, tokenizer: Path | str | None = None,
           **kwargs: Any) -> AppSpec:
        """A spec with the paths made absolute (replicas may not share the working
        directory)."""
        def absolute(p: Path | str | None) -> str | None:
            return None if p is None else str(Path(p).expanduser().absolute())

        kwargs["ensemble"] = tuple(absolute(p) for p in kwargs.get("ensemble", ()))
        return cls(absolute(model), absolute(ranker), absolute(catalog), absolute(tokenizer),
                   **kwargs)

    def check(self) -> None:
        """Raise ValueError naming the option of a path that does not exist: a quick check
        before starting replicas, which would each fail to load."""
        for name, path in [("model", self.model), *(("ensemble", p) for p in self.ensemble)]:
            if not (Path(path) / "config.json").is_file():
                raise ValueError(f"--{name} {path}: not a checkpoint directory (no "
                                 f"config.json)")
        for name in ("ranker", "catalog", "tokenizer"):
            path = getattr(self, name)
            if path is not None and not Path(path).exists():
                raise ValueError(f"--{name} {path}: no such file or directory")
