"""An independent check of the trainer on bench/qa_lookup.sh's task, in PyTorch
(Debian's python3-torch): the QA model's shape (4 layers, 128 wide, 4 heads,
ff 352, tied 4096-token vocabulary, RoPE, SwiGLU), AdamW (0.9, 0.95, decay
0.1 on matrices), clipping 1, warmup 100 then cosine to 10%, batch 32, loss
on every token. The sequences have the structure of the engine's prompts
with ids of their own: BOS, a 10-token system text, k facts "A r B \\n"
(names from a pool of 1000, relations from 20, k uniform in K_MIN..9, the
asked fact among them), "Question: What is the r' of A ? \\n Answer :"
(r' the question's word for r, a token of its own as in the engine's
vocabulary), then the answer, "\\n" and EOS. Prints the training loss and
held-out exact match of the answer (argmax) with 1, 3 and 9 facts.

    python3 bench/lookup_torch.py [STEPS] [K_MIN] [LR] [THREADS]
"""
import math
import random
import sys
import time

import torch
import torch.nn.functional as F

from train_torch import rms, rope

V, D, LAYERS, HEADS, FF = 4096, 128, 4, 4, 352
HD = D // HEADS
NAMES, RELS, QWORDS = range(1000, 2000), range(100, 120), range(200, 220)
BOS, EOS, NL, SYSTEM = 1, 2, 3, list(range(10, 20))
QUESTION, OF, QMARK, ANSWER = [21, 22, 23, 24], 25, 26, [27, 28]


def example(rng, k):
    rels = rng.sample(range(len(RELS)), k)
    names = rng.sample(NAMES, k + 1)
    topic, asked = names[0], rng.randrange(k)
    toks = [BOS] + SYSTEM
    for i, r in enumerate(rels):
        toks += [topic, RELS[r], names[1 + i], NL]
    toks += QUESTION + [QWORDS[rels[asked]], OF, topic, QMARK, NL] + ANSWER
    return toks + [names[1 + asked], NL, EOS], len(toks)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = torch.nn.Parameter(torch.ones(D))
        self.ffn_norm = torch.nn.Parameter(torch.ones(D))

        def linear(i, o):
            m = torch.nn.Linear(i, o, bias=False)
            torch.nn.init.normal_(m.weight, std=0.02)  # as `depcache model new`
            return m

        self.wq, self.wk, self.wv, self.wo = (linear(D, D) for _ in range(4))
        self.gate, self.up, self.down = linear(D, FF), linear(D, FF), linear(FF, D)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    k_min = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    lr = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    torch.manual_seed(1)
    embd = torch.nn.Parameter(torch.randn(V, D) * 0.02)
    blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
    out_norm = torch.nn.Parameter(torch.ones(D))
    params = [embd, out_norm] + list(blocks.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    T = 64
    freq = 10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float32) / HD)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    mask = torch.full((T, T), float("-inf")).triu(1)

    def forward(tokens):
        b, t = tokens.shape
        x = embd[tokens]
        for blk in blocks:
            h = rms(x, blk.attn_norm)
            q, k, v = (w(h).view(b, t, HEADS, HD).transpose(1, 2) for w in (blk.wq, blk.wk, blk.wv))
            q, k = rope(q, cos[:t], sin[:t]), rope(k, cos[:t], sin[:t])
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD) + mask[:t, :t], dim=-1)
            x = x + blk.wo((att @ v).transpose(1, 2).reshape(b, t, D))
            h = rms(x, blk.ffn_norm)
            x = x + blk.down(F.silu(blk.gate(h)) * blk.up(h))
        return rms(x, out_norm) @ embd.t()

    def batch(examples):
        width = max(len(e[0]) for e in examples)
        tokens = torch.tensor([e[0] + [EOS] * (width - len(e[0])) for e in examples])
        targets = torch.tensor([e[0][1:] + [-100] * (width - len(e[0]) + 1) for e in examples])
        return tokens, targets

    held = {k: [example(random.Random(9000 + k * 1000 + i), k) for i in range(200)] for k in (1, 3, 9)}
    rng = random.Random(1)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        warm = min(1.0, step / 100)
        decay = 0.1 + 0.45 * (1 + math.cos(math.pi * max(0, step - 100) / max(1, steps - 100)))
        for g in opt.param_groups:
            g["lr"] = lr * warm * (decay if step > 100 else 1.0)
        tokens, targets = batch([example(rng, rng.randint(k_min, 9)) for _ in range(32)])
        loss = F.cross_entropy(forward(tokens).reshape(-1, V), targets.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 250 == 0 or step == steps:
            with torch.no_grad():
                em = []
                for k in (1, 3, 9):
                    tokens, _ = batch(held[k])
                    logits = forward(tokens)
                    at = torch.tensor([e[1] for e in held[k]])
                    rows = torch.arange(len(held[k]))
                    em.append((logits[rows, at - 1].argmax(-1) == tokens[rows, at]).float().mean().item())
            print(f"step {step}: loss {loss.item():.3f}, exact match with 1/3/9 facts "
                  f"{100 * em[0]:.1f}% / {100 * em[1]:.1f}% / {100 * em[2]:.1f}% "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
