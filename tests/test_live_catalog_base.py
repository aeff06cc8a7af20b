"""Base snapshots of a catalog state directory: the file round trip (int16 codes), the ranker's
net changes and the updater calls that replay them, the generative catalog's net change of
many updates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genrec.live_catalog.base import (
    CatalogBase,
    GenerativeBase,
    RankerItem,
    fold_ranker,
    net_generative,
    ranker_calls,
    read_base,
    write_base,
)
from genrec.live_catalog.log_format import CatalogLogError


def test_ranker_net_changes_and_the_calls_that_replay_them() -> None:
    net = fold_ranker({5: RankerItem({"item_id": 5, "text": "old"})}, [
        ("upsert", [{"item_id": 1, "text": "a"}, {"item_id": 2, "semantic_id": [0, 1]},
                    {"item_id": 3, "vectors": [[0.5]], "semantic_id": [1, 1]}]),
        ("retire", [1, 7]),
        ("upsert", [{"item_id": 4, "vectors": [[1.0]]}, {"item_id": 7, "text": "b"}]),
        ("retire", [5])])
    assert net == {1: RankerItem({"item_id": 1, "text": "a"}, True),
                   3: RankerItem({"item_id": 3, "vectors": [[0.5]]}),
                   4: RankerItem({"item_id": 4, "vectors": [[1.0]]}),
                   5: RankerItem({"item_id": 5, "text": "old"}, True),
                   7: RankerItem({"item_id": 7, "text": "b"})}
    assert ranker_calls(net) == [
        ("upsert", [{"item_id": 1, "text": "a"}]),
        ("upsert", [{"item_id": 3, "vectors": [[0.5]]}, {"item_id": 4, "vectors": [[1.0]]}]),
        ("upsert", [{"item_id": 5, "text": "old"}, {"item_id": 7, "text": "b"}]),
        ("retire", [1, 5])]


def test_base_files_round_trip(tmp_path: Path) -> None:
    codes = torch.arange(8, dtype=torch.int16).reshape(4, 2) % 7
    base = CatalogBase(3, GenerativeBase(codes, (7, 7), torch.tensor([1, 3])),
                       {2: RankerItem({"item_id": 2, "text": "x"}, True)})
    path = write_base(tmp_path, base)
    assert path.name == "base-3.pt" and not list(tmp_path.glob(".*"))
    back = read_base(path)
    assert back.version == 3 and back.ranker == base.ranker
    assert torch.equal(back.generative.codes, codes) and back.generative.codes.dtype == torch.int16
    assert torch.equal(back.generative.retired, base.generative.retired)
    assert back.generative.codebook_sizes == (7, 7)
    path.write_bytes(b"junk")
    with pytest.raises(CatalogLogError, match="base-3.pt: not a readable catalog base"):
        read_base(path)


def test_the_generative_net_change_of_many_updates() -> None:
    sids, retired = net_generative([
        ("upsert", [{"item_id": 40, "semantic_id": [1, 2]}, {"item_id": 3, "text": "x"}]),
        ("retire", [40, 5, 77]),
        ("upsert", [{"item_id": 5, "semantic_id": [0, 0]}, {"item_id": 41, "semantic_id": [3, 3]}]),
        ("upsert", [{"item_id": 40, "semantic_id": [2, 2], "text": "y"}]),
        ("retire", [41])])
    assert sids == {40: [2, 2], 5: [0, 0], 41: [3, 3]}  # the last ID of each; text is not one
    assert retired == {41, 77}  # 40 and 5 came back; 77 is beyond the catalog (the ranker's)
