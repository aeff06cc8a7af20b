"""``genrec index``: Semantic IDs of a catalog, from item text, item embeddings or a
ready-made file (colliding IDs get a dedup level); codes per level from the catalog size
unless given (:mod:`genrec.catalog.codebooks`).

Heavy modules are imported inside the function so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    seed: int = 0, device: DeviceOpt = "auto",
) -> None:
    """Build Semantic IDs (text, embeddings or a ready-made file; collisions get a dedup level)."""
    from genrec.catalog import (
        build_semantic_index,
        encode_texts,
        item_texts,
        load_embeddings,
        load_sid_index,
    )
    from genrec.catalog.codebooks import default_codebook_size
    from genrec.catalog.semantic_ids import duplicate_groups, prefix_stats

    try:
        ds = load_dataset(data, interactions, items, table)
        if from_text + (embeddings is not None) + (sid_file is not None) > 1:
            raise typer.BadParameter("give at most one of --from-text, --embeddings, --sid-file")
        if not from_text and embeddings is None:
            sid_file = sid_file or ds.semantic_id_path
            if sid_file is None:
                raise typer.BadParameter("no source: give --from-text, --embeddings or "
                                         "--sid-file (the dataset has no sid-rqvae file)")
            index = load_sid_index(sid_file, ds.item_index, on_collision="dedup")
        else:
            if from_text:
                emb = encode_texts(item_texts(ds.item_text, ds.num_items), encoder,
                                   resolve_device(device))
            else:
                emb = load_embeddings(embeddings)
            if emb.shape[0] != ds.num_items:
                raise ValueError(f"embeddings: {emb.shape[0]} rows, dataset has {ds.num_items}")
            codebook_size = codebook_size or default_codebook_size(ds.num_items, levels)
            index = build_semantic_index(emb.to(resolve_device(device)), levels, codebook_size,
                                         iters=iters, seed=seed, item_ids=list(ds.item_ids),
                                         balanced=balanced)
            index = index.to("cpu")
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
