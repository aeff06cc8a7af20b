"""The distilled recipe in one run (``genrec train generative --distill``): two teachers trained
from the run's own options, then the run's model distilled from both.

The teachers are the pair measured on amazon14-beauty (docs/results.md):

- ``defaults``: the run's options without distillation, with the history bias and unmasked;
- ``mask-history``: the same with ``--mask-history --no-history-bias --item-loss-weight 0.5``,
  over two thirds of the run's epochs.

The teachers' handling of the user's earlier items is the recipe's own, whatever the student's:
a student trained with ``--mask-history`` (for serving that never recommends an item the user
has) learns from the same pair, their distributions renormalised over the items it may rank.

Layout: each teacher is a complete run of its own under ``OUT/teachers/NAME`` (``last/``,
``best/``, ``model/``); the student is the run in ``OUT`` itself, so ``genrec eval --model OUT``
and ``genrec serve`` read the student. With ``resume`` a teacher whose final model is written
(``model.json``) is reused as it is, an unfinished one continues from its ``last/``, then the
student continues or starts. Training costs about 4.4x one run on amazon14-beauty: two
teachers, and a student whose every step also runs both teachers' forwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from genrec.data.dataset import Dataset
from genrec.training.final_model import has_final_model
from genrec.training.generative_loss import DISTILL_TEMPERATURE
from genrec.training.generative_run import (
    RECIPE_KEYS,
    GenerativeTrainConfig,
    load_config_dataset,
    pick_recipe,
    train_generative,
)
from genrec.training.loop import FitResult
from genrec.training.run_layout import MODEL

TEACHERS = "teachers"  # OUT/teachers/NAME: one complete run per teacher
# a process joins torchrun's group once: the three runs cannot share one process group
ONE_PROCESS = ("--distill trains in one process: for several, train the teachers and then the "
               "student with --teacher, each with --nproc")


def teacher_configs(config: GenerativeTrainConfig,
                    dataset: Dataset) -> dict[str, GenerativeTrainConfig]:
    """The teachers' runs of the distilled recipe ``config`` asks for, by name (their ``out``
    under ``config.out/teachers``). Raises ValueError for options the recipe cannot take."""
    from genrec.data.split import training_sequences

    if config.teacher:
        raise ValueError("--distill trains its own teachers: give --distill or --teacher")
    if config.nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(ONE_PROCESS)
    if config.item_head is False or config.init_from is not None:
        raise ValueError("--distill distils the item head: it trains from scratch with "
                         "--item-head")
    train = training_sequences(dataset.sequences)
    epochs = pick_recipe(train, {k: getattr(config, k) for k in RECIPE_KEYS}, False)["epochs"]
    base = replace(config, distill=False, teacher=None, sid_distill_weight=0.0,
                   distill_temperature=DISTILL_TEMPERATURE, mask_history=False,
                   history_bias=True)
    folder = config.out / TEACHERS
    return {
        "defaults": replace(base, out=folder / "defaults"),
        "mask-history": replace(base, out=folder / "mask-history", mask_history=True,
                                history_bias=False, item_loss_weight=0.5,
                                epochs=max(1, round(epochs * 2 / 3))),
    }


def train_distilled(
    config: GenerativeTrainConfig, dataset: Dataset | None = None,
    echo: Callable[[str], None] = print,
) -> FitResult | None:
    """Train the teachers of :func:`teacher_configs`, then the student ``config`` describes
    distilled from their final models (``--distill-weight`` and ``--sid-distill-weight`` as
    given); returns the student's fit (None off rank 0, as :func:`train_generative`)."""
    ds = load_config_dataset(config) if dataset is None else dataset
    teachers = teacher_configs(config, ds)
    for name, teacher in teachers.items():
        if config.resume and has_final_model(teacher.out):
            echo(f"teacher {name}: reused ({teacher.out / MODEL})")
            continue
        echo(f"teacher {name}: training ({teacher.out})")
        train_generative(teacher, ds, echo)
    student = replace(config, distill=True, teacher=[t.out / MODEL for t in teachers.values()])
    echo(f"student: distilled from {len(teachers)} teachers ({config.out})")
    return train_generative(student, ds, echo)
