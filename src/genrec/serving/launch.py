"""Starting a server: its settings (:class:`ServeConfig`), where it loads its model from
(:class:`AppSpec`, what each engine process or Ray Serve replica receives), and the loaders
that build the app from them (:func:`load_components`, :func:`load_app`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genrec.live_catalog.ids import model_ids
from genrec.live_catalog.served import ServiceCatalog
from genrec.serving.worker import BatchWorker, Worker, initial_version
from genrec.utils.device import resolve_device

if TYPE_CHECKING:
    from fastapi import FastAPI


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
    # directory of the durable catalog (serving/catalog_log.py); None: updates in memory only
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


@dataclass
class Components:
    """What a server runs: the engine and the optional ranker, catalog updater, tokenizer,
    and the ensemble that recommends (the engine and further models) when there is one."""

    engine: Any
    ranker: Any = None
    updater: Any = None
    tokenizer: Any = None
    ensemble: Any = None


def load_components(spec: AppSpec) -> Components:
    """Load the engine (and ranker, catalog updater, tokenizer) named by ``spec``. Raises
    ValueError / RuntimeError / OSError (a bad checkpoint, a missing package)."""
    from genrec.engine import Engine
    from genrec.serving.backends import load_catalog_updater, load_ranker, load_tokenizer

    dev = resolve_device(spec.device, spec.threads)
    engine = Engine.from_pretrained(spec.model, dtype=spec.dtype, device=dev)
    ranker = (load_ranker(spec.ranker, spec.catalog, dev, spec.dtype)
              if spec.ranker is not None else None)
    updater = load_catalog_updater(spec.catalog, ranker) if spec.catalog is not None else None
    tokenizer_dir = spec.tokenizer
    vocab = engine.vocab
    if tokenizer_dir is None and vocab is not None and vocab.text_vocab:
        tokenizer_dir = spec.model  # a vocabulary-extended model keeps its LM's tokenizer
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
    ensemble = None
    if spec.ensemble:
        from genrec.engine.ensemble import Ensemble

        members = [engine, *(Engine.from_pretrained(p, dtype=spec.dtype, device=dev)
                             for p in spec.ensemble)]
        try:
            ensemble = Ensemble(members)
        except ValueError as err:
            raise ValueError(f"--ensemble: {err}") from None
    return Components(engine, ranker, updater, tokenizer, ensemble)


def build_worker(parts: Components, config: ServeConfig, writable: bool = True) -> Worker:
    """The :class:`~genrec.serving.worker.Worker` of ``parts``; with ``config.catalog_state``
    its catalog is the durable one in that directory, replayed now and then followed: other
    server processes (replicas) may share the directory, each applying what the others log
    (``writable=False``: this process logs nothing; it takes the updates it is given from the
    log, where the process that writes for it put them). Raises ``CatalogLogError`` when the
    directory cannot be replayed onto these catalogs."""
    catalog: Any = parts.updater
    has_catalog = parts.updater is not None or parts.engine.catalog is not None
    if config.catalog_state is not None and has_catalog:
        catalog = ServiceCatalog.from_dir(
            parts.engine, parts.updater, config.catalog_state,
            version=initial_version(parts.engine, parts.ranker),
            compact_threshold=config.compact_threshold, writable=writable, follow=True,
            ids=model_ids(parts.engine, parts.ranker))
    return Worker(parts.engine, parts.ranker, catalog, config.compact_threshold, parts.ensemble)


def load_app(spec: AppSpec, device: str | None = None) -> FastAPI:
    """Load what ``spec`` names (:func:`load_components`) into a
    :class:`~genrec.serving.worker.Worker` and build the app around it
    (:func:`genrec.serving.app.build_app`); with ``spec.config.engine_process``, the batches
    run in a child process that loads the same
    (:class:`~genrec.serving.engine_process.EngineProcess`; the local worker then checks
    requests and mirrors catalog updates).

    Raises ValueError / RuntimeError / OSError (a bad checkpoint, a missing package).
    """
    from genrec.serving.app import build_app  # both modules import this one
    from genrec.serving.engine_process import EngineProcess

    if device is not None:
        spec = replace(spec, device=device)
    parts = load_components(spec)
    # with an engine process, the child logs the updates and this copy only mirrors them
    # (its replay done before the child can write)
    local = build_worker(parts, spec.config, writable=not spec.config.engine_process)
    worker: BatchWorker = EngineProcess(spec, local) if spec.config.engine_process else local
    return build_app(worker, tokenizer=parts.tokenizer, config=spec.config)
