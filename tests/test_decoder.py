"""genrec's decoder against transformers: same logits, plain causal and with branches."""

from __future__ import annotations

import pytest
import torch

from genrec.model import build_layout, load_model
from genrec.utils.cpu import cpu_features

pytestmark = pytest.mark.numerics


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["qwen3_dir", "llama_dir"])
def test_logits_match_transformers(arch: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(arch)
    hf, ours = _hf(path), load_model(path)
    torch.manual_seed(1)
    seqs = [torch.randint(0, 128, (n,)) for n in (37, 5, 90)]
    layout = build_layout([len(s) for s in seqs], [], [])
    with torch.no_grad():
        hidden = ours(ours.model.embed_tokens(torch.cat(seqs)), layout.positions, layout)
        logits = ours.logits(hidden)
        start = 0
        for s in seqs:
            ref = hf(s[None]).logits[0]
            assert (logits[start : start + len(s)] - ref).abs().max().item() < 1e-4
            start += len(s)


@pytest.mark.parametrize("arch", ["qwen3_dir", "llama_dir"])
def test_branches_match_prefix_plus_branch_alone(arch: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(arch)
    hf, ours = _hf(path), load_model(path)
    torch.manual_seed(2)
    prefixes = [torch.randint(0, 128, (n,)) for n in (20, 1, 33)]
    branches = [[torch.randint(0, 128, (n,)) for n in lens] for lens in ([3, 9, 1], [4], [2, 2])]
    req = [r for r, bs in enumerate(branches) for _ in bs]
    lens = [len(b) for bs in branches for b in bs]
    layout = build_layout([len(p) for p in prefixes], req, lens)
    tokens = torch.cat([t for p, bs in zip(prefixes, branches, strict=False) for t in [p, *bs]])
    with torch.no_grad():
        logits = ours.logits(ours(ours.model.embed_tokens(tokens), layout.positions, layout))
        start = 0
        for p, bs in zip(prefixes, branches, strict=False):
            ref_p = hf(p[None]).logits[0]
            assert (logits[start : start + len(p)] - ref_p).abs().max().item() < 1e-4
            start += len(p)
            for b in bs:
                ref = hf(torch.cat([p, b])[None]).logits[0, len(p) :]
                assert (logits[start : start + len(b)] - ref).abs().max().item() < 1e-4
                start += len(b)


@pytest.mark.parametrize("compute", ["fp32", "native"])
def test_bf16_runs_close_to_fp32(qwen3_dir, compute: str, monkeypatch) -> None:
    # bf16 products in fp32 (CPUs without bf16 instructions) or in bf16 (GENREC_BF16_COMPUTE)
    if compute == "native" and not cpu_features().onednn_bf16:
        pytest.skip("oneDNN has no bf16 products on this CPU (they need AVX-512 BW/VL/DQ or "
                    "AVX-NE-CONVERT); the warned fallback is tested in test_cpu.py")
    monkeypatch.setenv("GENREC_BF16_COMPUTE", compute)
    fp32, bf16 = load_model(qwen3_dir), load_model(qwen3_dir, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    tokens = torch.randint(0, 128, (40,))
    layout = build_layout([30], [0, 0], [4, 6])
    with torch.no_grad():
        a = fp32.logits(fp32(fp32.model.embed_tokens(tokens), layout.positions, layout))
        b = bf16.logits(bf16(bf16.model.embed_tokens(tokens), layout.positions, layout))
    assert torch.isfinite(b).all() and b.dtype == torch.float32
    assert (a - b).abs().max().item() < 0.1 * a.abs().max().item()


def test_forward_rejects_mismatched_sizes(qwen3_dir) -> None:
    model = load_model(qwen3_dir)
    layout = build_layout([5], [], [])
    with pytest.raises(ValueError, match="tokens"):
        model(model.model.embed_tokens(torch.arange(4)), torch.arange(4), layout)


def test_gradients_flow_through_branches(qwen3_dir) -> None:
    model = load_model(qwen3_dir).train()
    layout = build_layout([6], [0, 0], [3, 2])
    embeds = model.model.embed_tokens(torch.randint(0, 128, (11,)))
    loss = model.logits(model(embeds, layout.positions, layout))[6:].logsumexp(-1).sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


@pytest.fixture(scope="module")
def qwen3_bias_dir(tmp_path_factory: pytest.TempPathFactory):
    # attention biases: the input norm's row scale no longer cancels in q and k
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
        max_position_embeddings=2048))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    path = tmp_path_factory.mktemp("qwen3_bias")
    model.eval().save_pretrained(path)
    return path


def test_biased_attention_matches_transformers(qwen3_bias_dir) -> None:
    hf, ours = _hf(qwen3_bias_dir), load_model(qwen3_bias_dir)
    assert not ours.model.layers[0].self_attn.scale_free
    tokens = torch.randint(0, 128, (23,))
    layout = build_layout([23], [], [])
    with torch.no_grad():
        logits = ours.logits(ours(ours.model.embed_tokens(tokens), layout.positions, layout))
        assert (logits - hf(tokens[None]).logits[0]).abs().max().item() < 1e-4


def test_training_path_gives_the_inference_logits(qwen3_dir) -> None:
    # autograd runs the out-of-place norm / rotary steps and plain F.linear
    model = load_model(qwen3_dir)
    tokens = torch.randint(0, 128, (19,))
    layout = build_layout([12], [0, 0], [4, 3])
    with torch.no_grad():
        ref = model(model.model.embed_tokens(tokens), layout.positions, layout)
    out = model(model.model.embed_tokens(tokens), layout.positions, layout)
    assert out.requires_grad
    assert (out - ref).abs().max().item() < 1e-5


def _assert_readout_rows(model, tokens, layout, readout, last) -> None:  # noqa: ANN001
    # a read-out forward returns exactly the full forward's rows ``last``
    with torch.no_grad():
        embeds = model.model.embed_tokens(tokens)
        full = model(embeds, layout.positions, layout)
        part = model(embeds, layout.positions, layout, readout=readout)
    assert part.shape == (len(last), full.shape[1])
    assert (part - full[last]).abs().max() < 1e-5


@pytest.mark.parametrize("arch", ["qwen3_dir", "llama_dir", "qwen3_bias_dir"])
def test_readout_returns_the_same_rows_as_a_full_forward(
    arch: str, request: pytest.FixtureRequest
) -> None:
    from genrec.model.layout import branch_last_readout

    model = load_model(request.getfixturevalue(arch))
    lens = [3, 1, 5, 2]
    layout = build_layout([7, 4], [0, 0, 1, 1], lens)
    tokens = torch.randint(0, 128, (layout.num_tokens,))
    last = torch.tensor([7 + 2, 7 + 3, 7 + 4 + 4 + 5 - 1, 7 + 4 + 4 + 5 + 1])
    readout = branch_last_readout([7, 4], [0, 0, 1, 1], lens, last, branch_cap=5)
    _assert_readout_rows(model, tokens, layout, readout, last)


# q of the read rows alone (few rows read) or q of every row (many)
@pytest.mark.parametrize("lens", [[7, 1, 4], [2, 1, 2]])
def test_prefix_readout_returns_each_prompts_last_row(qwen3_dir, lens: list[int]) -> None:
    from genrec.model.layout import Readout, prefix_last_layout

    model = load_model(qwen3_dir)
    layout = build_layout(lens, [], [], prefix_cap=9)
    tokens = torch.randint(0, 128, (layout.num_tokens,))
    last = torch.cumsum(torch.tensor(lens), 0) - 1
    readout = Readout(last, prefix_last_layout(lens, prefix_cap=layout.prefix_cap))
    _assert_readout_rows(model, tokens, layout, readout, last)
    with pytest.raises(ValueError, match="non-empty"):
        prefix_last_layout([3, 0], prefix_cap=9)


def test_bf16_model_keeps_fp32_rotary_frequencies(qwen3_dir) -> None:
    from transformers import AutoModelForCausalLM

    bf16 = load_model(qwen3_dir, dtype="bfloat16")
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (200,))
    layout = build_layout([200], [], [])
    with torch.no_grad():
        ours = bf16.logits(bf16(bf16.model.embed_tokens(ids), layout.positions, layout))
        ref = hf(ids[None]).logits[0]
    assert bf16.rotary.inv_freq(torch.device("cpu")).dtype == torch.float32
    assert (ours - ref).abs().max() < 0.1 * ref.abs().max()


def test_dropout_applies_only_in_training_mode(qwen3_dir) -> None:
    model = load_model(qwen3_dir)
    layout = build_layout([6], [0, 0], [3, 2])
    embeds = model.model.embed_tokens(torch.randint(0, 128, (11,))).detach()
    with torch.no_grad():
        plain = model.eval()(embeds, layout.positions, layout)
        model.set_dropout(0.3)
        assert (model(embeds, layout.positions, layout) - plain).abs().max() < 1e-6
        model.train()
        torch.manual_seed(0)
        dropped = model(embeds, layout.positions, layout)
        model.set_dropout(0.0)
        undropped = model(embeds, layout.positions, layout)
    assert (dropped - plain).abs().max() > 1e-3
    assert (undropped - plain).abs().max() < 1e-5
    with pytest.raises(ValueError, match="dropout"):
        model.set_dropout(1.0)
