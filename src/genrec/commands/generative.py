"""The command that trains generative retrieval: ``train generative`` (``genrec index`` is in
:mod:`genrec.commands.index`, ``genrec eval`` in :mod:`genrec.commands.evaluate`).

Register in ``genrec.cli`` with one line::

    app.add_typer(train_app, name="train")  # from genrec.commands.common

Heavy modules are imported inside the functions so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from genrec.commands.common import (
    INPUT_ERRORS,
    DeviceOpt,
    FsdpOpt,
    GradAccumOpt,
    NprocOpt,
    PrecisionOpt,
    ThreadsOpt,
    fail,
    train_app,
    write_train_args,
)
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

RecipeInt = Annotated[int | None, typer.Option(min=1, help="Default: from the data size "
                                                          "(see genrec.training.recipe).")]
RECIPE_KEYS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "dropout", "epochs")


def pick_recipe(train_sequences: list[list[int]], given: dict, report: bool) -> dict:
    """The model size, dropout and epochs: each of ``given`` (:data:`RECIPE_KEYS` -> value or
    None) as given, else the data size's recipe (:func:`genrec.training.recipe.recipe_for` of
    the training interactions); says which when ``report``."""
    from genrec.training.recipe import recipe_for

    recipe = recipe_for(sum(len(s) for s in train_sequences))
    picked = {k: getattr(recipe, k) if given[k] is None else given[k] for k in RECIPE_KEYS}
    if any(given[k] is None for k in RECIPE_KEYS) and report:
        typer.echo(f"recipe: {recipe.describe()}; used: " + ", ".join(
            f"{k} {v}" for k, v in picked.items()))
    return picked


def check_index(index: SemanticIndex, dataset: Dataset, where: str) -> None:
    """Raise ValueError naming ``where`` when the index does not cover the dataset's items."""
    if index.num_items != dataset.num_items:
        raise ValueError(f"{where}: {index.num_items} items, the dataset has {dataset.num_items}")
    if index.item_ids is not None and list(index.item_ids) != list(dataset.item_ids):
        raise ValueError(f"{where}: item ids differ from the dataset's (built for another one?)")


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
    hidden: RecipeInt = None, layers: RecipeInt = None, heads: RecipeInt = None,
    kv_heads: RecipeInt = None, head_dim: RecipeInt = None,
    intermediate: Annotated[int | None, typer.Option(help="MLP size (default 3 x hidden).")] = None,
    init_from: Annotated[Path | None, typer.Option(
        help="Fine-tune this HF checkpoint instead of training from scratch.")] = None,
    extend_vocab: Annotated[bool, typer.Option(
        help="With --init-from: keep its text vocabulary and tokenizer, append the Semantic-ID "
             "tokens (each level normalised over its own codes).")] = False,
    sid_init: Annotated[str, typer.Option(help="--extend-vocab: new rows from the 'mean' text "
                                               "row or the items' title 'text'.")] = "mean",
    prompt_text: Annotated[str | None, typer.Option(
        help="--extend-vocab: text before every prompt's Semantic IDs (train, eval, serve).")
    ] = None,
    item_head: Annotated[bool | None, typer.Option(
        help="A dense item head beside the Semantic IDs (one embedding per item, trained "
             "jointly by cross-entropy over all items; with the beam's proposals it proposes "
             "and ranks items). Default: on when training from scratch, off with --init-from.")
    ] = None,
    item_inputs: Annotated[bool, typer.Option(
        help="With the item head: its item embeddings also added to each item's input "
             "(at the item's last Semantic-ID token), tied as in SASRec.")] = False,
    epochs: RecipeInt = None,
    batch_tokens: Annotated[int, typer.Option(min=1, help="Tokens per step.")] = 4096,
    lr: float = 1e-3, weight_decay: float = 0.01, warmup_ratio: float = 0.05,
    grad_clip: float = 1.0,
    dropout: Annotated[float | None, typer.Option(
        min=0.0, max=0.9, help="Dropout on the embeddings and residual branches (default: "
                               "from the data size).")] = None,
    patience: Annotated[int, typer.Option(min=0, help="Early-stopping patience (0: off).")] = 5,
    keep_epochs: Annotated[bool, typer.Option(help="Also keep each epoch's weights in "
                                                   "OUT/epochs/NNN (for genrec average).")] = False,
    max_history: Annotated[int, typer.Option(min=1)] = 20,
    val_users: Annotated[int, typer.Option(min=0, help="Validation sample (0: none).")] = 2000,
    beam_width: Annotated[int, typer.Option(min=1)] = 20,
    seed: int = 0, resume: bool = False, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True,
    nproc: NprocOpt = 1, grad_accum: GradAccumOpt = 1, precision: PrecisionOpt = "fp32",
    fsdp: FsdpOpt = False,
) -> None:
    """Train a Qwen3-architecture generative recommender on Semantic-ID sequences (under
    ``torchrun``, or with ``--nproc N``, data-parallel: each rank its shard of every batch)."""
    import os

    from genrec.training.distributed import main_process, relaunch

    if (code := relaunch(nproc)) is not None:
        raise typer.Exit(code=code)
    import torch

    from genrec.catalog.semantic_ids import SemanticIndex
    from genrec.data.split import training_sequences
    from genrec.evaluation.generative import split_examples
    from genrec.generative.vocab import SidVocab
    from genrec.model import load_model
    from genrec.model.registry import build_model
    from genrec.training import extend_vocab as ext
    from genrec.training import generative as gen
    from genrec.training import user_vectors as uv
    from genrec.training.checkpoints import LAST
    from genrec.training.initialization import init_weights
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
        if (extend_vocab and init_from is None) or (prompt_text and not extend_vocab):
            raise ValueError("--extend-vocab needs --init-from; --prompt-text needs --extend-vocab")
        if item_head and init_from is not None:
            raise ValueError("--item-head: models trained from scratch only (not --init-from)")
        item_head = init_from is None if item_head is None else item_head
        args["item_head"] = item_head
        if item_inputs and not item_head:
            raise ValueError("--item-inputs needs the item head (--item-head)")
        train = training_sequences(ds.sequences)
        given = dict(zip(RECIPE_KEYS, (hidden, layers, heads, kv_heads, head_dim, dropout,
                                       epochs), strict=True))
        recipe = pick_recipe(train, given, main)
        hidden, layers, heads, kv_heads, head_dim, dropout, epochs = (
            recipe[k] for k in RECIPE_KEYS)
        args |= recipe
        torch.manual_seed(seed)
        last = out / LAST
        factors, files = None, None
        if resume and (last / "config.json").is_file():
            model = load_model(last)
            if extend_vocab:  # the layout and tokenizer saved with the run
                vocab, files = SidVocab.load(last), ext.tokenizer_files(last)
            vectors = uv.load_saved_user_vectors(last, ds.user_ids)
            factors = uv.load_item_factors(last)
        else:
            if user_vectors == "svd-causal":  # per-user vectors = fold-in of training items
                factors = uv.svd_item_factors(train, ds.num_items, user_dim, seed=seed)
                vectors = uv.fold_in(factors, train)
            else:
                vectors = uv.resolve_user_vectors(user_vectors, ds.sequences, ds.num_items,
                                                  user_dim, seed)
            dim = 0 if vectors is None else int(vectors.shape[1])
            if extend_vocab:
                model, vocab, files = ext.start_extended(init_from, sem, max_history, dim,
                                                         prompt_text, sid_init, ds.item_text, seed)
            elif init_from is not None:
                model = ext.adapt_pretrained(load_model(init_from), vocab.vocab_size, dim)
            else:
                model = build_model(gen.scratch_config(
                    vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, dim,
                    item_head, item_inputs))
                init_weights(model)
                gen.set_item_tokens(model, vocab)
        model.set_dropout(dropout)
        val = split_examples(ds.sequences, "val", max_history, val_users, seed) \
            if val_users else []
        task = gen.GenerativeTask(
            vocab, train, vectors, batch_tokens, seed, val,
            beam_width, user_ids=ds.user_ids, user_vector_source=Path(user_vectors).name,
            progress=progress, item_factors=factors, extra_files=files,
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
                            grad_accum=grad_accum, precision=precision,
                            sharding="fsdp" if fsdp else "none")
        result = fit(model.to(dev), task, out, config, resume=resume)
    except INPUT_ERRORS as err:
        raise fail(err) from None
    if not main:
        return
    for entry in result.history:
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}
        typer.echo(json.dumps(shown))
    typer.echo(f"epochs {result.epochs_done}; best epoch {result.best_epoch} "
               f"(val ndcg@10 {result.best_metric}); early stop: {result.stopped_early}")
