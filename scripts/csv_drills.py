#!/usr/bin/env python3
"""Adds single-lookup questions to CSV-form QA requests, for training.

A question over G-Retriever's CSV ("What is the r of A?") is answered
through a chain: the edge row whose source is A's id and whose relation is r
gives a target id, and that id's node row gives the answer's name. A small
model on the loss plateau learns neither link from the composed question
alone. Each request read here is written with its own context followed by
drills that each take one link:

  node row  "3,"      (words: "What is node 3?")            -> its name
  edge row  "0,r,"    (words: "Which node is the r of A?")  -> the target id
  node id   "node_id of A:"                                 -> A's id
and, with --chains, drills of two links, the halves of the question's chain:
  "node_id of the r of A:"   (A's id, then the edge)        -> the target id
  "What is the r of node 0?" (the edge, then the node row)  -> the target's name
  the request's own question                                -> as it was

The rows form continues the context's own rows, so the key of each lookup
sits right before its answer (for a model whose prompt puts nothing between
the question and the answer): the form a small model learns a lookup in.

Consecutive requests share their context, so `train --pack-shared-context`
reads the context once and every answer after it trains on it. The
request's own question comes first, so no drill's answer is in sight of it
(with --anywhere it stands at a random place among them); with --repeat it is
asked again after the drills.

usage: csv_drills.py IN.jsonl OUT.jsonl [--form rows|words] [--seed N] [--nodes K] [--edges K]
                     [--ids K] [--chains K] [--anywhere] [--repeat]
"""
import argparse
import json
import random
import sys
from collections import Counter


def parse_csv_context(text):
    """Node names by id and (src, relation, dst) edges; None if not CSV form."""
    head, sep, tail = text.partition("\n\nsrc,edge_attr,dst\n")
    if not sep or not head.startswith("node_id,node_attr\n"):
        return None
    names = {}
    for row in head.split("\n")[1:]:
        node, _, name = row.partition(",")
        if not node.isdigit() or not name:
            return None
        names[int(node)] = name
    edges = []
    for row in tail.strip("\n").split("\n"):
        parts = row.split(",")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
            return None
        edges.append((int(parts[0]), parts[1], int(parts[2])))
    return names, edges


def drills(request, rng, n_nodes, n_edges, n_ids=0, form="rows", n_chains=0):
    parsed = parse_csv_context(request["text"])
    if parsed is None:
        raise ValueError(f"request {request.get('id')}: its context is not in CSV form")
    names, edges = parsed
    out = []
    for node in rng.sample(sorted(names), min(n_nodes, len(names))):
        out.append((f"{node}," if form == "rows" else f"What is node {node}?", names[node]))
    # Only edges whose (source, relation) is unique in the context have one answer.
    count = Counter((src, rel) for src, rel, _ in edges)
    unique = [e for e in edges if count[(e[0], e[1])] == 1 and e[0] in names]
    for src, rel, dst in rng.sample(unique, min(n_edges, len(unique))):
        question = f"{src},{rel}," if form == "rows" else f"Which node is the {rel} of {names[src]}?"
        out.append((question, str(dst)))
    # A name -> id drill only where the name is on one node row.
    named = Counter(names.values())
    single = [node for node in sorted(names) if named[names[node]] == 1]
    for node in rng.sample(single, min(n_ids, len(single))):
        out.append((f"node_id of {names[node]}:", str(node)))
    # Not an edge to the request's own answer: given just before, it would be
    # copied rather than looked up.
    answers = set(request["answers"])
    chains = [e for e in unique if e[2] in names and names[e[2]] not in answers]
    for src, rel, dst in rng.sample(chains, min(n_chains, len(chains))):
        if named[names[src]] == 1:
            out.append((f"node_id of the {rel} of {names[src]}:", str(dst)))
        out.append((f"What is the {rel} of node {src}?", names[dst]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--form", choices=["rows", "words"], default="rows", help="how drills are asked")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=4, help="node-row drills per request")
    ap.add_argument("--edges", type=int, default=3, help="edge-row drills per request")
    ap.add_argument("--ids", type=int, default=0, help="name -> node id drills per request")
    ap.add_argument("--chains", type=int, default=0, help="edges asked as the two two-link drills each")
    ap.add_argument("--anywhere", action="store_true",
                    help="the request's question at a random place among the drills, not first")
    ap.add_argument("--repeat", action="store_true", help="ask the request's question again after the drills")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n = 0
    with open(a.input) as fin, open(a.output, "w") as fout:
        for line in fin:
            if not line.strip():
                continue
            request = json.loads(line)
            items = drills(request, rng, a.nodes, a.edges, a.ids, a.form, a.chains)
            rng.shuffle(items)
            own = (request["question"], request["answers"][0])
            items.insert(rng.randrange(len(items) + 1) if a.anywhere else 0, own)
            if a.repeat:
                items.append(own)
            for question, answer in items:
                drill = dict(request)
                drill["id"] = f"{request['id']}.{n}"
                drill["question"] = question
                drill["answers"] = [answer]
                fout.write(json.dumps(drill) + "\n")
                n += 1
    print(f"{n} requests", file=sys.stderr)


if __name__ == "__main__":
    main()
