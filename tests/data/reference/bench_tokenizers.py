#!/usr/bin/env python3
"""Encoding speed of trident's GPT2BPETokenizer vs Hugging Face `tokenizers`, same text, one run.

The corpus is every paragraph (blank-line-separated block) of the 13 Gutenberg books in
shared/data/english/gutenberg (6 MB), decoded as UTF-8 with errors="replace" and written as JSON
lines. trident runs `trident preprocess --workers 1` (JSON parsing and .bin/.idx writing included)
and `--workers 2`; HF encodes the same documents with one thread, one call per document and in
encode_batch. Both start with empty BPE caches. Token counts must agree, or the script fails.

  bench_tokenizers.py --trident build/tools/trident [--shared ../shared/data] [--vocab V --merges M]

Prints tokens/s (wall clock) and tokens per CPU second for each.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # HF: one thread (set before tokenizers is imported)
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def corpus(shared):
    folder = os.path.join(shared, "english", "gutenberg")
    docs = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            text = f.read().decode("utf-8", errors="replace").replace("\r\n", "\n")
        docs += [b.strip("\n") for b in re.split(r"\n[ \t]*\n", text) if b.strip()]
    return docs


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_trident(binary, jsonl, vocab, merges, workers, out_dir):
    cpu0, t0 = children_cpu(), time.perf_counter()
    out = subprocess.run([binary, "preprocess", "--input", jsonl, "--output-prefix",
                          os.path.join(out_dir, f"w{workers}"), "--tokenizer-type",
                          "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges,
                          "--workers", str(workers), "--progress-interval", "0"],
                         check=True, capture_output=True, text=True).stdout
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    tokens = int(re.search(r"(\d+) tokens,", out).group(1))
    return tokens, wall, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", default=os.path.join(ROOT, "build", "tools", "trident"))
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--vocab", default=os.path.join(ROOT, "data", "gpt2", "gpt2-vocab.json"))
    ap.add_argument("--merges", default=os.path.join(ROOT, "data", "gpt2", "gpt2-merges.txt"))
    args = ap.parse_args()

    docs = corpus(args.shared)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    print(f"corpus: {len(docs)} documents, {nbytes / 1e6:.2f} MB (Gutenberg paragraphs)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = os.path.join(tmp, "corpus.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        for workers in (1, 2):
            tokens, wall, cpu = run_trident(args.trident, jsonl, args.vocab, args.merges,
                                            workers, tmp)
            rows.append((f"trident preprocess --workers {workers}", tokens, wall, cpu))

    def hf():
        tok = Tokenizer(models.BPE.from_file(args.vocab, args.merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        return tok

    tok = hf()
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = sum(len(tok.encode(d).ids) for d in docs)
    rows.append(("HF tokenizers encode() per document, 1 thread", n,
                 time.perf_counter() - t0, time.process_time() - cpu0))
    tok = hf()
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(docs))
    rows.append(("HF tokenizers encode_batch(), 1 thread", n,
                 time.perf_counter() - t0, time.process_time() - cpu0))

    print(f"{'':48s} {'tokens':>10s} {'seconds':>8s} {'tokens/s':>12s} {'tokens/CPU-s':>13s}")
    for name, tokens, wall, cpu in rows:
        print(f"{name:48s} {tokens:10d} {wall:8.2f} {tokens / wall:12,.0f} {tokens / cpu:13,.0f}")
    if len({r[1] for r in rows}) != 1:
        sys.exit("token counts differ between trident and HF")


if __name__ == "__main__":
    main()
