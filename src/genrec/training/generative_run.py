"""A generative-retrieval training run from one :class:`GenerativeTrainConfig`.

``genrec train generative`` fills the config from its flags (one field per flag, same names and
defaults) and calls :func:`train_generative`; Python code can call it directly::

    from genrec.training.generative_run import GenerativeTrainConfig, train_generative
    train_generative(GenerativeTrainConfig(index=..., out=..., data=...))

A new option is a field here and a flag of the command of the same name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from genrec.catalog.semantic_ids import SemanticIndex
from genrec.data.dataset import Dataset
from genrec.training.generative_loss import DISTILL_TEMPERATURE, DISTILL_WEIGHT
from genrec.training.loop import FitResult

RECIPE_KEYS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "dropout", "epochs")


@dataclass
class GenerativeTrainConfig:
    """Everything a run reads (see ``genrec train generative --help`` for each option).

    The data: exactly one of ``data`` (a JSON dataset folder) and ``interactions`` (a table,
    with ``items`` and the ``table`` column arguments). Model sizes, ``dropout`` and
    ``epochs`` left None come from the data size's recipe (:func:`pick_recipe`);
    ``item_head`` None: on when training from scratch; ``item_inputs`` None: on with the item
    head; ``history_bias`` None: on with the item head."""

    index: Path
    out: Path
    data: Path | None = None
    interactions: Path | None = None
    items: Path | None = None
    table: dict[str, Any] | None = None
    user_vectors: str = "none"
    user_dim: int = 64
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None
    init_from: Path | None = None
    extend_vocab: bool = False
    sid_init: str = "mean"
    prompt_text: str | None = None
    item_head: bool | None = None
    item_inputs: bool | None = None
    item_compose: bool = False
    item_dim: int = 0
    item_input_dropout: float = 0.0
    history_bias: bool | None = None
    mask_history: bool = False
    item_loss_weight: float = 1.0
    teacher: list[Path] | None = None
    distill: bool = False
    distill_weight: float = DISTILL_WEIGHT
    sid_distill_weight: float = 0.0
    distill_temperature: float = DISTILL_TEMPERATURE
    epochs: int | None = None
    batch_tokens: int = 4096
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    grad_clip: float = 1.0
    dropout: float | None = None
    patience: int = 5
    keep_epochs: bool = False
    average: int = 3
    choose_item_weight: bool = True
    max_history: int = 20
    val_users: int = 2000
    final_val_users: int = 10_000
    beam_width: int = 20
    seed: int = 0
    resume: bool = False
    device: str = "auto"
    threads: int | None = None
    progress: bool = True
    nproc: int = 1
    grad_accum: int = 1
    precision: str = "fp32"
    fsdp: bool = False

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> GenerativeTrainConfig:
        """The config of the entries of ``options`` named like fields (others ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names})

    def record(self) -> dict[str, Any]:
        """The options as recorded in ``train_args.json``: paths as strings, the ``table``
        arguments inlined."""
        options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()
                   if k != "table"}
        if self.teacher is not None:
            options["teacher"] = [str(p) for p in self.teacher]
        return options | dict(self.table or {})


def pick_recipe(train_sequences: list[list[int]], given: dict, report: bool,
                echo: Callable[[str], None] = print) -> dict:
    """The model size, dropout and epochs: each of ``given`` (:data:`RECIPE_KEYS` -> value or
    None) as given, else the data size's recipe (:func:`genrec.training.recipe.recipe_for` of
    the training interactions); says which through ``echo`` when ``report``."""
    from genrec.training.recipe import recipe_for

    recipe = recipe_for(sum(len(s) for s in train_sequences))
    picked = {k: getattr(recipe, k) if given[k] is None else given[k] for k in RECIPE_KEYS}
    if any(given[k] is None for k in RECIPE_KEYS) and report:
        echo(f"recipe: {recipe.describe()}; used: " + ", ".join(
            f"{k} {v}" for k, v in picked.items()))
    return picked


def check_index(index: SemanticIndex, dataset: Dataset, where: str) -> None:
    """Raise ValueError naming ``where`` when the index does not cover the dataset's items."""
    if index.num_items != dataset.num_items:
        raise ValueError(f"{where}: {index.num_items} items, the dataset has {dataset.num_items}")
    if index.item_ids is not None and list(index.item_ids) != list(dataset.item_ids):
        raise ValueError(f"{where}: item ids differ from the dataset's (built for another one?)")


def load_config_dataset(config: GenerativeTrainConfig) -> Dataset:
    """The dataset ``config`` names (exactly one of ``data`` and ``interactions``)."""
    from genrec.data import load_json_dataset, load_table_dataset

    if (config.data is None) == (config.interactions is None):
        raise ValueError("give exactly one of data (a folder) or interactions (a file)")
    if config.data is not None:
        return load_json_dataset(config.data)
    return load_table_dataset(config.interactions, config.items, **(config.table or {}))


def train_generative(
    config: GenerativeTrainConfig, dataset: Dataset | None = None,
    echo: Callable[[str], None] = print,
) -> FitResult | None:
    """Train a generative recommender as ``config`` says (on ``dataset`` when given, else the
    one it names); reports through ``echo``. Under ``torchrun`` every rank calls it, rank 0
    writes and reports; returns the fit's result on rank 0, None on the others. Bad options
    raise ValueError."""
    from genrec.data.split import training_sequences
    from genrec.evaluation.full_catalog import full_histories, split_examples
    from genrec.model import load_model
    from genrec.model.registry import build_model
    from genrec.training import extend_vocab as ext
    from genrec.training import generative_task as gen
    from genrec.training import user_vectors as uv
    from genrec.training.checkpoints import LAST, write_train_args
    from genrec.training.distributed import main_process
    from genrec.training.generative_loss import ItemTeacher
    from genrec.training.initialization import init_weights
    from genrec.training.loop import LoopConfig, fit
    from genrec.utils.device import resolve_device
    from genrec.vocab.sid_vocab import SidVocab

    c = config
    dev = resolve_device(c.device, c.threads)
    main = main_process()  # under torchrun: rank 0 writes and reports
    if str(dev).startswith("cuda") and "LOCAL_RANK" in os.environ:  # one GPU per rank
        dev = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    args = c.record()
    ds = load_config_dataset(c) if dataset is None else dataset
    sem = SemanticIndex.load(c.index)
    check_index(sem, ds, "--index")
    vocab = SidVocab(sem, max_history=c.max_history)
    if (c.extend_vocab and c.init_from is None) or (c.prompt_text and not c.extend_vocab):
        raise ValueError("--extend-vocab needs --init-from; --prompt-text needs --extend-vocab")
    if c.item_head and c.init_from is not None:
        raise ValueError("--item-head: models trained from scratch only (not --init-from)")
    item_head = c.init_from is None if c.item_head is None else c.item_head
    args["item_head"] = item_head
    if c.item_inputs and not item_head:
        raise ValueError("--item-inputs needs the item head (--item-head)")
    item_inputs = item_head if c.item_inputs is None else c.item_inputs
    if c.mask_history and not item_head:
        raise ValueError("--mask-history trains the item head: it needs --item-head")
    args["item_inputs"] = item_inputs
    if c.item_dim and not item_head:
        raise ValueError("--item-dim sizes the item head's rows: it needs --item-head")
    if c.item_compose and not item_inputs:
        raise ValueError("--item-compose needs the item inputs (--item-inputs)")
    if c.history_bias and not item_head:
        raise ValueError("--history-bias needs the item head (--item-head)")
    history_bias = item_head if c.history_bias is None else c.history_bias
    args["history_bias"] = history_bias
    if c.item_input_dropout and not item_inputs:
        raise ValueError("--item-input-dropout needs the item inputs (--item-inputs)")
    if c.distill and not c.teacher:
        raise ValueError("--distill trains its teachers first: run it through "
                         "genrec.training.distilled_run.train_distilled")
    if c.teacher and not item_head:
        raise ValueError("--teacher distils the item head: it needs --item-head")
    if c.sid_distill_weight and not c.teacher:
        raise ValueError("--sid-distill-weight distils from the teachers: give --teacher")
    if c.distill_temperature != DISTILL_TEMPERATURE and not c.teacher:
        raise ValueError("--distill-temperature distils from the teachers: give --teacher")
    train = training_sequences(ds.sequences)
    recipe = pick_recipe(train, {k: getattr(c, k) for k in RECIPE_KEYS}, main, echo)
    args |= recipe
    torch.manual_seed(c.seed)
    last = c.out / LAST
    factors, files, source = None, None, Path(c.user_vectors).name
    if c.resume and (last / "config.json").is_file():
        model = load_model(last)
        if c.extend_vocab:  # the layout and tokenizer saved with the run
            vocab, files = SidVocab.load(last), ext.tokenizer_files(last)
        vectors = uv.load_saved_user_vectors(last, ds.user_ids)
        factors = uv.load_item_factors(last)
        source = uv.saved_source(last) or source  # the run's, whatever the flag says now
    else:
        if c.user_vectors == "svd-causal":  # per-user vectors = fold-in of training items
            factors = uv.svd_item_factors(train, ds.num_items, c.user_dim, seed=c.seed)
            vectors = uv.fold_in(factors, train)
        else:
            vectors = uv.resolve_user_vectors(c.user_vectors, ds.sequences, ds.num_items,
                                              c.user_dim, c.seed)
        dim = 0 if vectors is None else int(vectors.shape[1])
        if c.extend_vocab:
            model, vocab, files = ext.start_extended(c.init_from, sem, c.max_history, dim,
                                                     c.prompt_text, c.sid_init, ds.item_text,
                                                     c.seed)
        elif c.init_from is not None:
            model = ext.adapt_pretrained(load_model(c.init_from), vocab.vocab_size, dim)
        else:
            model = build_model(gen.scratch_config(
                vocab, recipe["hidden"], recipe["layers"], recipe["heads"], recipe["kv_heads"],
                recipe["head_dim"], c.intermediate, dim, item_head, item_inputs,
                c.item_compose, history_bias, c.item_dim))
            init_weights(model)
            gen.set_item_tokens(model, vocab)
    model.set_dropout(recipe["dropout"])
    teacher = None
    if c.teacher:
        teacher = ItemTeacher.load(c.teacher, c.distill_weight, dev, c.sid_distill_weight,
                                   c.distill_temperature)
        teacher.check(model)
    if model.item_head is not None:
        model.item_head.input_dropout = c.item_input_dropout
    val = split_examples(ds.sequences, "val", None, c.val_users, c.seed) \
        if c.val_users else []
    final = split_examples(ds.sequences, "val", None, c.final_val_users, c.seed) \
        if c.val_users and c.final_val_users > c.val_users else []
    final = final if len(final) > len(val) else None  # else the same sample
    task = gen.GenerativeTask(
        vocab, train, vectors, c.batch_tokens, c.seed, val,
        c.beam_width, user_ids=ds.user_ids, user_vector_source=source,
        progress=c.progress, item_factors=factors, extra_files=files,
        mask_history=c.mask_history, val_exclude=full_histories(ds.sequences, val, "val"),
        item_loss_weight=c.item_loss_weight,
        item_weights=gen.ITEM_WEIGHTS if c.choose_item_weight else (),
        final_examples=final,
        final_exclude=None if final is None else full_histories(ds.sequences, final, "val"),
        history_bias=bool(model.item_head is not None and model.item_head.history_bias is not None),
        teacher=teacher,
    )
    if main:
        write_train_args(c.out, args, c.resume)
        n_params = sum(p.numel() for p in model.parameters())
        echo(f"{ds.name}: {ds.num_users} users, {ds.num_items} items; "
             f"{len(task.lengths)} windows, {sum(task.lengths)} tokens/epoch; "
             f"{n_params / 1e6:.2f}M params on {dev}")
    loop = LoopConfig(epochs=recipe["epochs"], lr=c.lr, weight_decay=c.weight_decay,
                      warmup_ratio=c.warmup_ratio, grad_clip=c.grad_clip, patience=c.patience,
                      seed=c.seed, progress=c.progress, keep_epochs=c.keep_epochs,
                      average=c.average,
                      grad_accum=c.grad_accum, precision=c.precision,
                      sharding="fsdp" if c.fsdp else "none")
    result = fit(model.to(dev), task, c.out, loop, resume=c.resume)
    return result if main else None
