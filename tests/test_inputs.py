"""build_input_embeds: text, virtual item tokens, soft tokens and raw embeddings in one pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from genrec.catalog.item_table import ItemTable
from genrec.engine.inputs import Embeds, InputError, InputPacker, build_input_embeds
from genrec.model.projector import SoftTokenProjector


def test_every_kind_of_segment_lands_in_place() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    table = ItemTable(torch.randn(3, 2, 4))
    proj = SoftTokenProjector(5, 4)
    packer = InputPacker()
    raw = torch.randn(2, 4)
    packer.add([1, 10 + 5, 2], "a")  # virtual id 15 = item 2, vector 1
    packer.add([Embeds(raw), 0, 3], "b")
    user = torch.randn(5)
    inputs = packer.finish([5], [user])  # row 5 (token 0) becomes the soft token
    x = build_input_embeds(emb, inputs, table, proj)
    assert x.shape == (7, 4)
    assert torch.equal(x[0], emb.weight[1]) and torch.equal(x[2], emb.weight[2])
    assert torch.equal(x[1], table.vectors[2, 1])
    assert torch.equal(x[3:5], raw)
    assert torch.allclose(x[5], proj(user[None])[0])
    assert torch.equal(x[6], emb.weight[3])


def test_packer_rejects_bad_elements() -> None:
    packer = InputPacker()
    with pytest.raises(InputError, match="field: elements must be int"):
        packer.add([1, 2.5], "field")
    with pytest.raises(InputError, match=r"Embeds must be \[n, hidden\]"):
        packer.add([Embeds(torch.randn(4))], "field")
    with pytest.raises(InputError, match="sequence of token ids"):
        packer.add("abc", "field")
