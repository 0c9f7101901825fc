#!/usr/bin/env bash
# How long a checkpoint save blocks training, synchronous vs --async-save, for GPT-2 124M shapes
# (12 layers, hidden 768, 12 heads, GPT-2 vocabulary: 124M parameters, 1.49 GB of FP32 weights and
# Adam moments per checkpoint), one process. Short sequences keep the iterations cheap; the
# checkpoint size does not depend on them. Prints the "training blocked" lines of both runs and
# the background write time. Usage: bench/ckpt_save_blocking.sh [build/tools/trident] [workdir]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/tools/trident}
work=${2:-$(mktemp -d /tmp/trident_ckpt_bench.XXXXXX)}
data=${TRIDENT_DATA:-../shared/data}
common=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 64
  --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 1 --train-iters 6
  --lr 1e-4 --lr-warmup-iters 1 --log-interval 1 --eval-iters 0 --eval-interval 1000
  --peak-tflops 1 --save-interval 2 --split 100,0,0
  --tokenizer-type GPT2BPETokenizer --vocab-file "$data/tokenizers/gpt2/gpt2-vocab.json"
  --merge-file "$data/tokenizers/gpt2/gpt2-merges.txt"
  --data-path "$data/megatron/meg-gpt2-openwebtext_text_document" --data-cache-path "$work/cache")
for mode in sync async; do
  rm -rf "$work/ckpt_$mode"
  extra=()
  [ "$mode" = async ] && extra=(--async-save)
  "$bin" train "${common[@]}" "${extra[@]}" --save "$work/ckpt_$mode" > "$work/$mode.log" 2>&1
  echo "== $mode"
  grep -E "training blocked|in the background|elapsed time per iteration" "$work/$mode.log" |
    sed -E 's/^.*\] //' | sed -E 's/\| throughput.*//'
done
rm -rf "$work"/ckpt_*
