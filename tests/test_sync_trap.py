"""no_host_sync: host reads of tensor data raise, ordinary ops run unchanged, the state is
restored; and genrec's scoring forward reads no device data (the end of this file)."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

import genrec.kernels
from genrec import Engine, EngineConfig, ScoreParams, ScoreRequest
from genrec.engine.chunked import forward_chunked
from genrec.engine.scoring import read_scores
from genrec.model import (
    DecoderLM,
    ModelConfig,
    attention,
    build_model,
    grid_attention,
    layers,
    lm_head,
    packed_layout,
)
from genrec.utils.sync_trap import HostSyncError, allow_host_sync, host_side, no_host_sync

SCALAR = r"aten\.(_local_scalar_dense|item|is_nonzero) \("
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    # made inside the block from Python numbers: still trapped (the point is to find reads)
    x = torch.tensor([[0.0, 1.5, -2.0], [3.0, 1.5, 0.5]])
    return x, x > 1


def _set_mask(x: torch.Tensor, m: torch.Tensor) -> None:
    x[m] = 0.0


READS = {
    "item": (lambda x, m: x[0, 0].item(), SCALAR),
    "int": (lambda x, m: int(x[0, 0]), SCALAR),
    "float": (lambda x, m: float(x[0, 0]), SCALAR),
    "bool": (lambda x, m: bool(m[0, 0]), SCALAR),
    "if": (lambda x, m: 1 if (x > 0).any() else 0, SCALAR),
    "index": (lambda x, m: [1, 2, 3][x.long()[0, 1]], SCALAR),
    "format": (lambda x, m: f"{x[0, 0]:.2f}", SCALAR),
    "contains": (lambda x, m: 1.5 in x, SCALAR),
    "is_nonzero": (lambda x, m: torch.is_nonzero(x[0, 0]), SCALAR),
    "narrow": (lambda x, m: x.narrow(1, torch.tensor(1), 1), r"aten\.(narrow|_local_scalar)"),
    "tolist": (lambda x, m: x.tolist(), r"Tensor\.tolist"),
    "numpy": (lambda x, m: x.numpy(), r"Tensor\.numpy"),
    "asarray": (lambda x, m: np.asarray(x), r"Tensor\.numpy"),
    "nonzero": (lambda x, m: x.nonzero(), r"aten\.nonzero"),
    "where": (lambda x, m: torch.where(m), r"aten\.(where|nonzero)"),
    "argwhere": (lambda x, m: torch.argwhere(m), r"aten\.(argwhere|nonzero)"),
    "masked_select": (lambda x, m: x.masked_select(m), r"aten\.masked_select"),
    "mask_index": (lambda x, m: x[m], r"aten\.index \(boolean"),
    "mask_assign": (_set_mask, r"aten\.index_put_ \(boolean"),
    "unique": (lambda x, m: torch.unique(x), r"aten\._unique2"),
    "unique_dim": (lambda x, m: torch.unique(x, dim=0), r"aten\.unique_dim"),
    "unique_consecutive": (lambda x, m: torch.unique_consecutive(x),
                           r"aten\.unique_consecutive"),
    "repeat_interleave": (lambda x, m: torch.repeat_interleave(torch.tensor([1, 2])),
                          r"aten\.repeat_interleave \(repeats without output_size"),
    "repeat_interleave_self": (lambda x, m: x.repeat_interleave(torch.tensor([1, 2]), dim=0),
                               r"aten\.repeat_interleave \(repeats without output_size"),
    "equal": (lambda x, m: torch.equal(x, x), r"aten\.equal"),
    "allclose": (lambda x, m: torch.allclose(x, x), r"aten\.allclose"),
    "bincount": (lambda x, m: torch.bincount(m.flatten().long()), r"aten\.bincount"),
}


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference"])
@pytest.mark.parametrize("read", list(READS))
def test_reads_raise_naming_the_op(read: str, inference: bool) -> None:
    call, name = READS[read]
    with torch.inference_mode(inference), no_host_sync():
        x, m = _data()
        with pytest.raises(HostSyncError, match=name):
            call(x, m)


def _ordinary(x: torch.Tensor) -> list[torch.Tensor]:
    # ops that read no data on the host (x: [4, 6])
    i = torch.tensor([2, 0, 3])
    q = x.reshape(1, 2, 4, 3)
    top, idx = x.topk(2, dim=-1)
    y = x.clone()
    y.add_(1.0).mul_(2.0)
    y[:, 1] += 3.0
    y[i, 0] = 7.0
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    return [
        x * 2 + 1, torch.exp(x).sum(-1), x.softmax(-1), x @ x.T, q @ q.transpose(-1, -2), top, idx,
        x.gather(1, idx), torch.zeros(4, 6).scatter(1, idx, 1.0),
        torch.zeros(5).index_add_(0, torch.tensor([1, 1, 4]), torch.ones(3)),
        torch.searchsorted(torch.arange(6.0), x), x.index_select(0, i), x[i], x[:, i], x[1:3, ::2],
        x.cumsum(0), torch.where(x > 0, x, 0.0), x.masked_fill(x > 0.5, -1.0),
        x.repeat_interleave(2, dim=0), torch.repeat_interleave(x, torch.tensor([1, 0, 2, 1]),
                                                               dim=0, output_size=4),
        F.scaled_dot_product_attention(q, q, q, attn_mask=causal),
        F.scaled_dot_product_attention(q, q, q, is_causal=True), F.layer_norm(x, (6,)),
        torch.nonzero_static(x.flatten() > 0, size=30), (x > 0).any(), x.amax(), y,
        x.T.contiguous(),
        torch.cat([x, x]), torch.stack([x, x]).view(2, 24), x.expand(2, 4, 6).sum(0),
    ]


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference"])
def test_ordinary_ops_run_unchanged(inference: bool) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(inference):
        want = _ordinary(x)
        with no_host_sync():
            got = _ordinary(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_autograd_and_onednn_ops_run() -> None:
    x = torch.randn(5, 8, requires_grad=True)
    lin = torch.nn.Linear(8, 4)
    with no_host_sync():
        (lin(x).relu() ** 2).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    with torch.inference_mode():
        y = torch.randn(5, 8)
        want = layers.linear(y, lin, silu=True)
        with no_host_sync():
            got = layers.linear(y, lin, silu=True)  # torch.ops.mkldnn on a oneDNN CPU
    assert torch.equal(got, want)


def test_native_kernel_op_runs() -> None:
    op = genrec.kernels.cascade_attention_op()
    if op is None:
        pytest.skip("the native CPU kernel is not built here (no C++ compiler or MKL)")
    torch.manual_seed(0)
    shared, branch, q = torch.randn(2, 50, 2, 8), torch.randn(2, 20, 2, 8), torch.randn(30, 4, 8)
    runs = torch.tensor([[0, 10, 0, 40, 0, 2, 3], [10, 20, 0, 0, 1, 5, 4]])
    want = op(q, shared[0], shared[1], branch[0], branch[1], runs, 0.3)
    with torch.inference_mode(), no_host_sync():
        got = op(q, shared[0], shared[1], branch[0], branch[1], runs, 0.3)
    assert torch.equal(got, want)


def _assert_restored() -> None:
    assert _get_current_dispatch_mode() is None
    assert "tolist" not in torch.Tensor.__dict__ and "numpy" not in torch.Tensor.__dict__
    x = torch.tensor([1, 2])
    assert x.tolist() == [1, 2] and x.numpy().tolist() == [1, 2] and int(x[1]) == 2
    assert bool((x > 1).any()) and x[x > 1].tolist() == [2]


def test_state_restored_after_the_block_and_after_an_exception() -> None:
    with no_host_sync():
        pass
    _assert_restored()
    with pytest.raises(ValueError), no_host_sync():
        raise ValueError("boom")
    _assert_restored()
    with pytest.raises(HostSyncError), no_host_sync(), allow_host_sync():
        with no_host_sync():
            torch.tensor(1).item()
    _assert_restored()


def test_allow_host_sync_lifts_the_trap_inside_its_block_only() -> None:
    x = torch.tensor([3, 4])
    with no_host_sync():
        with allow_host_sync():
            assert x.tolist() == [3, 4] and x[1].item() == 4
        with pytest.raises(HostSyncError):
            x.tolist()
    with allow_host_sync():  # a no-op outside a trap
        assert x.sum().item() == 7
    _assert_restored()


def test_nesting() -> None:
    x = torch.tensor([3, 4])
    with no_host_sync():
        with no_host_sync():
            pass
        with pytest.raises(HostSyncError):  # the inner exit keeps the outer trap
            x.tolist()
        with allow_host_sync(), no_host_sync(), pytest.raises(HostSyncError):
            int(x[0])  # a trap inside allow_host_sync traps again
        with host_side():  # host tensors: the CPU emulation is lifted
            assert int(x.sum()) == 7
            with no_host_sync(), pytest.raises(HostSyncError):
                x.tolist()
        with pytest.raises(HostSyncError):
            x.numpy()
    with host_side():  # a no-op outside a trap
        assert x.tolist() == [3, 4]
    _assert_restored()


def test_other_threads_are_not_trapped() -> None:
    seen: list[object] = []

    def read() -> None:
        seen.append(torch.tensor([5, 6]).tolist())
        seen.append(torch.tensor(7).item())

    with no_host_sync():
        worker = threading.Thread(target=read)
        worker.start()
        worker.join()
    assert seen == [[5, 6], 7]


@needs_cuda
def test_cuda_item_raises_and_sync_debug_mode_is_restored() -> None:
    before = torch.cuda.get_sync_debug_mode()
    x = torch.arange(4.0, device="cuda")
    with no_host_sync():
        assert torch.cuda.get_sync_debug_mode() == 2
        y = (x * 2).cumsum(0)  # no read: runs
        with pytest.raises(HostSyncError, match=SCALAR):
            y[-1].item()
        with pytest.raises(RuntimeError, match="synchroniz"):
            y.cpu()  # a blocking copy: CUDA's own check
        with allow_host_sync():
            assert torch.cuda.get_sync_debug_mode() == before
            assert y[-1].item() == 12.0
        assert torch.cuda.get_sync_debug_mode() == 2
    assert torch.cuda.get_sync_debug_mode() == before
    with pytest.raises(ValueError), no_host_sync():
        raise ValueError("boom")
    assert torch.cuda.get_sync_debug_mode() == before


# --- The real check: genrec's scoring forward under the trap -------------------------------
# The batch is packed and embedded on the host as Engine.score_requests does; only the forward
# and the score read-out (forward_chunked + read_scores) run inside no_host_sync(), with the
# native CPU kernel off (the path a GPU takes). "gpu-like" also takes the GPU's attention
# (math) and linear (no oneDNN) paths. Host-side index planning is marked host_side().

REQUESTS = {
    "one": [ScoreRequest([5, 9, 2, 7], [[3, 4], [8], [10, 11, 12]])],
    "several": [ScoreRequest([5, 9, 2], [[3, 4], [8]]), ScoreRequest([1], [[6, 6, 6]]),
                ScoreRequest([2, 4, 6, 8, 10], [[13], [14, 15], [9], [3, 3]])],
}
PARAMS = {"labels": ScoreParams("labels", [3, 7]), "softmax": ScoreParams("labels", [3, 7], True),
          "loglik": ScoreParams("loglik"), "head": ScoreParams("head")}


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    torch.manual_seed(0)  # a tiny Qwen3 (head norms) with a score head
    return build_model(ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8, score_head=True,
                                   max_position_embeddings=64))


@pytest.fixture(params=["cpu", "gpu-like"])
def gpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(genrec.kernels._state, "loaded", False)
    if request.param == "gpu-like":
        monkeypatch.setattr(attention, "attend", grid_attention.attend_math)
        for module in (layers, lm_head):
            monkeypatch.setattr(module, "onednn_inference", lambda x, weight: False)
    grid_attention.cpu_flash_takes_gqa()  # a memoised probe: once, before any block
    return request.param


def _score_trapped(model: DecoderLM, requests: list[ScoreRequest], params: ScoreParams,
                   chunk: int) -> list[torch.Tensor]:
    engine = Engine(model, config=EngineConfig(chunk_tokens=chunk))
    with torch.inference_mode():
        batch = engine.pack([r.prefix for r in requests], [r.candidates for r in requests],
                            [r.user_vector for r in requests])
        embeds = engine.embed(batch)  # on the model's device
        with no_host_sync():
            hidden = forward_chunked(model, embeds, batch, chunk,
                                     last_only=params.mode != "loglik")
            scores = read_scores(model, hidden, batch, params)
            with allow_host_sync():  # the final result copy
                scores = scores.cpu()
    return list(torch.split(scores, batch.branch_counts))


@pytest.mark.parametrize("chunk", [4096, 3], ids=["one-forward", "chunked"])
@pytest.mark.parametrize("requests", list(REQUESTS))
@pytest.mark.parametrize("mode", list(PARAMS))
def test_scoring_forward_reads_no_device_data(model: DecoderLM, gpu_path: str, mode: str,
                                              requests: str, chunk: int) -> None:
    reqs, params = REQUESTS[requests], PARAMS[mode]
    want = Engine(model, config=EngineConfig(chunk_tokens=chunk)).score_requests(reqs, params)
    got = _score_trapped(model, reqs, params, chunk)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))  # bit-identical


@needs_cuda
@pytest.mark.parametrize("mode", ["labels", "loglik"])
def test_scoring_forward_on_cuda(model: DecoderLM, mode: str) -> None:
    # host tensors reach the GPU through pinned memory (utils.device.to_device), so the
    # forward and read-out make no blocking copy either; one call first for the memoised
    # probes (the fused-attention check)
    cuda = copy.deepcopy(model).cuda()
    want = Engine(cuda, config=EngineConfig(chunk_tokens=3)).score_requests(REQUESTS["several"],
                                                                             PARAMS[mode])
    got = _score_trapped(cuda, REQUESTS["several"], PARAMS[mode], 3)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want, strict=True))


def test_a_read_planted_in_the_forward_is_found(model: DecoderLM, gpu_path: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    merge = packed_layout.merge_attention  # where the forward calls it

    def checked_merge(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                      lse_b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        assert bool(lse_b.isfinite().all())  # a device read: a sync on a GPU
        return merge(o_a, lse_a, o_b, lse_b, out)

    monkeypatch.setattr(packed_layout, "merge_attention", checked_merge)
    with pytest.raises(HostSyncError, match=SCALAR):
        _score_trapped(model, REQUESTS["several"], PARAMS["labels"], 3)
