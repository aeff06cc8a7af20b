"""``genrec index``: Semantic IDs of a catalog, from item text, item embeddings or a
ready-made file (colliding IDs get a dedup level); codes per level from the catalog size
unless given (:mod:`genrec.catalog.codebooks`). An index built from text or embeddings keeps
its codebooks (and its sentence encoder), and ``--add`` gives new items the IDs it would have
given them (:mod:`genrec.catalog.assign`).

Heavy modules are imported inside the function so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from genrec.commands.common import INPUT_ERRORS, DeviceOpt, fail
from genrec.commands.dataset import (
    DataOpt,
    InterOpt,
    ItemsOpt,
    TableOpt,
    load_dataset,
    table_options,
)
from genrec.utils.device import resolve_device

if TYPE_CHECKING:
    import torch


@table_options
def index_command(
    out: Annotated[Path, typer.Option(help="Where to write the index (JSON).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    from_text: Annotated[bool, typer.Option(help="Embed item text with the sentence encoder, "
                                                 "then residual k-means.")] = False,
    embeddings: Annotated[Path | None, typer.Option(
        help="Item embeddings (.npy / .safetensors), one row per item.")] = None,
    sid_file: Annotated[Path | None, typer.Option(help="Ready-made Semantic IDs "
                                                       "({item: ['<a_1>', ...]}).")] = None,
    levels: Annotated[int, typer.Option(min=1, help="k-means levels.")] = 3,
    codebook_size: Annotated[int | None, typer.Option(
        min=2, help="Codes per level (default: from the catalog size, about 16 IDs per "
                    "item: 64 for 2k-12k items at 3 levels, 256 for 1M).")] = None,
    iters: Annotated[int, typer.Option(min=1, help="k-means iterations.")] = 50,
    balanced: Annotated[bool, typer.Option(help="Balanced k-means: each level's codes used "
                                                "about equally (capacity n / codes).")] = True,
    encoder: Annotated[Path | None, typer.Option(help="Local sentence-encoder folder "
                                                      "(default: bundled MiniLM).")] = None,
    collaborative: Annotated[float, typer.Option(
        min=0.0, help="With --from-text or --embeddings: weight of the items' interaction "
                      "factors (an SVD of the training interactions) beside their embedding "
                      "(0: text alone; see genrec.catalog.collaborative).")] = 0.0,
    collaborative_dim: Annotated[int, typer.Option(
        min=1, help="Size of the interaction factors.")] = 64,
    add: Annotated[Path | None, typer.Option(
        help="Add new items to the index at --out (a table: item id and text columns, or an "
             "'embedding' column): each gets the ID the index gives it.")] = None,
    seed: int = 0, device: DeviceOpt = "auto",
) -> None:
    """Build Semantic IDs (text, embeddings or a ready-made file; collisions get a dedup level)."""
    if add is not None:
        add_command(out, add, device)
        return
    import dataclasses

    from genrec.catalog import (
        SentenceEncoder,
        build_semantic_index,
        item_texts,
        load_embeddings,
        load_sid_index,
    )
    from genrec.catalog.assign import encoder_spec
    from genrec.catalog.codebooks import CODEBOOKS_KEY, IdCodebooks, default_codebook_size
    from genrec.catalog.collaborative import interaction_factors, with_collaborative
    from genrec.catalog.semantic_ids import duplicate_groups, prefix_stats
    from genrec.data.split import training_sequences

    try:
        ds = load_dataset(data, interactions, items, table)
        if from_text + (embeddings is not None) + (sid_file is not None) > 1:
            raise typer.BadParameter("give at most one of --from-text, --embeddings, --sid-file")
        if collaborative and not from_text and embeddings is None:
            raise typer.BadParameter("--collaborative: give --from-text or --embeddings")
        if not from_text and embeddings is None:
            sid_file = sid_file or ds.semantic_id_path
            if sid_file is None:
                raise typer.BadParameter("no source: give --from-text, --embeddings or "
                                         "--sid-file (the dataset has no sid-rqvae file)")
            index = load_sid_index(sid_file, ds.item_index, on_collision="dedup")
        else:
            if from_text:
                enc = SentenceEncoder(encoder, resolve_device(device))
                emb = enc.encode(item_texts(ds.item_text, ds.num_items))
            else:
                emb = load_embeddings(embeddings)
            if emb.shape[0] != ds.num_items:
                raise ValueError(f"embeddings: {emb.shape[0]} rows, dataset has {ds.num_items}")
            cf_dim = collaborative_dim if collaborative else 0
            if cf_dim:  # the embeddings are normalised first: the weight is the parts' ratio
                factors = interaction_factors(training_sequences(ds.sequences), ds.num_items,
                                              cf_dim, seed=seed)
                emb = with_collaborative(emb, factors, collaborative)
            codebook_size = codebook_size or default_codebook_size(ds.num_items, levels)
            index = build_semantic_index(emb.to(resolve_device(device)), levels, codebook_size,
                                         iters=iters, seed=seed, item_ids=list(ds.item_ids),
                                         balanced=balanced)
            index = index.to("cpu")
            if from_text or cf_dim:  # new items' embeddings are then normalised the same
                books = IdCodebooks.from_meta(index.meta[CODEBOOKS_KEY], index.codebook_sizes,
                                              "index")
                index.meta[CODEBOOKS_KEY] = dataclasses.replace(
                    books, normalize="l2", collaborative=cf_dim,
                    encoder=encoder_spec(enc, encoder) if from_text else None).to_meta()
                if cf_dim:
                    index.meta["collaborative_weight"] = collaborative
        index.save(out)
    except INPUT_ERRORS as err:
        raise fail(err) from None
    groups = duplicate_groups(index.codes[:, :-1])
    typer.echo(f"items {index.num_items}  levels {index.num_levels}  codebook sizes "
               f"{index.codebook_sizes}")
    for row in prefix_stats(index.codes):
        typer.echo(f"  prefix of {row['level']} levels: {row['distinct']} distinct, largest "
                   f"group {row['largest_group']}, {row['unique_share']:.1%} of items alone")
    typer.echo(f"collisions resolved: {sum(len(g) for g in groups)} items in {len(groups)} "
               f"groups (last level = dedup counter)  -> {out}")


def read_new_items(path: Path) -> tuple[list[str], list[str] | None, torch.Tensor | None]:
    """A table of new items: their ids, and their text (the item id column, then its text
    columns, formatted as ``--from-text`` formats item text) or their embeddings (an
    ``embedding`` column: lists of numbers, or JSON lists in a CSV)."""
    import json

    import torch

    from genrec.catalog import format_item_text
    from genrec.data.columns import (
        TableColumns,
        column_key,
        find_column,
        parse_column,
        read_table,
    )
    from genrec.data.table_dataset import items_table

    table = read_table(path)
    emb_col = next((c for c in table if column_key(c) == "embedding"), None)
    if emb_col is None:
        ids, text, _ = items_table(path, None, None, None, TableColumns("", "", None))
        return ids, [format_item_text(text[i]) for i in ids], None
    id_col = str(find_column(list(table), "item id", None, where=path.name))
    ids = parse_column(table, id_col, "id", path)
    rows = []
    for r, value in enumerate(table[emb_col]):
        try:
            row = json.loads(value) if isinstance(value, str) else list(value)
            rows.append([float(v) for v in row])
        except (TypeError, ValueError):
            raise ValueError(f"{path.name}: row {r + 1}, column {emb_col!r}: not a list of "
                             f"numbers") from None
    if len({len(r) for r in rows}) > 1:
        raise ValueError(f"{path.name}: column {emb_col!r}: rows of different lengths")
    return ids, None, torch.tensor(rows, dtype=torch.float32).reshape(len(ids), -1)


def add_command(out: Path, add: Path, device: str) -> None:
    """``genrec index --out INDEX --add TABLE``: the table's items appended to the index with
    the IDs its codebooks give them (atomically: the index is rewritten whole)."""
    from genrec.catalog import SemanticIndex
    from genrec.catalog.assign import IdAssigner, with_items

    try:
        index = SemanticIndex.load(out)
        assigner = IdAssigner.of(index, resolve_device(device))
        if assigner is None:
            raise ValueError(f"--out {out}: this index has no codebooks (built from a "
                             f"ready-made Semantic-ID file): new items need their Semantic IDs")
        ids, texts, emb = read_new_items(add)
        if emb is not None:
            if emb.shape[1] != assigner.dim:
                raise ValueError(f"--add {add.name}: embeddings of {emb.shape[1]} values, the "
                                 f"index takes {assigner.dim}")
            emb = assigner.codebooks.prepared(emb)
        else:
            emb = assigner.embed(texts, f"--add {add.name}")
        codes = assigner.assign(emb, index.codes_to_items,
                                fields=[f"--add {add.name}: item {i!r}" for i in ids])
        index = with_items(index, ids, codes)
        index.save(out)
    except INPUT_ERRORS as err:
        raise fail(err) from None
    typer.echo(f"added {len(ids)} items -> {out} ({index.num_items} items)")
