#!/usr/bin/env bash
# --offload-optimizer nvme: peak resident memory and step time with and without it, at GPT-2 124M
# and 350M shapes (hidden 768 / 1024, GPT-2 vocabulary, 12 / 24 layers; short sequences and one
# sample per step keep a step cheap on a small CPU: the offload's cost is per parameter, not per
# token), one process, against the offload disk's sequential bandwidth (trident_disk_bandwidth).
# Usage: bench/offload/offload_bench.sh [build] [offload dir] [layers of the 350M shape]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
disk=${2:-$(mktemp -d /tmp/trident_offload_bench.XXXXXX)}
layers350=${3:-24}
data=${TRIDENT_DATA:-../shared/data}
work=$(mktemp -d /tmp/trident_offload_work.XXXXXX)
echo "== disk bandwidth of $disk (O_DIRECT, 1 GiB)"
"$build/bench/offload/trident_disk_bandwidth" --dir "$disk" --mib 1024
common=(--seq-length 64 --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 1
  --train-iters 6 --lr 1e-4 --lr-warmup-iters 1 --log-interval 1 --eval-iters 0
  --eval-interval 1000 --peak-tflops 1 --split 100,0,0
  --tokenizer-type GPT2BPETokenizer --vocab-file "$data/tokenizers/gpt2/gpt2-vocab.json"
  --merge-file "$data/tokenizers/gpt2/gpt2-merges.txt"
  --data-path "$data/megatron/meg-gpt2-openwebtext_text_document" --data-cache-path "$work/cache")
echo
echo "| shape | offload | peak RSS MiB | step ms (iterations 3-6) | offload update ms | I/O wait ms | read MiB/s | write MiB/s |"
echo "|---|---|---|---|---|---|---|---|"
for shape in 124M 350M; do
  if [ "$shape" = 124M ]; then model=(--num-layers 12 --hidden-size 768 --num-attention-heads 12)
  else model=(--num-layers "$layers350" --hidden-size 1024 --num-attention-heads 16); fi
  for mode in none nvme; do
    extra=(--offload-optimizer "$mode")
    [ "$mode" = nvme ] && extra+=(--offload-path "$disk")
    log="$work/$shape-$mode.log"
    /usr/bin/time -f "maxrss_kb %M" "$build/tools/trident" train "${common[@]}" "${model[@]}" \
      "${extra[@]}" --metrics-jsonl "$work/$shape-$mode.jsonl" > "$log" 2>&1
    /usr/bin/python3 - "$work/$shape-$mode.jsonl" "$log" "$shape" "$mode" <<'PY'
import json, sys, re
rows = [json.loads(l) for l in open(sys.argv[1]) if "split" not in l]
rows = [r for r in rows if r["iteration"] >= 3]
rss = int(re.search(r"maxrss_kb (\d+)", open(sys.argv[2]).read()).group(1)) / 1024
mean = lambda k: sum(r.get(k, 0) for r in rows) / len(rows)
print(f"| {sys.argv[3]} | {sys.argv[4]} | {rss:.0f} | {mean('iter_ms'):.0f} | "
      f"{mean('offload_update_ms'):.0f} | {mean('offload_io_wait_ms'):.0f} | "
      f"{mean('offload_read_mib_per_s'):.0f} | {mean('offload_write_mib_per_s'):.0f} |")
PY
  done
  grep -h "parameters$\|offload: Adam\|memory per rank (" "$work/$shape-nvme.log" | sed -E 's/^.*\] //'
done
rm -rf "$work"
