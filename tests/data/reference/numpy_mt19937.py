"""Writes numpy.random.RandomState outputs for tests/data/mt19937_test.cc.

Usage: python3 numpy_mt19937.py OUT_DIR

Writes OUT_DIR/manifest.json, a list of cases, and one .npy file per case:
  {"kind": "shuffle", "seed": S, "dtype": "int32"|"uint32"|"int64", "lengths": [n1, n2, ...],
   "file": F}  -- arange(n_k) shuffled by one RandomState(S), one after another, concatenated
  {"kind": "raw32", "seed": S, "count": N, "file": F}
      -- RandomState(S).randint(0, 2**32, N, dtype=uint32): the raw 32-bit outputs
  {"kind": "interval", "seed": S, "max": M, "count": N, "file": F}
      -- RandomState(S).randint(0, M + 1, N, dtype=int64): legacy masked rejection on 64-bit
         draws (the random_interval path shuffles of more than 2^32 elements would take)
"""
import json
import os
import sys

import numpy

SEEDS = [0, 1, 1234, 2**31 - 1, 2**32 - 1]
LENGTHS = [[0], [1], [2], [3], [17], [1000], [70001], [5, 9, 1000, 1]]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cases = []
    for seed in SEEDS:
        for dtype in ["int32", "uint32", "int64"]:
            for lengths in LENGTHS:
                rs = numpy.random.RandomState(seed)
                parts = []
                for n in lengths:
                    a = numpy.arange(n, dtype=dtype)
                    rs.shuffle(a)
                    parts.append(a)
                name = f"shuffle-{seed}-{dtype}-{'_'.join(map(str, lengths))}.npy"
                numpy.save(os.path.join(out, name), numpy.concatenate(parts))
                cases.append(
                    {"kind": "shuffle", "seed": seed, "dtype": dtype, "lengths": lengths,
                     "file": name}
                )
        name = f"raw32-{seed}.npy"
        numpy.save(
            os.path.join(out, name),
            numpy.random.RandomState(seed).randint(0, 2**32, 2000, dtype=numpy.uint32),
        )
        cases.append({"kind": "raw32", "seed": seed, "count": 2000, "file": name})
        for max_value in [5 * 2**32 + 7, 2**40 - 1, 2**62 + 12345]:
            name = f"interval-{seed}-{max_value}.npy"
            numpy.save(
                os.path.join(out, name),
                numpy.random.RandomState(seed).randint(0, max_value + 1, 500, dtype=numpy.int64),
            )
            cases.append(
                {"kind": "interval", "seed": seed, "max": max_value, "count": 500, "file": name}
            )
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"numpy_version": numpy.__version__, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
