"""Commands of generative retrieval: ``index`` (Semantic IDs), ``train generative``, ``eval``.

Register in ``genrec.cli`` with one line each::

    app.add_typer(train_app, name="train")
    app.command("eval")(eval_command)
    app.command("index")(index_command)

Heavy modules are imported inside the functions so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

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
    from genrec.catalog.semantic_ids import SemanticIndex
    from genrec.data.loaders import Dataset

train_app = typer.Typer(help="Train models.", no_args_is_help=True)

DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | cuda[:N].")]
ThreadsOpt = Annotated[int | None, typer.Option(min=1, help="CPU threads for torch (default: "
                                                           "torch's; 1 is faster on a busy CPU).")]
NprocOpt = Annotated[int, typer.Option(min=1, help="Data-parallel processes on this machine (runs "
                                                  "the command under torchrun: gloo on the "
                                                  "CPU, NCCL on GPUs).")]
GradAccumOpt = Annotated[int, typer.Option(min=1, help="Batches per optimizer step.")]
PrecisionOpt = Annotated[str, typer.Option(help="fp32 | bf16 (autocast; fp32 master weights).")]
_INPUT_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def _fail(err: Exception) -> typer.Exit:
    typer.echo(f"error: {err}", err=True)
    return typer.Exit(code=1)


def write_train_args(out: Path, args: dict, resume: bool) -> None:
    """The command's arguments in ``out/train_args.json`` (kept as first written on
    ``resume``); the folder is made."""
    from genrec.utils.atomic import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    if not (resume and (out / "train_args.json").is_file()):
        atomic_write_json(out / "train_args.json", args)


def check_index(index: SemanticIndex, dataset: Dataset, where: str) -> None:
    """Raise ValueError naming ``where`` when the index does not cover the dataset's items."""
    if index.num_items != dataset.num_items:
        raise ValueError(f"{where}: {index.num_items} items, the dataset has {dataset.num_items}")
    if index.item_ids is not None and list(index.item_ids) != list(dataset.item_ids):
        raise ValueError(f"{where}: item ids differ from the dataset's (built for another one?)")


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
    codebook_size: Annotated[int, typer.Option(min=2, help="Codes per level.")] = 256,
    iters: Annotated[int, typer.Option(min=1, help="k-means iterations.")] = 50,
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
    from genrec.catalog.semantic_ids import duplicate_groups

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
            index = build_semantic_index(emb.to(resolve_device(device)), levels, codebook_size,
                                         iters=iters, seed=seed, item_ids=list(ds.item_ids))
            index = index.to("cpu")
        index.save(out)
    except _INPUT_ERRORS as err:
        raise _fail(err) from None
    groups = duplicate_groups(index.codes[:, :-1])
    typer.echo(f"items {index.num_items}  levels {index.num_levels}  codebook sizes "
               f"{index.codebook_sizes}")
    typer.echo(f"collisions resolved: {sum(len(g) for g in groups)} items in {len(groups)} "
               f"groups (last level = dedup counter)  -> {out}")


@train_app.command("generative")
@table_options
def train_generative(
    index: Annotated[Path, typer.Option(help="Semantic index (from `genrec index`).")],
    out: Annotated[Path, typer.Option(help="Output folder (last/, best/, history.json).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    user_vectors: Annotated[str, typer.Option(
        help="Soft token: svd | svd-causal | none | FILE (.npy/.safetensors, one row per "
             "user). svd-causal: each training window's vector holds only the user's items "
             "before its targets.")] = "none",
    user_dim: Annotated[int, typer.Option(min=1, help="SVD user-vector size.")] = 64,
    hidden: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2, head_dim: int = 32,
    intermediate: Annotated[int | None, typer.Option(help="MLP size (default 3 x hidden).")] = None,
    init_from: Annotated[Path | None, typer.Option(
        help="Fine-tune this HF checkpoint instead of training from scratch.")] = None,
    epochs: Annotated[int, typer.Option(min=1)] = 20,
    batch_tokens: Annotated[int, typer.Option(min=1, help="Tokens per step.")] = 4096,
    lr: float = 1e-3, weight_decay: float = 0.01, warmup_ratio: float = 0.05,
    grad_clip: float = 1.0,
    dropout: Annotated[float, typer.Option(min=0.0, max=0.9, help="Dropout on the embeddings "
                                                                   "and residual branches.")] = 0.0,
    patience: Annotated[int, typer.Option(min=0, help="Early-stopping patience (0: off).")] = 5,
    keep_epochs: Annotated[bool, typer.Option(help="Also keep each epoch's weights in "
                                                   "OUT/epochs/NNN (for genrec average).")] = False,
    max_history: Annotated[int, typer.Option(min=1)] = 20,
    val_users: Annotated[int, typer.Option(min=0, help="Validation sample (0: none).")] = 2000,
    beam_width: Annotated[int, typer.Option(min=1)] = 20,
    seed: int = 0, resume: bool = False, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True,
    nproc: NprocOpt = 1, grad_accum: GradAccumOpt = 1, precision: PrecisionOpt = "fp32",
) -> None:
    """Train a Qwen3-architecture generative recommender on Semantic-ID sequences (under
    ``torchrun``, or with ``--nproc N``, data-parallel: each rank its shard of every batch)."""
    import os

    from genrec.training.distributed import main_process, relaunch

    if (code := relaunch(nproc)) is not None:
        raise typer.Exit(code=code)
    import torch

    from genrec.catalog.semantic_ids import SemanticIndex
    from genrec.evaluation.generative import split_examples
    from genrec.generative.vocab import SidVocab
    from genrec.model import load_model
    from genrec.training import generative as gen
    from genrec.training import user_vectors as uv
    from genrec.training.checkpoints import LAST
    from genrec.training.loop import LoopConfig, fit

    dev = resolve_device(device, threads)
    main = main_process()  # under torchrun: rank 0 writes and reports
    if str(dev).startswith("cuda") and "LOCAL_RANK" in os.environ:  # one GPU per rank
        dev = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    args = {k: str(v) if isinstance(v, Path) else v for k, v in locals().items()
            if k in train_generative.__annotations__} | dict(table or {})
    try:
        ds = load_dataset(data, interactions, items, table)
        sem = SemanticIndex.load(index)
        check_index(sem, ds, "--index")
        vocab = SidVocab(sem, max_history=max_history)
        torch.manual_seed(seed)
        last = out / LAST
        factors = None
        if resume and (last / "config.json").is_file():
            model = load_model(last)
            vectors = uv.load_saved_user_vectors(last, ds.user_ids)
            factors = uv.load_item_factors(last)
        else:
            if user_vectors == "svd-causal":  # per-user vectors = fold-in of training items
                train = gen.training_sequences(ds.sequences)
                factors = uv.svd_item_factors(train, ds.num_items, user_dim, seed=seed)
                vectors = uv.fold_in(factors, train)
            else:
                vectors = uv.resolve_user_vectors(user_vectors, ds.sequences, ds.num_items,
                                                  user_dim, seed)
            dim = 0 if vectors is None else int(vectors.shape[1])
            if init_from is not None:
                model = gen.adapt_pretrained(load_model(init_from), vocab.vocab_size, dim)
            else:
                model = gen.build_model(gen.scratch_config(
                    vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, dim))
                gen.init_weights(model)
        model.set_dropout(dropout)
        val = split_examples(ds.sequences, "val", max_history, val_users, seed) \
            if val_users else []
        task = gen.GenerativeTask(
            vocab, gen.training_sequences(ds.sequences), vectors, batch_tokens, seed, val,
            beam_width, user_ids=ds.user_ids, user_vector_source=Path(user_vectors).name,
            progress=progress, item_factors=factors,
        )
        if main:
            write_train_args(out, args, resume)
        n_params = sum(p.numel() for p in model.parameters())
        if main:
            typer.echo(f"{ds.name}: {ds.num_users} users, {ds.num_items} items; "
                       f"{len(task.lengths)} windows, {sum(task.lengths)} tokens/epoch; "
                       f"{n_params / 1e6:.2f}M params on {dev}")
        config = LoopConfig(epochs=epochs, lr=lr, weight_decay=weight_decay,
                            warmup_ratio=warmup_ratio, grad_clip=grad_clip, patience=patience,
                            seed=seed, progress=progress, keep_epochs=keep_epochs,
                            grad_accum=grad_accum, precision=precision)
        result = fit(model.to(dev), task, out, config, resume=resume)
    except _INPUT_ERRORS as err:
        raise _fail(err) from None
    if not main:
        return
    for entry in result.history:
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}
        typer.echo(json.dumps(shown))
    typer.echo(f"epochs {result.epochs_done}; best epoch {result.best_epoch} "
               f"(val ndcg@10 {result.best_metric}); early stop: {result.stopped_early}")


@table_options
def eval_command(
    model: Annotated[Path, typer.Option(help="Checkpoint folder (or a training output folder: "
                                             "its best/ is used).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    split: Annotated[str, typer.Option(help="test | val.")] = "test",
    beam_width: Annotated[int, typer.Option(min=1)] = 20,
    users: Annotated[int | None, typer.Option(min=1, help="Evaluate a fixed random sample of "
                                                          "this many users.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write metrics here.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Requests per beam search.")] = 128,
    seed: int = 0, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True,
    teacher: Annotated[Path | None, typer.Option(help="Ranker models: also evaluate this "
                                                      "DuoLM teacher, side by side.")] = None,
    store: Annotated[Path | None, typer.Option(
        help="Ranker models: item store of the student (default: encode the catalog).")] = None,
    negatives: Annotated[int, typer.Option(min=0, help="Ranker models: sampled negatives per "
                                                       "user (0: the full catalog).")] = 99,
) -> None:
    """Evaluate on the test split. A generative model: Recall/NDCG@5/10 by full-catalog
    constrained beam search. A DuoLM student or teacher: NDCG/Recall@10 and MRR of the held-out
    item among sampled negatives (student and ``--teacher`` side by side)."""
    from genrec.engine import Engine
    from genrec.evaluation.generative import evaluate_split
    from genrec.training.user_vectors import fold_in, load_item_factors, load_saved_user_vectors
    from genrec.utils.atomic import atomic_write_json

    if split not in ("test", "val"):
        raise typer.BadParameter(f"--split must be 'test' or 'val', got {split!r}")
    folder = model / "best" if (model / "best" / "config.json").is_file() else model
    if (folder / "duolm.json").is_file():
        from genrec.commands.ranking_eval import eval_rankers

        return eval_rankers(model, teacher, store, data, interactions, items, table, split, users,
                            negatives, seed, device, threads, progress, json_path)
    try:
        ds = load_dataset(data, interactions, items, table)
        engine = Engine.from_pretrained(folder, device=resolve_device(device, threads))
        if engine.vocab is None:
            raise ValueError(f"--model: {folder} has no Semantic-ID vocabulary")
        check_index(engine.vocab.index, ds, "--model index")
        vectors = None
        if engine.model.config.user_dim:
            factors = load_item_factors(folder)
            if factors is not None:  # svd-causal: every item before the held-out one
                cut = 1 if split == "test" else 2
                vectors = fold_in(factors, [s[:-cut] if len(s) > cut else [] for s in
                                            ds.sequences])
            else:
                vectors = load_saved_user_vectors(folder, ds.user_ids)
            if vectors is None:
                raise ValueError(f"--model: {folder} has a soft-token projector but no saved "
                                 "user vectors")
        metrics = evaluate_split(engine, ds.sequences, split, vectors, beam_width, users, seed,
                                 batch_size, progress)
    except _INPUT_ERRORS as err:
        raise _fail(err) from None
    metrics["wall_seconds"] = metrics.pop("seconds")
    metrics["split"] = split
    keys = ("recall@5", "ndcg@5", "recall@10", "ndcg@10")
    typer.echo(f"{ds.name} {split}: {metrics['n_users']} users, beam {beam_width}, "
               f"{metrics['wall_seconds']:.1f} s")
    typer.echo("  ".join(f"{k:>9}" for k in keys))
    typer.echo("  ".join(f"{metrics[k]:>9.4f}" for k in keys))
    if json_path is not None:
        atomic_write_json(json_path, metrics)
