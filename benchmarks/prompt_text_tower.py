"""Cost of one prompt-learning step through a real-sized CLIP text tower (promptfl / tpfl / atpfl).

RN50's text tower (width 512, 12 layers; random init, as no weights are available offline: the shapes,
hence the time, are OpenAI's), K = 10 clients x C = 10 classes (CIFAR-10's names), 16 context
vectors: forward + backward of ``PromptedText.encode`` with the sequences cut after the last EOS
(what the methods run) and at CLIP's full 77 positions (what an uncut encoder would run).

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prompt_text_tower.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import torch

from fedcache.extract.loading import load_backbone
from fedcache.federate.methods._prompt import PLACEHOLDER, PromptedText

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def seconds_per_step(pt: PromptedText, ctx: torch.Tensor, repeats: int) -> float:
    pt.encode(ctx).sum().backward()  # warm-up
    t = time.perf_counter()
    for _ in range(repeats):
        pt.encode(ctx).sum().backward()
    return (time.perf_counter() - t) / repeats


def uncut(pt: PromptedText, bb, n_ctx: int) -> PromptedText:
    """The same encoder over all 77 positions."""
    tokens = bb.tokenize([" ".join([PLACEHOLDER] * n_ctx) + f" {c}." for c in CLASSES])
    with torch.no_grad():
        emb = bb.model.token_embedding(tokens)
    pt.tokens, pt.prefix, pt.suffix = tokens, emb[:, :1], emb[:, 1 + n_ctx:]
    pt.mask, pt.pos = bb.model.attn_mask, bb.model.positional_embedding
    return pt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=10)
    args = ap.parse_args()
    bb = load_backbone("clip-rn50", random_init=True)
    pt = PromptedText(bb, CLASSES, 16)
    ctx = (torch.randn(args.clients, 16, pt.width) * 0.02).requires_grad_(True)
    cut = seconds_per_step(pt, ctx, args.repeats)
    length = pt.tokens.shape[1]
    full = seconds_per_step(uncut(pt, bb, 16), ctx, args.repeats)
    print(f"{args.clients} clients x {len(CLASSES)} classes, RN50 text tower, forward+backward per step, "
          f"{torch.get_num_threads()} thread(s): cut to {length} positions {cut:.2f}s, 77 positions {full:.2f}s "
          f"({full / cut:.1f}x)")


if __name__ == "__main__":
    main()
