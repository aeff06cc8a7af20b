"""The served catalog: the catalog a server updates live, durably, under one version.

Its front door is the id map: the table's item ids enter and leave through
:class:`~genrec.catalog.id_map.IdMap` (every unknown id refused there, naming the field), and
:mod:`~genrec.live_catalog.ids` turns an update's ids into rows, adding the unseen ones. Then

- ``items.py``: which catalog an upserted item goes to, and what a server cannot take;
- ``state.py``: ``CatalogState``, the immutable generative catalog (base + delta) the engine
  searches; ``delta.py``: its next state after an update, and the rebase after a compaction;
- ``served.py``: ``ServiceCatalog``, both catalogs (generative, ranker) updated together, all
  or nothing, with the id map; ``update_plan.py``: one update planned on both catalogs
  (``PreparedUpdate``, ``CatalogChange``); ``host.py``: the engine and ranker updater it is
  coded against;
- ``log.py`` / ``log_format.py``: the append-only update log (fsync'd before an answer) and
  its records; ``dir_lock.py``: the state directory's lock; ``base.py``: the base snapshot a
  log is folded into; ``state_dir.py``: opening a catalog from its state directory (replay)
  and writing to a shared one; ``follow.py``: reading a state directory and following what
  other processes log;
- ``compaction.py``: the background compaction of the delta and the log's folds.
"""

from genrec.live_catalog.host import CatalogHost, CatalogUpdater
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.state import CatalogState
from genrec.live_catalog.update_plan import CatalogChange

__all__ = ["CatalogChange", "CatalogHost", "CatalogState", "CatalogUpdater", "ServiceCatalog"]
