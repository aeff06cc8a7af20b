"""The server the schema fuzzer (test_serving_fuzz.py) sends its requests to, run as its own
process (not a test module).

    python serving_fuzz_server.py PORT DUMP.json

Serves the serving tests' tiny generative engine (40 items, user_dim 5), a tiny random DuoLM
ranker over 40 items with its catalog updater (:class:`RankerCatalogUpdater`, vectors only:
no item encoder) and a character tokenizer on 127.0.0.1:PORT, with API keys from
``GENREC_API_KEY`` / ``GENREC_ADMIN_KEY`` (:func:`genrec.serving.auth.keys_from_env`), until
SIGTERM. Then, after draining, it writes the catalogs it ended with to DUMP.json (see
:func:`catalog_dump`).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import torch
from serving_support import N_ITEMS, CharTokenizer, tiny_engine

from genrec.catalog.item_table import ItemTable
from genrec.duolm.prompts import SOFT_ID, STUDENT_VOCAB_SIZE
from genrec.duolm.ranker import DuoRanker
from genrec.engine import Engine, EngineConfig
from genrec.live_catalog.state import CatalogState
from genrec.model import build_model
from genrec.serving import ServeConfig, create_app, run_server
from genrec.serving.auth import keys_from_env
from genrec.serving.backends import RankerCatalogUpdater
from genrec.training.duolm_task import ranker_config

TOKENS_PER_ITEM, HIDDEN = 2, 32


def tiny_ranker() -> DuoRanker:
    """A random DuoLM student over ``N_ITEMS`` items (``TOKENS_PER_ITEM`` x ``HIDDEN``)."""
    torch.manual_seed(1)
    model = build_model(ranker_config(STUDENT_VOCAB_SIZE, HIDDEN, 2, 4, 2, 128))
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID))
    return DuoRanker(engine, ItemTable(torch.randn(N_ITEMS, TOKENS_PER_ITEM, HIDDEN)))


def catalog_dump(catalog: CatalogState, version: int, ranker_active: list[bool]) -> dict:
    """What the fuzzer compares: the generative catalog's Semantic IDs and lookups of items
    ``0 .. N-1``, its retired items and version, the service's catalog version, and which
    items of the ranker's table are active."""
    n = catalog.num_items
    codes = catalog.codes_of(list(range(n)))
    return {"codes": codes.tolist(), "lookup": catalog.lookup(codes).tolist(),
            "retired": catalog.retired(), "version": version, "state_version": catalog.version,
            "ranker_active": ranker_active}


def main() -> None:
    port, dump = int(sys.argv[1]), Path(sys.argv[2])
    api_key, admin_key = keys_from_env(None, None)
    torch.set_num_threads(1)  # tiny tensors; the test process needs the other core
    engine, ranker = tiny_engine(), tiny_ranker()
    app = create_app(engine, ranker=ranker, catalog_updater=RankerCatalogUpdater(ranker),
                     tokenizer=CharTokenizer(),
                     config=ServeConfig(max_batch_size=8, max_wait_ms=1, api_key=api_key,
                                        admin_key=admin_key))
    # uvicorn re-raises the SIGTERM it drained on, under the handler it found: this one lets
    # the process go on to write the dump
    signal.signal(signal.SIGTERM, lambda *_: None)
    run_server(app, host="127.0.0.1", port=port, log_level="warning")
    table = ranker.table
    active = [True] * table.num_items if table.active is None else table.active.tolist()
    dump.write_text(json.dumps(catalog_dump(engine.catalog, app.state.service.catalog_version(),
                                            active)))


if __name__ == "__main__":
    main()
