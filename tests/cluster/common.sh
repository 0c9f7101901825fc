# Shared by the cluster tests (sourced): a tiny corpus, the tiny model's flags, loss comparison.
# Every test runs `trident train` with the same model so runs in different layouts and under
# different launchers can be compared loss by loss.

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

# make_corpus DIR: DIR/corpus_text_document.{bin,idx}, 200 documents of ids < 300 with structure
# (runs of increasing ids with noise) so the loss falls.
make_corpus() {
  local dir=$1
  python3 - "$dir/corpus.jsonl" <<'PY'
import json, random, sys
r = random.Random(3)
with open(sys.argv[1], "w") as f:
    for doc in range(200):
        t = r.randrange(300); ids = []
        for _ in range(30 + doc % 23):
            ids.append(r.randrange(300) if r.randrange(4) == 0 else t); t = (t + 1) % 300
        f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
PY
  "$TRIDENT" preprocess --input "$dir/corpus.jsonl" --output-prefix "$dir/corpus" \
    --tokenizer-type NullTokenizer --vocab-size 300 --append-eod >/dev/null
}

# train_args DIR NAME ITERS: the flags of one run writing DIR/NAME.jsonl (FP32, tiny GPT).
train_args() {
  local dir=$1 name=$2 iters=${3:-6}
  echo train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
    --micro-batch-size 2 --global-batch-size 16 --train-iters "$iters" --lr 3e-3 \
    --lr-warmup-iters 2 --clip-grad 1.0 --adam-eps 1e-5 --init-method-std 0.05 --seed 9 \
    --tokenizer-type NullTokenizer --vocab-size 300 --make-vocab-size-divisible-by 32 \
    --split 98,2,0 --data-path "$dir/corpus_text_document" --data-cache-path "$dir/cache" \
    --log-interval 1 --eval-interval 1000 --eval-iters 0 --peak-tflops 1 \
    --metrics-jsonl "$dir/$name.jsonl"
}

# same_losses A.jsonl B.jsonl [REL]: every iteration's lm_loss within REL (default 1e-6)
# relative, the same number of iterations (at least 2), and the loss falls.
same_losses() {
  python3 - "$1" "$2" "${3:-1e-6}" <<'PY'
import json, sys
def losses(p):
    return [j["lm_loss"] for j in map(json.loads, open(p)) if "split" not in j]
a, b, rel = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
if len(a) < 2 or len(a) != len(b):
    sys.exit(f"iteration counts differ or too few: {len(a)} vs {len(b)}")
for i, (x, y) in enumerate(zip(a, b)):
    if abs(x - y) > rel * abs(x):
        sys.exit(f"iteration {i + 1}: loss {y!r} vs {x!r} (rel {abs(x - y) / abs(x):.2e} > {rel})")
if not a[-1] < a[0]:
    sys.exit(f"the loss did not fall: {a}")
print(f"same losses over {len(a)} iterations ({a[0]:.6f} -> {a[-1]:.6f}), within {rel} relative")
PY
}
