#!/usr/bin/env python3
"""Each pipeline rank's order of passes in one training step, as Megatron-LM runs them.

Follows megatron/core/pipeline_parallel/schedules.py (Megatron-LM commit d98e8a64, Aug 2026):

- get_pp_rank_microbatches: total = m * v passes per rank; warm-up = m * v when forward-only,
  else p - r - 1 without interleaving, else 2 (p - r - 1) + (v - 1) G; capped at the total.
- get_schedule_table: micro-batches in groups of G (the last group takes every remaining one);
  each group runs through chunk 0, then chunk 1, ... Without interleaving the table is
  micro-batches 0 .. m - 1 on chunk 0.
- forward_backward_pipelining_with_interleaving (and _without_interleaving for v = 1): warm-up
  forwards k = 0 .. warm-up - 1; then for k = 0 .. total - warm-up - 1 the forward of table entry
  k + warm-up followed by the k-th backward; then the remaining backwards. The k-th forward runs
  the table's entry k. The k-th backward runs on chunk v - 1 - (the table's chunk at k) and takes
  the micro-batch whose forward on that chunk is the oldest still waiting (Megatron pops
  input_tensors[chunk] from the front), which this script tracks itself rather than assuming.
- Validity (forward_backward_pipelining_with_interleaving): p <= G <= m, and m mod G is 0 or at
  least p.

Writes pipeline_orders.json beside this file: per case (p, v, m, G, forward_only) every rank's
passes, space-separated, as "F<micro-batch>.<chunk>" / "B<micro-batch>.<chunk>" (mt's
parallel::to_string).
tests/unit/parallel/test_pipeline_schedule.cpp requires mt's action lists to equal them.
Standard library only; run by hand: tests/golden/pipeline_orders.py [--check]
"""

import json
import os
import sys

# (p, v, m, G, forward_only). G is only meaningful with v > 1 (written as null otherwise).
CASES = [
    (4, 1, 8, None, False),  # 1F1B, m > p
    (4, 1, 3, None, False),  # 1F1B, m < p: warm-up capped at m
    (2, 2, 4, 2, False),     # interleaved, G = p
    (4, 2, 8, 4, False),     # interleaved, G = p, p = 4
    (2, 2, 8, 4, False),     # interleaved, G > p, m divisible by G
    (2, 2, 5, 3, False),     # interleaved, G > p, m mod G = 2 >= p (Megatron's own example)
    (3, 3, 7, 4, False),     # interleaved, v = 3, m mod G = 3 = p
    (2, 2, 4, 2, True),      # forward only (evaluation)
]


def valid(p, v, m, g):
    if v == 1:
        return True
    return p <= g <= m and (m % g == 0 or m % g >= p)


def schedule_table(m, v, g):
    if v == 1:
        return [(mb, 0) for mb in range(m)]
    table = []
    for first in range(0, m, g):
        end = m if first + g >= m else first + g
        table.extend((mb, chunk) for chunk in range(v) for mb in range(first, end))
    return table


def warmup(p, v, m, g, rank, forward_only):
    total = m * v
    if forward_only:
        return total
    if v == 1:
        count = p - rank - 1
    else:
        count = 2 * (p - rank - 1) + (v - 1) * g
    return min(count, total)


def rank_order(p, v, m, g, rank, forward_only):
    table = schedule_table(m, v, g)
    total = len(table)
    warm = warmup(p, v, m, g, rank, forward_only)
    waiting = [[] for _ in range(v)]  # per chunk: micro-batches forwarded, not yet backwarded
    order = []

    def forward(k):
        mb, chunk = table[k]
        waiting[chunk].append(mb)
        order.append("F%d.%d" % (mb, chunk))

    def backward(k):
        chunk = v - 1 - table[k][1]
        mb = waiting[chunk].pop(0)
        order.append("B%d.%d" % (mb, chunk))

    for k in range(warm):
        forward(k)
    if forward_only:
        return order
    for k in range(total - warm):
        forward(k + warm)
        backward(k)
    for k in range(total - warm, total):
        backward(k)
    return order


def build():
    cases = []
    for p, v, m, g, forward_only in CASES:
        assert valid(p, v, m, g), (p, v, m, g)
        ranks = [rank_order(p, v, m, g, r, forward_only) for r in range(p)]
        for order in ranks:
            assert len(set(order)) == len(order) == m * v * (1 if forward_only else 2)
        cases.append({"p": p, "v": v, "m": m, "G": g, "forward_only": forward_only,
                      "ranks": [" ".join(order) for order in ranks]})
    return {
        "source": "Megatron-LM megatron/core/pipeline_parallel/schedules.py at d98e8a64 "
                  "(get_pp_rank_microbatches, get_schedule_table, the interleaved and 1F1B loops)",
        "generator": "tests/golden/pipeline_orders.py",
        "cases": cases,
    }


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_orders.json")
    text = json.dumps(build(), indent=1) + "\n"
    if sys.argv[1:] == ["--check"]:
        with open(path) as f:
            if f.read() != text:
                sys.exit("pipeline_orders.json differs from what the generator writes")
        return
    if sys.argv[1:]:
        sys.exit("usage: pipeline_orders.py [--check]")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print("wrote %s (%d cases)" % (path, len(CASES)))


if __name__ == "__main__":
    main()
