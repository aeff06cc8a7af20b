"""Loading what an :class:`~genrec.serving.spec.AppSpec` names: the engine, ranker, catalog
updater, tokenizer and ensemble (:func:`load_components`), and the
:class:`~genrec.serving.worker.Worker` that runs them (:func:`build_worker`); a server process
and its engine process load the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from genrec.live_catalog.ids import model_ids
from genrec.live_catalog.served import ServiceCatalog
from genrec.serving.spec import AppSpec, ServeConfig
from genrec.serving.worker import Worker, initial_version
from genrec.utils.device import resolve_device


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
