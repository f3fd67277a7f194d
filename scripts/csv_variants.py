#!/usr/bin/env python3
"""Rewrites CSV-form QA requests into easier variants, for training.

A question over G-Retriever's CSV ("What is the r of A?") takes a chain of
lookups: A's node id, the edge row of that id and relation r, its target id,
that id's node row. A small model trained on the question alone names one of
A's neighbours at random and stays there: while the first lookup cannot
tell the edge rows apart, the last one is asked for an average of their
targets, and neither link gets a clean signal to learn from. A context with
the asked edge as its only edge row (the node rows all kept) takes the edge
lookup away, so the target id -> name link is learned alone; with it in
place, contexts of two and then all edge rows teach the relation to pick the
row. Shorter forms of the question bring its relation next to the answer.

Each request is written once, as the variant its line number picks from
--variants (request i: item i mod the list's length). An item is EDGES or
EDGES+FORM:
  EDGES  1     the asked edge alone (every node row kept)
         2     the asked edge and one other
         half  the asked edge and half of the others
         all   every edge row
         src   the asked edge and one edge of each other source, given the
               asked relation: only the asked name's id picks the row
  FORM   words the request's own question (default)
         short "r?"
         mid   "r of A?"
         edge  an edge-row drill in place of the question ("5,r," -> its
               target id), over one of the context's edge rows
A request whose asked edge is not found in its context (no edge row from the
asked name by a relation the question names to the answer) is written as it
is; the count is printed.

usage: csv_variants.py IN.jsonl OUT.jsonl --variants 1,2,all [--seed N]
"""
import argparse
import json
import random
import sys
from collections import Counter

from csv_drills import parse_csv_context

EDGES = {"1", "2", "half", "all", "src"}
FORMS = {"words", "short", "mid", "edge"}


def parse_variant(item):
    edges, _, form = item.partition("+")
    form = form or "words"
    if edges not in EDGES or form not in FORMS:
        raise argparse.ArgumentTypeError(f"unknown variant {item!r}: EDGES in {sorted(EDGES)}, FORM in {sorted(FORMS)}")
    return edges, form


def asked_edge(request, names, edges):
    """The one edge the question asks, or None."""
    answers = set(request["answers"])
    question = request["question"]
    found = [e for e in edges
             if e[0] in names and e[2] in names and names[e[2]] in answers
             and f" {e[1]} " in f" {question} " and names[e[0]] in question]
    return found[0] if len(found) == 1 else None


def render(names, edges):
    nodes = "".join(f"{node},{names[node]}\n" for node in sorted(names))
    rows = "".join(f"{src},{rel},{dst}\n" for src, rel, dst in edges)
    return f"node_id,node_attr\n{nodes}\nsrc,edge_attr,dst\n{rows}"


def variant(request, rng, edges_kept, form):
    parsed = parse_csv_context(request["text"])
    if parsed is None:
        raise ValueError(f"request {request.get('id')}: its context is not in CSV form")
    names, edges = parsed
    asked = asked_edge(request, names, edges)
    if asked is None:
        return None
    src, rel, _ = asked
    if edges_kept == "src":
        by_source = {}
        for e in edges:
            if e[0] != src:
                by_source.setdefault(e[0], []).append(e)
        kept = {asked} | {(s, rel, rng.choice(es)[2]) for s, es in by_source.items()}
        edges = sorted(kept)
    else:
        others = [e for e in edges if e != asked]
        keep = {"1": 0, "2": 1, "half": len(others) // 2, "all": len(others)}[edges_kept]
        kept = set(rng.sample(others, min(keep, len(others)))) | {asked}
        edges = [e for e in edges if e in kept]  # in the context's own order
    out = dict(request)
    out["text"] = render(names, edges)
    if form == "short":
        out["question"] = f"{rel}?"
    elif form == "mid":
        out["question"] = f"{rel} of {names[src]}?"
    elif form == "edge":
        count = Counter((s, r) for s, r, _ in edges)
        s, r, d = rng.choice([e for e in edges if count[(e[0], e[1])] == 1])
        out["question"] = f"{s},{r},"
        out["answers"] = [str(d)]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--variants", required=True, help="comma-separated EDGES[+FORM] items, taken in turn")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        variants = [parse_variant(v) for v in a.variants.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    rng = random.Random(a.seed)
    written = unchanged = 0
    with open(a.input) as fin, open(a.output, "w") as fout:
        for i, line in enumerate(fin):
            if not line.strip():
                continue
            request = json.loads(line)
            out = variant(request, rng, *variants[i % len(variants)])
            if out is None:
                out, unchanged = request, unchanged + 1
            fout.write(json.dumps(out) + "\n")
            written += 1
    print(f"{written} requests ({unchanged} as they were: asked edge not found)", file=sys.stderr)


if __name__ == "__main__":
    main()
