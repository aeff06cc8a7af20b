"""CUDA: beam search and scoring on a GPU equal the CPU engine's, CUDA graphs equal eager runs,
graph replays stay correct when the inputs change, and the search levels do no host sync.

Tiny random models (seconds on a GPU). Every test is skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch

from genrec import (
    BeamParams,
    Engine,
    EngineConfig,
    ScoreParams,
    ScoreRequest,
)
from genrec.catalog.item_table import ItemTable
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (torch.cuda.is_available() is False)")

SIZES = [8, 6, 5]  # three levels; the first has fewer codes than the beam width below
N_ITEMS = 150
USER_DIM = 5
PARAMS = BeamParams(beam_width=16, n=10)


def _config(graphs: bool | None = None) -> EngineConfig:
    if graphs is None:
        return EngineConfig(soft_token_id=SOFT_ID)
    return EngineConfig(soft_token_id=SOFT_ID, cuda_graphs=graphs)


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 products in fp32 on the GPU (the comparisons with the CPU assume it)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


@pytest.fixture(scope="module")
def vocab() -> SidVocab:
    g = torch.Generator().manual_seed(0)
    all_ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    pick = torch.randperm(all_ids.shape[0], generator=g)[:N_ITEMS]
    return SidVocab(SemanticIndex(all_ids[pick], SIZES), max_history=12)


def _model() -> torch.nn.Module:
    """The same random model on every call (built on the CPU, fp32): copies for each device
    without deep-copying a model the CPU engine has packed weights into."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, user_dim=USER_DIM, max_position_embeddings=128)
    model = build_model(cfg)
    with torch.no_grad():  # sharper distributions than the default init: clear top items
        model.lm_head.weight.mul_(20)
    return model.eval()


@pytest.fixture(scope="module")
def cpu_model() -> torch.nn.Module:
    return _model()


@pytest.fixture(scope="module")
def cuda_model() -> torch.nn.Module:
    return _model().to("cuda")


def _requests(seed: int = 0, count: int = 3) -> list[RowRequest]:
    """Requests of different prompt lengths, a user vector, an exclude and an allow list (3
    requests: the GPU pads them to a bucket of 4)."""
    g = torch.Generator().manual_seed(seed)

    def history(n: int) -> list[int]:
        return torch.randint(0, N_ITEMS, (n,), generator=g).tolist()

    reqs = [
        RowRequest(history=history(7)),
        RowRequest(history=history(2), user_vector=torch.randn(USER_DIM, generator=g)),
        RowRequest(history=history(12), exclude=history(20)),
        RowRequest(history=history(4), allow=sorted(set(history(30)))),
    ]
    return reqs[:count]


def _assert_same(got, want, atol: float = 1e-4) -> None:  # noqa: ANN001 - RowRecommendation lists
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.items == w.items
        assert torch.allclose(torch.tensor(g.scores), torch.tensor(w.scores), atol=atol,
                              rtol=1e-5)


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("count", [1, 3, 4])
def test_recommend_on_cuda_equals_cpu(cpu_model, cuda_model, vocab, graphs, count) -> None:  # noqa: ANN001
    cpu = Engine(cpu_model, config=_config(), vocab=vocab)
    gpu = Engine(cuda_model, config=_config(graphs), vocab=vocab)
    reqs = _requests(count=count)
    want = cpu.recommend_rows(reqs, PARAMS)
    got = gpu.recommend_rows(reqs, PARAMS)
    assert all(len(r.items) > 0 for r in got)
    _assert_same(got, want)


def test_graphs_equal_eager_and_replays_follow_new_inputs(cuda_model, vocab) -> None:  # noqa: ANN001
    graphs = Engine(cuda_model, config=_config(True), vocab=vocab)
    eager = Engine(cuda_model, config=_config(False), vocab=vocab)
    first, second = _requests(seed=0), _requests(seed=1)
    want_first = eager.recommend_rows(first, PARAMS)
    want_second = eager.recommend_rows(second, PARAMS)
    _assert_same(graphs.recommend_rows(first, PARAMS), want_first, atol=1e-5)
    # the same shape again: a replay, over the same inputs and over new ones
    _assert_same(graphs.recommend_rows(first, PARAMS), want_first, atol=1e-5)
    _assert_same(graphs.recommend_rows(second, PARAMS), want_second, atol=1e-5)
    _assert_same(graphs.recommend_rows(first, PARAMS), want_first, atol=1e-5)
    # the engine's runner pool: a graph was captured and kept
    assert any(r.graph is not None for r in graphs.searches.kept_runners())


def test_graphs_in_bf16_equal_eager(vocab) -> None:  # noqa: ANN001
    model = _model().to("cuda", torch.bfloat16)
    reqs = _requests(count=4)
    eager = Engine(model, config=_config(False), vocab=vocab).recommend_rows(reqs, PARAMS)
    engine = Engine(model, config=_config(True), vocab=vocab)
    for _ in range(2):
        got = engine.recommend_rows(reqs, PARAMS)
        for g, e in zip(got, eager, strict=True):
            assert g.items and all(0 <= i < N_ITEMS for i in g.items)
            assert g.items[:3] == e.items[:3]
            assert torch.allclose(torch.tensor(g.scores[:3]), torch.tensor(e.scores[:3]),
                                  atol=5e-2)


def test_sync_trap_catches_a_host_sync() -> None:
    from genrec.utils import sync_trap as trap

    x = torch.ones(3, device="cuda")
    with pytest.raises(trap.HostSyncError), trap.no_host_sync():
        x.sum().item()
    assert x.sum().item() == 3.0  # the trap is off again


def test_search_levels_do_no_host_sync(cuda_model, vocab, monkeypatch) -> None:  # noqa: ANN001
    """The levels after the prompt forward (the body a CUDA graph captures) run eagerly under
    ``no_host_sync()`` inside ``Engine.recommend``."""
    from genrec.engine import beam_runner
    from genrec.utils.sync_trap import no_host_sync

    inner, calls = beam_runner.search_levels, []

    def trapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        with no_host_sync():
            return inner(*args, **kwargs)

    monkeypatch.setattr(beam_runner, "search_levels", trapped)
    engine = Engine(cuda_model, config=_config(False), vocab=vocab)
    got = engine.recommend_rows(_requests(count=4), PARAMS)
    assert calls and all(r.items for r in got)


def _scoring_setup(cpu_model: torch.nn.Module, mode: str):  # noqa: ANN202
    """Two users over the generative model's text tokens plus an item table (DuoLM-style
    virtual tokens, 2 per item); 'loglik' candidates are text (it scores text tokens only)."""
    g = torch.Generator().manual_seed(3)
    vocab_size = cpu_model.config.vocab_size
    table = ItemTable(0.5 * torch.randn(40, 2, cpu_model.config.hidden_size, generator=g))

    def item(i: int) -> list[int]:
        return [vocab_size + 2 * i, vocab_size + 2 * i + 1]

    reqs = []
    for n_hist, n_cand in ((6, 9), (3, 17)):
        hist = torch.randint(0, 40, (n_hist,), generator=g).tolist()
        prefix = [0] + [t for i in hist for t in item(i)] + [2]
        if mode == "loglik":
            cands = [torch.randint(3, vocab_size, (1 + j % 4,), generator=g).tolist()
                     for j in range(n_cand)]
        else:
            cands = [item(i) + ([5] if i % 3 == 0 else [])
                     for i in torch.randint(0, 40, (n_cand,), generator=g).tolist()]
        reqs.append(ScoreRequest(prefix=prefix, candidates=cands))
    return table, reqs


@pytest.mark.parametrize("mode", ["labels", "loglik"])
def test_scoring_on_cuda_equals_cpu(cpu_model, cuda_model, mode) -> None:  # noqa: ANN001
    table, reqs = _scoring_setup(cpu_model, mode)
    params = ScoreParams(mode=mode, label_token_ids=[3, 4] if mode == "labels" else None)
    cpu = Engine(cpu_model, item_table=table)
    gpu = Engine(cuda_model, item_table=table, config=_config(True))
    want = cpu.score_requests(reqs, params)
    got = gpu.score_requests(reqs, params)
    for g, w in zip(got, want, strict=True):
        assert g.device.type == "cpu" and g.shape == w.shape
        assert torch.allclose(g, w, atol=1e-4, rtol=1e-5)
    # one user alone scores as in the batch
    alone = gpu.score_requests(reqs[1:], params)[0]
    assert torch.allclose(alone, got[1], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_cuda_attention_equals_the_math_path(dtype: torch.dtype, masked: bool) -> None:
    from genrec.model.grid_attention import attend, attend_math, cuda_fused_ok

    assert cuda_fused_ok(torch.device("cuda", torch.cuda.current_device()), dtype)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(3, h, 50, 64, generator=g, device="cuda", dtype=dtype)
               for h in (8, 2, 2))
    mask = None
    if masked:  # additive, keys beyond each row's used length masked
        used = torch.tensor([50, 31, 7], device="cuda")
        keep = torch.arange(50, device="cuda")[None, :] < used[:, None]
        mask = torch.zeros(3, 1, 1, 50, device="cuda", dtype=dtype).masked_fill(
            ~keep[:, None, None, :], float("-inf")).expand(3, 1, 50, 50)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    with torch.inference_mode():
        for causal in (False, True):
            out, lse = attend(q, k, v, mask, causal, 0.125)
            ref, ref_lse = attend_math(q, k, v, mask, causal, 0.125)
            assert torch.allclose(out.float(), ref.float(), atol=tol)
            assert torch.allclose(lse, ref_lse, atol=tol)


@pytest.mark.parametrize("graphs", [False, True])
def test_whole_search_reads_nothing_back(cuda_model, vocab, graphs: bool) -> None:  # noqa: ANN001
    """From the prompt forward to the [R, width] result on the device, a search (after one
    warm-up call of its shape: memoised layouts moved once, graph captured) does no host sync
    and no blocking copy (``set_sync_debug_mode("error")`` under the trap)."""
    from genrec.utils.sync_trap import no_host_sync

    engine = Engine(cuda_model, config=_config(graphs), vocab=vocab)
    reqs = _requests(count=3)
    want = engine.recommend_rows(reqs, PARAMS)
    prepared = engine.prepare_recommend(reqs, PARAMS)
    cat, batch = prepared.catalog, prepared.batch
    args = (cat.parts(), prepared.filters, cat.level_offsets, engine.embed(batch),
            batch.layout.prefix_len.tolist(), batch.prefix_last.to("cuda"), PARAMS.beam_width)
    torch.cuda.synchronize()
    with no_host_sync():
        out = engine.searches.search(*args)
    for r, rec in enumerate(want):
        assert out.items[r][: len(rec.items)].tolist() == rec.items


def test_graphs_follow_catalog_updates(cuda_model, cpu_model, vocab) -> None:  # noqa: ANN001
    """A captured graph is never replayed over another catalog: after an update (items
    retired, one moved to the delta) the search reads the new tries (a new runner, captured
    for them) and equals the CPU engine on the same state."""
    gpu = Engine(cuda_model, config=_config(True), vocab=vocab)
    cpu = Engine(cpu_model, config=_config(), vocab=vocab)
    reqs = _requests(count=4)
    before = gpu.recommend_rows(reqs, PARAMS)
    gone = sorted({i for r in before for i in r.items[:2]})
    for engine in (gpu, cpu):
        engine.set_catalog(engine.catalog.updated(retire=gone))
    after = gpu.recommend_rows(reqs, PARAMS)
    assert not {i for r in after for i in r.items} & set(gone)
    _assert_same(after, cpu.recommend_rows(reqs, PARAMS))
    assert len(gpu.searches.kept_runners()) == 2


@pytest.mark.parametrize("graphs", [False, True])
def test_grid_scoring_on_cuda_equals_cpu(cpu_model, cuda_model, graphs: bool) -> None:  # noqa: ANN001
    """DuoLM-style candidates of one length run on a fixed grid on CUDA (captured with
    graphs), replays follow new inputs, and equal the CPU's packed path."""
    table, reqs = _scoring_setup(cpu_model, "labels")
    reqs = [ScoreRequest(r.prefix, [c[:2] for c in r.candidates]) for r in reqs]
    params = ScoreParams(mode="labels", label_token_ids=[3, 4])
    cpu = Engine(cpu_model, item_table=table)
    gpu = Engine(cuda_model, item_table=table, config=_config(graphs))
    assert gpu.scorers.enabled
    for batch in (reqs, reqs[::-1], reqs[:1]):
        want = cpu.score_requests(batch, params)
        got = gpu.score_requests(batch, params)
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, atol=1e-4, rtol=1e-5)
    assert gpu.scorers.kept_runners()
    if graphs:
        assert all(r.graph is not None for r in gpu.scorers.kept_runners().values())
