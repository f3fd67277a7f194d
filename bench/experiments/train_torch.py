"""The same training step as bench_train.cpp in PyTorch (Debian's python3-torch):
a Llama block stack (RMSNorm, RoPE on adjacent pairs, causal attention,
SwiGLU, tied embeddings) on random tokens, AdamW, clipping; prints tokens/s.

    python3 bench/experiments/train_torch.py EMBD LAYERS HEADS FF BATCH LEN [THREADS] [STEPS] [VOCAB]
"""
import math
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.wq = torch.nn.Linear(d, d, bias=False)
        self.wk = torch.nn.Linear(d, d, bias=False)
        self.wv = torch.nn.Linear(d, d, bias=False)
        self.wo = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)


def rms(x, g, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope(x, cos, sin):
    # x: (B, H, T, hd); pairs (2i, 2i+1) turn by the angle of their position.
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def main():
    d, layers, heads, ff, batch, length = (int(a) for a in sys.argv[1:7])
    threads = int(sys.argv[7]) if len(sys.argv) > 7 else 2
    steps = int(sys.argv[8]) if len(sys.argv) > 8 else 10
    vocab = int(sys.argv[9]) if len(sys.argv) > 9 else 1024
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    hd = d // heads
    embd = torch.nn.Parameter(torch.randn(vocab, d) * 0.02)
    blocks = torch.nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
    out_norm = torch.nn.Parameter(torch.ones(d))
    params = [embd, out_norm] + list(blocks.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    pos = torch.arange(length, dtype=torch.float32)
    freq = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = pos[:, None] * freq[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    mask = torch.full((length, length), float("-inf")).triu(1)
    tokens = torch.randint(0, vocab, (batch, length))

    def step():
        x = embd[tokens]
        for b in blocks:
            h = rms(x, b.attn_norm)
            q = b.wq(h).view(batch, length, heads, hd).transpose(1, 2)
            k = b.wk(h).view(batch, length, heads, hd).transpose(1, 2)
            v = b.wv(h).view(batch, length, heads, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
            x = x + b.wo((att @ v).transpose(1, 2).reshape(batch, length, d))
            h = rms(x, b.ffn_norm)
            x = x + b.down(F.silu(b.gate(h)) * b.up(h))
        logits = rms(x, out_norm) @ embd.t()
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = time.perf_counter() - t0
    print(f"torch {torch.__version__}: {steps} steps of {batch}x{length} in {dt:.2f} s: "
          f"{steps * batch * length / dt:.0f} tokens/s ({threads} threads)")


if __name__ == "__main__":
    main()
