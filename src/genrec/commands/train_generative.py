"""The command that trains generative retrieval: ``train generative`` (``genrec index`` is in
:mod:`genrec.commands.index`, ``genrec eval`` in :mod:`genrec.commands.eval_generative`).

Register in ``genrec.cli`` with one line::

    app.add_typer(train_app, name="train")  # from genrec.commands.common

Heavy modules are imported inside the functions so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

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
)
from genrec.commands.dataset import (
    DataOpt,
    InterOpt,
    ItemsOpt,
    TableOpt,
    load_dataset,
    table_options,
)

RecipeInt = Annotated[int | None, typer.Option(min=1, help="Default: from the data size "
                                                          "(see genrec.training.recipe).")]


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
    item_inputs: Annotated[bool | None, typer.Option(
        help="The item head's embeddings also added to each item's input (at the item's last "
             "Semantic-ID token), tied as in SASRec. Default: on with the item head.")
    ] = None,
    item_compose: Annotated[bool, typer.Option(
        help="The item head scores each item with its own embedding plus the sum of its "
             "Semantic-ID tokens' embeddings (items sharing ID prefixes share strength; needs "
             "--item-inputs).")] = False,
    item_dim: Annotated[int, typer.Option(
        min=0, help="The size of each item's row in the item head, projected to the hidden size "
                    "by one shared matrix (SASRec-sized item embeddings under a wider model; "
                    "0: the hidden size).")] = 0,
    history_bias: Annotated[bool | None, typer.Option(
        help="The item head learns one bias for the items already in the user's history (at "
             "serving: the request's history), so a model learns from the data whether users "
             "take an item again. Default: on with the item head.")] = None,
    item_input_dropout: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="In training, the share of history items whose item-head "
                               "embedding is left out of the input (they enter by their "
                               "Semantic IDs alone, as new items do).")] = 0.0,
    mask_history: Annotated[bool, typer.Option(
        help="Train the item head for serving that never recommends an item the user already "
             "has (genrec eval --mask-history, RecommendRequest.exclude): validation masks the "
             "user's earlier items, and the head's softmax leaves them out (with "
             "--no-history-bias; with the bias they stay in it, pushed down by it).")] = False,
    item_loss_weight: Annotated[float, typer.Option(
        min=0.0, help="The item head's cross-entropy's weight in the loss, beside the "
                      "Semantic IDs' (1: equal).")] = 1.0,
    teacher: Annotated[list[Path] | None, typer.Option(
        help="Distil the item head from this trained model over the same index (e.g. a run's "
             "OUT/model; repeat the flag for several, whose probabilities are averaged): its "
             "loss mixes cross-entropy with KL(teacher || student) over all items.")] = None,
    distill: Annotated[bool, typer.Option(
        help="The distilled recipe in one command: first train two teachers from these "
             "options (the defaults, and --mask-history --no-history-bias --item-loss-weight "
             "0.5; in OUT/teachers/), then this model distilled from both. About 4.4x the "
             "training time of one run; serving costs the same. With --resume finished "
             "teachers are reused. One process only (not with --nproc).")] = False,
    distill_weight: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="With --teacher or --distill: the distillation's share of the "
                               "item head's loss (the rest: cross-entropy on the labels).")] = 0.8,
    sid_distill_weight: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="With --teacher or --distill: the distillation's share of the "
                               "Semantic-ID tokens' loss, KL to the teachers' next-token "
                               "distribution (0: the labels only).")] = 0.0,
    distill_temperature: Annotated[float, typer.Option(
        min=0.01, help="With --teacher or --distill: the item head's distillation temperature "
                       "T (both distributions at T, the KL scaled by T^2; below 1 weighs the "
                       "teachers' top items, above 1 their tail).")] = 1.0,
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
    average: Annotated[int, typer.Option(
        min=0, help="The final model (OUT/model): the best validation epoch or the mean of the "
                    "weights of epochs best-k..best+k for k up to this, whichever validates "
                    "best (0: the best epoch).")] = 3,
    choose_item_weight: Annotated[bool, typer.Option(
        help="With the item head: validate the final model ranked with the item weights 1, 2, "
             "3, 5, 10 and 20 and save the best with it (eval, serve and recommend rank with "
             "it unless given --item-weight).")] = True,
    max_history: Annotated[int, typer.Option(min=1)] = 20,
    val_users: Annotated[int, typer.Option(min=0, help="Validation sample (0: none).")] = 2000,
    final_val_users: Annotated[int, typer.Option(
        min=0, help="The larger validation sample the final model and its item weight are "
                    "chosen on (at most every user; not above --val-users: the same sample).")
    ] = 10_000,
    beam_width: Annotated[int, typer.Option(min=1)] = 20,
    seed: int = 0, resume: bool = False, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True,
    nproc: NprocOpt = 1, grad_accum: GradAccumOpt = 1, precision: PrecisionOpt = "fp32",
    fsdp: FsdpOpt = False,
) -> None:
    """Train a Qwen3-architecture generative recommender on Semantic-ID sequences (under
    ``torchrun``, or with ``--nproc N``, data-parallel: each rank its shard of every batch)."""
    from genrec.training.distilled_run import ONE_PROCESS, train_distilled
    from genrec.training.distributed import relaunch

    if distill and nproc > 1:  # refused before torchrun starts the ranks
        raise fail(ONE_PROCESS)
    if (code := relaunch(nproc)) is not None:
        raise typer.Exit(code=code)
    from genrec.training.generative_run import GenerativeTrainConfig, train_generative

    config = GenerativeTrainConfig.from_options(locals())
    run = train_distilled if config.distill else train_generative
    try:
        ds = load_dataset(data, interactions, items, table)
        result = run(config, ds, echo=typer.echo)
    except INPUT_ERRORS as err:
        raise fail(err) from None
    if result is None:  # not rank 0
        return
    for entry in result.history:
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}
        typer.echo(json.dumps(shown))
    typer.echo(f"epochs {result.epochs_done}; best epoch {result.best_epoch} "
               f"(val ndcg@10 {result.best_metric}); early stop: {result.stopped_early}")
    if result.final is not None:
        shown = "; ".join(f"{c['model']} {c['ndcg@10']}" for c in result.final["candidates"])
        typer.echo(f"final model {config.out}/model: {result.final['chosen']} (val ndcg@10: "
                   f"{shown})")
        if "item_weight" in result.final:
            shown = "; ".join(f"{w} {v:.4f}" for w, v in result.final["item_weights"].items())
            typer.echo(f"item weight {result.final['item_weight']} (val ndcg@10 by weight: "
                       f"{shown})")
