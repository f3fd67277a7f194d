"""An independent check of the trainer on bench/experiments/qa_lookup.sh's task, in PyTorch
(Debian's python3-torch), and a workbench for what makes the lookup learnable.

Defaults: the QA model's shape (4 layers, 128 wide, 4 heads, ff 352, tied
4096-token vocabulary, RoPE, SwiGLU), AdamW (0.9, 0.95, decay 0.1 on
matrices), clipping 1, warmup 100 then cosine to 10%, batch 32, loss on
every token. The default form has the structure of the engine's prompts
with ids of its own: BOS, a 10-token system text, k facts "A r B \\n"
(names from a pool, relations from 20, k uniform in K_MIN..9, the asked
fact among them), "Question: What is the r' of A ? \\n Answer :" (r' the
question's word for r, a token of its own as in the engine's vocabulary),
then the answer and "\\n"; EOS ends the sequence. `--form pairs` is bare
associative recall instead: k pairs "r B", then each asked relation
followed by its answer; `--separators`, `--topic` and `--question-prefix N`
add the QA form's parts to it one at a time. `--questions N` asks N of the
k facts (each once) in one sequence; `--answer-loss-only` keeps the loss on
the answers alone.
Prints the training loss and held-out exact match of every answer (argmax)
with 1, 3 and 9 facts.

    python3 bench/experiments/lookup_torch.py [--steps 1500] [--k-min 1] [--lr 3e-3] [--threads 2] [--seed 1]
        [--layers 4] [--embd 128] [--heads 4] [--ff 352] [--vocab 4096] [--names 1000]
        [--form facts|pairs] [--questions 1] [--answer-loss-only]
        [--separators] [--topic] [--question-prefix N]
"""
import argparse
import math
import random
import time

import torch
import torch.nn.functional as F

from train_torch import rms, rope

BOS, EOS, NL, SYSTEM = 1, 2, 3, list(range(10, 20))
QUESTION, OF, QMARK, ANSWER = [21, 22, 23, 24], 25, 26, [27, 28]
RELS, QWORDS, FIRST_NAME = range(100, 120), range(200, 220), 1000


def options():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--k-min", type=int, default=1, help="fewest facts in a training context")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1, help="seed of the initial weights")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=352)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--names", type=int, default=1000, help="size of the name pool")
    p.add_argument("--form", choices=("facts", "pairs"), default="facts")
    p.add_argument("--questions", type=int, default=1, help="facts asked per sequence")
    p.add_argument("--answer-loss-only", action="store_true")
    p.add_argument("--separators", action="store_true", help="pairs form: \\n after every pair")
    p.add_argument("--topic", action="store_true", help="pairs form: the topic name before every pair")
    p.add_argument("--question-prefix", type=int, default=0, choices=range(5),
                   help="pairs form: this many fixed tokens before each asked relation")
    o = p.parse_args()
    if not 1 <= o.k_min <= 9 or o.questions < 1 or o.embd % o.heads:
        p.error("need 1 <= --k-min <= 9, --questions >= 1 and --embd divisible by --heads")
    if o.form == "facts" and (o.separators or o.topic or o.question_prefix):
        p.error("--separators, --topic and --question-prefix need --form pairs")
    if FIRST_NAME + o.names > o.vocab:
        p.error(f"--vocab must exceed {FIRST_NAME} + --names")
    return o


def example(rng, k, o):
    """One sequence and the positions of its answer tokens."""
    rels = rng.sample(range(len(RELS)), k)
    names = rng.sample(range(FIRST_NAME, FIRST_NAME + o.names), k + 1)
    topic, asked = names[0], rng.sample(range(k), min(o.questions, k))
    toks, answers = [BOS], []
    if o.form == "pairs":
        for i, r in enumerate(rels):
            toks += [topic] * o.topic + [RELS[r], names[1 + i]] + [NL] * o.separators
        for j in asked:
            toks += QUESTION[:o.question_prefix] + [RELS[rels[j]]]
            answers.append(len(toks))
            toks.append(names[1 + j])
        return toks + [EOS], answers
    toks += SYSTEM
    for i, r in enumerate(rels):
        toks += [topic, RELS[r], names[1 + i], NL]
    for j in asked:
        toks += QUESTION + [QWORDS[rels[j]], OF, topic, QMARK, NL] + ANSWER
        answers.append(len(toks))
        toks += [names[1 + j], NL]
    return toks + [EOS], answers


class Block(torch.nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))

        def linear(i, o):
            m = torch.nn.Linear(i, o, bias=False)
            torch.nn.init.normal_(m.weight, std=0.02)  # as `depcache model new`
            return m

        self.wq, self.wk, self.wv, self.wo = (linear(d, d) for _ in range(4))
        self.gate, self.up, self.down = linear(d, ff), linear(d, ff), linear(ff, d)


def main():
    o = options()
    torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    d, hd = o.embd, o.embd // o.heads
    embd = torch.nn.Parameter(torch.randn(o.vocab, d) * 0.02)
    blocks = torch.nn.ModuleList(Block(d, o.ff) for _ in range(o.layers))
    out_norm = torch.nn.Parameter(torch.ones(d))
    params = [embd, out_norm] + list(blocks.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=o.lr, betas=(0.9, 0.95))
    freq = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)

    def forward(tokens):
        b, t = tokens.shape
        ang = torch.arange(t, dtype=torch.float32)[:, None] * freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = embd[tokens]
        for blk in blocks:
            h = rms(x, blk.attn_norm)
            q, k, v = (w(h).view(b, t, o.heads, hd).transpose(1, 2) for w in (blk.wq, blk.wk, blk.wv))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
            x = x + blk.wo((att @ v).transpose(1, 2).reshape(b, t, d))
            h = rms(x, blk.ffn_norm)
            x = x + blk.down(F.silu(blk.gate(h)) * blk.up(h))
        return rms(x, out_norm) @ embd.t()

    def batch(examples):
        width = max(len(e[0]) for e in examples)
        tokens = torch.tensor([e[0] + [EOS] * (width - len(e[0])) for e in examples])
        if o.answer_loss_only:
            targets = torch.full((len(examples), width), -100)
            for row, (toks, answers) in enumerate(examples):
                for at in answers:
                    targets[row, at - 1] = toks[at]
        else:
            targets = torch.tensor([e[0][1:] + [-100] * (width - len(e[0]) + 1) for e in examples])
        return tokens, targets

    held = {k: [example(random.Random(9000 + k * 1000 + i), k, o) for i in range(200)] for k in (1, 3, 9)}
    rng = random.Random(1)
    t0 = time.perf_counter()
    for step in range(1, o.steps + 1):
        warm = min(1.0, step / 100)
        decay = 0.1 + 0.45 * (1 + math.cos(math.pi * max(0, step - 100) / max(1, o.steps - 100)))
        for g in opt.param_groups:
            g["lr"] = o.lr * warm * (decay if step > 100 else 1.0)
        tokens, targets = batch([example(rng, rng.randint(o.k_min, 9), o) for _ in range(32)])
        loss = F.cross_entropy(forward(tokens).reshape(-1, o.vocab), targets.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 250 == 0 or step == o.steps:
            with torch.no_grad():
                em = []
                for k in (1, 3, 9):
                    tokens, _ = batch(held[k])
                    predicted = forward(tokens).argmax(-1)
                    hits = [bool(predicted[row, at - 1] == toks[at])
                            for row, (toks, answers) in enumerate(held[k]) for at in answers]
                    em.append(100 * sum(hits) / len(hits))
            print(f"step {step}: loss {loss.item():.3f}, exact match with 1/3/9 facts "
                  f"{em[0]:.1f}% / {em[1]:.1f}% / {em[2]:.1f}% "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
