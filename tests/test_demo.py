"""The demo: synthetic data and its Semantic IDs, tiny training, metrics, and a shortened main
job that serves its model over HTTP."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
import torch

from genrec.demo import DemoResult, SyntheticConfig, TrainConfig, generate, run_demo
from genrec.demo.quality import heldout_request, quality
from genrec.demo.serving import check_port, serve_until_interrupted, start_server
from genrec.demo.synthetic import item_name, popularity, semantic_index, split_users
from genrec.demo.train import pack_batch, sequence_loss, tiny_config, train_model
from genrec.engine import BeamParams, Engine
from genrec.vocab.sid_vocab import BOS_ID, SidVocab

SMALL = SyntheticConfig(num_items=60, num_clusters=6, num_users=300, min_len=5, max_len=10)


def test_generate_structure() -> None:
    data = generate(SMALL)
    cfg = data.config
    assert data.item_cluster.shape == (60,)
    assert sorted(set(data.item_cluster.tolist())) == list(range(6))
    assert (np.diff(data.item_cluster) >= 0).all()  # contiguous clusters
    assert len(data.sequences) == 300 and data.preferred.shape == (300,)
    same, steps = 0, 0
    for seq in data.sequences:
        assert cfg.min_len <= len(seq) <= cfg.max_len
        assert len(set(seq)) == len(seq)  # no item twice
        assert all(0 <= i < cfg.num_items for i in seq)
        clusters = data.item_cluster[seq]
        same += int((clusters[1:] == clusters[:-1]).sum())
        steps += len(seq) - 1
    assert same / steps > 0.75  # users mostly stay within a cluster
    assert list(data.cluster_items(1)) == list(range(10, 20))


def test_generate_is_seeded() -> None:
    a, b = generate(SMALL), generate(SMALL)
    assert a.sequences == b.sequences
    c = generate(SyntheticConfig(**{**SMALL.__dict__, "seed": 1}))
    assert c.sequences != a.sequences


def test_generate_rejects_bad_config() -> None:
    with pytest.raises(ValueError):
        generate(SyntheticConfig(num_items=10, num_clusters=10))
    with pytest.raises(ValueError):
        generate(SyntheticConfig(min_len=1))


def test_semantic_index_is_cluster_then_rank() -> None:
    data = generate(SyntheticConfig(num_items=25, num_clusters=4, num_users=10))
    index = semantic_index(data)
    assert index.codebook_sizes == [4, 7]  # clusters of 7, 6, 6 and 6 items
    assert index.codes[:, 0].tolist() == data.item_cluster.tolist()
    for c in range(4):
        assert index.codes[data.cluster_items(c), 1].tolist() == list(range(len(
            data.cluster_items(c))))
    index.validate()  # every item has its own ID
    vocab = SidVocab(index, max_history=20)
    base = vocab.base
    assert vocab.item_tokens([8]).tolist() == [[base + 1, base + 4 + 1]]  # cluster 1, rank 1
    assert vocab.prompt([8, 0]) == [BOS_ID, base + 1, base + 4 + 1, base, base + 4]


def test_split_and_popularity_baseline() -> None:
    data = generate(SMALL)
    train, held = split_users(data, 50)
    assert len(held) == 50 and not set(train) & set(held)
    assert sorted(train + held) == list(range(300))
    counts = popularity(data, train)
    assert counts.sum() == sum(len(data.sequences[u]) for u in train)
    request = heldout_request(data, held[0])
    assert list(request.history) == data.sequences[held[0]][:-1]
    assert list(request.exclude) == list(request.history)


def test_quality() -> None:
    q = quality([[3, 1], [2, 4], [5]], [1, 9, 5], k=2)
    assert q.recall == pytest.approx(2 / 3) and q.num_users == 3 and q.k == 2
    assert q.ndcg == pytest.approx((1 / np.log2(3) + 1.0) / 3)


def test_pack_batch_targets() -> None:
    ids, targets, lengths = pack_batch([[0, 5, 6], [0, 7]])
    assert ids.tolist() == [0, 5, 6, 0, 7]
    assert targets.tolist() == [5, 6, -100, 7, -100]
    assert lengths == [3, 2]


def test_training_lowers_loss() -> None:
    data = generate(SMALL)
    vocab = SidVocab(semantic_index(data))
    seqs = [vocab.prompt(s) for s in data.sequences]
    model, losses = train_model(tiny_config(vocab.vocab_size), seqs,
                                TrainConfig(steps=30, batch_size=32), progress=False)
    assert len(losses) == 30 and not model.training
    with torch.no_grad():
        assert sequence_loss(model, seqs[:50]).item() < losses[0] - 0.5


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, list[str]]:
    lines: list[str] = []
    threads = torch.get_num_threads()
    result = run_demo(
        tmp_path_factory.mktemp("demo") / "ckpt", SyntheticConfig(num_users=600, seed=0),
        TrainConfig(steps=40, batch_size=32, seed=0), num_heldout=100, progress=False,
        echo=lines.append, serve=False,
    )
    assert torch.get_num_threads() == threads  # restored
    return result, lines


def test_short_demo_beats_popularity(short_demo: tuple[DemoResult, list[str]]) -> None:
    result, lines = short_demo
    for name in ("config.json", "model.safetensors", "sid_vocab.json", "semantic_index.json"):
        assert (result.out_dir / name).is_file(), name
    vocab = SidVocab.load(result.out_dir)  # what Engine.from_pretrained and `genrec serve` read
    assert vocab.num_levels == 2 and vocab.max_history == 20
    assert result.reload_max_diff < 1e-5
    assert result.model.num_users == 100 and result.model.k == 10
    # Seeded; across seeds 0-3 this budget gives Recall@10 0.72-0.85 against 0.07-0.09.
    assert result.model.recall > 0.5
    assert result.model.recall > result.popularity.recall + 0.4
    text = "\n".join(lines)
    assert "Recall@10" in text and "popularity" in text and "time:" in text
    assert "POST http://127.0.0.1:" in text and "genrec serve --model" in text
    assert "serving on" not in text  # serve=False: no waiting


def test_http_answer_equals_engine_recommend(short_demo: tuple[DemoResult, list[str]]) -> None:
    result, _ = short_demo
    engine = Engine.from_pretrained(result.out_dir)
    assert engine.vocab is not None  # a generative engine
    data = generate(SyntheticConfig(num_users=600, seed=0))
    request = heldout_request(data, result.sample_user)
    assert result.request["history"] == [item_name(i) for i in request.history]
    assert result.request["history"][0].startswith("song-")
    assert result.sample_target == data.sequences[result.sample_user][-1]
    expected = engine.recommend_rows([request], BeamParams(beam_width=20, n=10))[0]
    assert result.answer["items"] == [item_name(i) for i in expected.items]
    assert len(expected.items) == 10
    assert result.answer["scores"] == pytest.approx(expected.scores, abs=1e-6)
    assert not set(expected.items) & set(request.history)


def test_serve_until_interrupted_stops(short_demo: tuple[DemoResult, list[str]]) -> None:
    engine = Engine.from_pretrained(short_demo[0].out_dir)
    server = start_server(engine)
    lines: list[str] = []
    threading.Timer(0.2, server.stop).start()  # as the server ending on its own
    serve_until_interrupted(server, lines.append)
    assert lines == [f"\nserving on {server.url} (Ctrl-C to stop)"]
    assert not server.thread.is_alive()



def test_busy_port_fails_before_training() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(OSError, match=f"port {port}"):
            check_port(port)
        with pytest.raises(OSError):
            run_demo(port=port, serve=False, echo=lambda _: None)  # raises before any work
    check_port(None)
