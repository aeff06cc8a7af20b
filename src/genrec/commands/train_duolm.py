"""Commands of the DuoLM ranker: ``train teacher``, ``train duolm`` and ``encode-catalog``
(the ranking side of ``eval`` is in :mod:`genrec.commands.eval_ranker`).

Registered in ``genrec.cli``; heavy modules are imported inside the functions.
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
from genrec.commands.duolm_data import (
    FEATURES_FILE,
    catalog_features,
    dataset_item_text,
    eval_split,
)
from genrec.training.run_layout import model_folder
from genrec.utils.device import resolve_device


def _train(task, model, out: Path, epochs: int, lr: float, patience: int, seed: int,  # noqa: ANN001
           resume: bool, progress: bool, dev: str, args: dict) -> None:
    from genrec.training.checkpoints import write_train_args
    from genrec.training.distributed import main_process
    from genrec.training.loop import LoopConfig, fit

    main = main_process()  # under torchrun: rank 0 writes and reports
    if main:
        write_train_args(out, args, resume)
        n_params = sum(p.numel() for p in model.parameters())
        typer.echo(f"{len(task.examples)} training examples, {task.num_batches(0)} "
                   f"steps/epoch; {n_params / 1e6:.2f}M parameters on {dev}")
    cfg = LoopConfig(epochs=epochs, lr=lr, patience=patience, seed=seed, progress=progress,
                     grad_accum=args.get("grad_accum", 1), precision=args.get("precision", "fp32"),
                     sharding="fsdp" if args.get("fsdp") else "none")
    result = fit(model.to(dev), task, out, cfg, resume=resume)
    if not main:
        return
    for entry in result.history:
        typer.echo(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                               for k, v in entry.items()}))
    typer.echo(f"epochs {result.epochs_done}; best epoch {result.best_epoch} "
               f"(val ndcg@10 {result.best_metric}); early stop: {result.stopped_early}")


Hidden = Annotated[int, typer.Option(min=8)]


@train_app.command("teacher")
@table_options
def train_teacher(
    out: Annotated[Path, typer.Option(help="Output folder (last/, best/, history.json).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    backend: Annotated[str, typer.Option(
        help="decoder: a Qwen3-architecture ranker (--hidden ... --kv-heads); minilm: a "
             "cross-encoder started from the bundled all-MiniLM-L6-v2.")] = "decoder",
    hidden: Hidden = 128, layers: int = 2, heads: int = 4, kv_heads: int = 2,
    max_title_tokens: int = 24, max_text_tokens: int = 128,
    max_history: Annotated[int, typer.Option(min=1)] = 20,
    negatives: Annotated[int, typer.Option(min=1, help="Sampled negatives per example.")] = 15,
    users_per_step: Annotated[int, typer.Option(min=1)] = 16,
    max_examples: Annotated[int, typer.Option(min=0, help="Train on a fixed random sample of "
                                                          "this many examples (0: all).")] = 0,
    epochs: Annotated[int, typer.Option(min=1)] = 3, lr: float = 1e-3,
    patience: Annotated[int, typer.Option(min=0)] = 2,
    val_users: Annotated[int, typer.Option(min=0)] = 500,
    val_negatives: Annotated[int, typer.Option(min=1, help="Sampled negatives per validation "
                                                           "user.")] = 99,
    init_embeddings: Annotated[bool, typer.Option(
        help="Start token embeddings from all-MiniLM-L6-v2's (PCA to the hidden size).")] = True,
    seed: int = 0, resume: bool = False, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True, nproc: NprocOpt = 1, grad_accum: GradAccumOpt = 1,
    precision: PrecisionOpt = "fp32", fsdp: FsdpOpt = False,
) -> None:
    """Train the full-text teacher ranker (history titles, candidate full text): a decoder
    or (``--backend minilm``) a MiniLM cross-encoder; with ``--nproc N`` (or under
    ``torchrun``) data-parallel."""
    from genrec.training.distributed import relaunch

    if (code := relaunch(nproc)) is not None:
        raise typer.Exit(code=code)
    import torch

    from genrec.duolm.cross_encoder import BACKEND, CrossEncoder
    from genrec.duolm.prompts import TeacherPrompts
    from genrec.model import load_model
    from genrec.model.registry import build_model
    from genrec.training.checkpoints import LAST
    from genrec.training.duolm_task import RankingTask, init_text_embeddings, ranker_config
    from genrec.training.initialization import init_weights

    dev = resolve_device(device, threads)
    args = {k: str(v) if isinstance(v, Path) else v for k, v in locals().items()
            if k in train_teacher.__annotations__} | dict(table or {})
    try:
        if backend not in ("decoder", BACKEND):
            raise ValueError(f"backend must be decoder or {BACKEND}, got {backend!r}")
        ds = load_dataset(data, interactions, items, table)
        prompts = TeacherPrompts.from_items(dataset_item_text(ds), ds.num_items, None,
                                            max_title_tokens, max_text_tokens, max_history)
        sp, val, val_cands = eval_split(ds, max_history, val_users, val_negatives, seed)
        train = _sample(sp.train, max_examples, seed)
        torch.manual_seed(seed)  # the same initial weights for the same seed
        if backend == BACKEND:
            model = CrossEncoder.from_sentence_encoder()  # --resume: the loop loads last/
        elif resume and (out / LAST / "config.json").is_file():
            model = load_model(out / LAST)
        else:
            positions = 2 + max_history * (max_title_tokens + 1) + max_text_tokens + 1
            model = build_model(ranker_config(prompts.vocab_size, hidden, layers, heads,
                                               kv_heads, positions))
            init_weights(model)
            if init_embeddings:
                init_text_embeddings(model)
        meta = {"kind": "teacher", "backend": backend, "max_history": max_history,
                "max_title_tokens": max_title_tokens, "max_text_tokens": max_text_tokens,
                "tokenizer": "all-MiniLM-L6-v2 WordPiece"}
        task = RankingTask(prompts, train, ds.num_items, meta, negatives=negatives,
                           users_per_step=users_per_step, seed=seed, val_examples=val,
                           val_candidates=val_cands, progress=progress)
        _train(task, model, out, epochs, lr, patience, seed, resume, progress, dev, args)
    except INPUT_ERRORS as err:
        raise fail(err) from None


def _sample(examples: list, n: int, seed: int) -> list:
    from genrec.evaluation.full_catalog import sample_examples

    return sample_examples(examples, n, seed) if n else examples


@train_app.command("duolm")
@table_options
def train_duolm(
    out: Annotated[Path, typer.Option(help="Output folder (last/, best/, history.json).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    teacher: Annotated[Path | None, typer.Option(help="Teacher checkpoint to distil from "
                                                      "(a training folder: its best/).")] = None,
    distill_weight: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.5,
    temperature: Annotated[float, typer.Option(min=0.01)] = 1.0,
    backend: Annotated[str, typer.Option(help="Item encoder: minilm | decoder.")] = "minilm",
    k: Annotated[int, typer.Option(min=1, help="Vectors per item.")] = 2,
    max_text_tokens: int = 128,
    hidden: Hidden = 128, layers: int = 2, heads: int = 4, kv_heads: int = 2,
    user_vectors: Annotated[str, typer.Option(
        help="Soft token: svd | none | FILE (.npy/.safetensors, one row per user).")] = "none",
    user_dim: Annotated[int, typer.Option(min=1, help="SVD user-vector size.")] = 64,
    max_history: Annotated[int, typer.Option(min=1)] = 20,
    negatives: Annotated[int, typer.Option(min=1)] = 15,
    users_per_step: Annotated[int, typer.Option(min=1)] = 32,
    max_examples: Annotated[int, typer.Option(min=0)] = 0,
    epochs: Annotated[int, typer.Option(min=1)] = 5, lr: float = 1e-3,
    patience: Annotated[int, typer.Option(min=0)] = 2,
    val_users: Annotated[int, typer.Option(min=0)] = 500,
    val_negatives: Annotated[int, typer.Option(min=1, help="Sampled negatives per validation "
                                                           "user.")] = 99,
    seed: int = 0, resume: bool = False, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True, nproc: NprocOpt = 1, grad_accum: GradAccumOpt = 1,
    precision: PrecisionOpt = "fp32", fsdp: FsdpOpt = False,
) -> None:
    """Train the DuoLM student: item encoder + virtual-token ranker, end to end, on next-item
    labels plus distillation from the teacher's scores; with ``--nproc N`` (or under
    ``torchrun``) data-parallel."""
    from genrec.training.distributed import relaunch

    if (code := relaunch(nproc)) is not None:
        raise typer.Exit(code=code)
    import dataclasses

    import torch

    from genrec.duolm.cross_encoder import load_teacher
    from genrec.duolm.encoder import EncoderConfig, ItemEncoder
    from genrec.duolm.prompts import STUDENT_VOCAB_SIZE, StudentPrompts
    from genrec.model.registry import build_model
    from genrec.training.duolm_task import DuoModel, RankingTask, ranker_config
    from genrec.training.initialization import init_weights
    from genrec.training.user_vectors import resolve_user_vectors

    dev = resolve_device(device, threads)
    args = {k_: str(v) if isinstance(v, Path) else v for k_, v in locals().items()
            if k_ in train_duolm.__annotations__} | dict(table or {})
    try:
        ds = load_dataset(data, interactions, items, table)
        torch.manual_seed(seed)
        enc_cfg = EncoderConfig(backend=backend, k=k, hidden_size=hidden,
                                max_text_tokens=max_text_tokens)
        out.mkdir(parents=True, exist_ok=True)
        features = catalog_features(enc_cfg, ds, out / FEATURES_FILE, progress)
        sp, val, val_cands = eval_split(ds, max_history, val_users, val_negatives, seed)
        # SVD vectors use each user's training part only (see compute_user_vectors)
        vectors = resolve_user_vectors(user_vectors, ds.sequences, ds.num_items, user_dim, seed)
        cfg = ranker_config(STUDENT_VOCAB_SIZE, hidden, layers, heads, kv_heads,
                            4 + max_history * (k + 1) + k)
        if vectors is not None:
            cfg = dataclasses.replace(cfg, user_dim=int(vectors.shape[1]))
        ranker = build_model(cfg)
        init_weights(ranker)
        model = DuoModel(ranker, ItemEncoder(enc_cfg))
        teacher_ranker = None
        if teacher is not None:
            teacher_ranker = load_teacher(model_folder(teacher), dataset_item_text(ds),
                                          ds.num_items, device=dev)
        meta = {"kind": "student", "max_history": max_history, "k": k, "backend": backend,
                "teacher": str(teacher) if teacher else None, "distill_weight": distill_weight,
                "user_vectors": Path(user_vectors).name}
        task = RankingTask(StudentPrompts(k, STUDENT_VOCAB_SIZE, max_history),
                           _sample(sp.train, max_examples, seed), ds.num_items, meta, features,
                           negatives, users_per_step, seed, val, val_cands, teacher_ranker,
                           distill_weight if teacher_ranker else 0.0, temperature, progress,
                           vectors, ds.user_ids)
        _train(task, model, out, epochs, lr, patience, seed, resume, progress, dev, args)
    except INPUT_ERRORS as err:
        raise fail(err) from None


@table_options
def encode_catalog(
    model: Annotated[Path, typer.Option(help="DuoLM student checkpoint (or training folder).")],
    out: Annotated[Path, typer.Option(help="Item store folder (a new version is added).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    features: Annotated[Path | None, typer.Option(help="Feature cache file.")] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 256,
    device: DeviceOpt = "auto", threads: ThreadsOpt = None, progress: bool = True,
) -> None:
    """Encode every catalog item with the student's item encoder into a versioned store."""
    from genrec.duolm.encoder import ItemEncoder
    from genrec.duolm.ranker import ENCODER_DIR, read_meta
    from genrec.duolm.store import write_store

    dev = resolve_device(device, threads)
    folder = model_folder(model)
    try:
        read_meta(folder)
        ds = load_dataset(data, interactions, items, table)
        encoder = ItemEncoder.load(folder / ENCODER_DIR, dev)
        feats = catalog_features(encoder.config, ds, features, progress)
        vectors = encoder.encode_all(feats, batch_size, progress)
        version = write_store(out, vectors, list(ds.item_ids), meta={
            "dataset": ds.name, "model": folder.name, "encoder": vars(encoder.config)})
    except INPUT_ERRORS as err:
        raise fail(err) from None
    typer.echo(f"{ds.num_items} items x {vectors.shape[1]} vectors x {vectors.shape[2]} "
               f"-> {out} (version {version})")
