#!/usr/bin/env bash
# --offload-params nvme (ZeRO-3's FP32 weight shard on disk, read ahead of each layer's gather):
# peak resident memory and step time of one process at ZeRO-3 with the shard in memory, on disk,
# and on disk beside --offload-optimizer nvme, at GPT-2 124M and 350M shapes (hidden 768 / 1024,
# GPT-2 vocabulary, 12 / 24 layers; sequence 64 and one sample per step keep a step cheap on a
# small CPU: the offload's cost is per parameter, not per token), against the disk's sequential
# bandwidth (trident_disk_bandwidth).
# Usage: bench/offload/param_offload_bench.sh [build] [offload dir] [shapes, default "124M 350M"]
#   TRIDENT_BENCH_ITERS  iterations per run (default 6; steps 3 on are averaged)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
disk=${2:-$(mktemp -d /tmp/trident_offload_bench.XXXXXX)}
shapes=${3:-124M 350M}
data=${TRIDENT_DATA:-../shared/data}
work=$(mktemp -d /tmp/trident_offload_work.XXXXXX)
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo "== disk bandwidth of $disk (O_DIRECT, 1 GiB)"
"$build/bench/offload/trident_disk_bandwidth" --dir "$disk" --mib 1024
common=(--zero-stage 3 --seq-length 64 --max-position-embeddings 1024 --micro-batch-size 1
  --global-batch-size 1 --train-iters "${TRIDENT_BENCH_ITERS:-6}" --lr 1e-4 --lr-warmup-iters 1 --log-interval 1
  --eval-iters 0 --eval-interval 1000 --peak-tflops 1 --split 100,0,0
  --tokenizer-type GPT2BPETokenizer --vocab-file "$data/tokenizers/gpt2/gpt2-vocab.json"
  --merge-file "$data/tokenizers/gpt2/gpt2-merges.txt"
  --data-path "$data/megatron/meg-gpt2-openwebtext_text_document" --data-cache-path "$work/cache")
echo
echo "| shape | offload | peak RSS MiB | step ms (iterations 3-6) | streamed step ms | weight reads MiB/iter | waiting for weight reads ms/iter | load avg |"
echo "|---|---|---|---|---|---|---|---|"
for shape in $shapes; do
  if [ "$shape" = 124M ]; then model=(--num-layers 12 --hidden-size 768 --num-attention-heads 12)
  else model=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16); fi
  for mode in none params both; do
    case $mode in
      none) extra=() ;;
      params) extra=(--offload-params nvme --offload-path "$disk") ;;
      both) extra=(--offload-params nvme --offload-optimizer nvme --offload-path "$disk") ;;
    esac
    log="$work/$shape-$mode.log"
    /usr/bin/time -f "maxrss_kb %M" "$build/tools/trident" train "${common[@]}" "${model[@]}" \
      "${extra[@]}" --metrics-jsonl "$work/$shape-$mode.jsonl" > "$log" 2>&1
    /usr/bin/python3 - "$work/$shape-$mode.jsonl" "$log" "$shape" "$mode" <<'PY'
import json, sys, re
rows = [json.loads(l) for l in open(sys.argv[1]) if "split" not in l]
rows = [r for r in rows if r["iteration"] >= 3]
rss = int(re.search(r"maxrss_kb (\d+)", open(sys.argv[2]).read()).group(1)) / 1024
mean = lambda k: sum(r.get(k, 0) for r in rows) / len(rows)
load = open("/proc/loadavg").read().split()[0]
print(f"| {sys.argv[3]} | {sys.argv[4]} | {rss:.0f} | {mean('iter_ms'):.0f} | "
      f"{mean('offload_update_ms'):.0f} | {mean('offload_param_read_mib'):.0f} | "
      f"{mean('offload_param_wait_ms'):.0f} | {load} |")
PY
    grep -h "offload: weight\|memory per rank (" "$log" | sed -E 's/^.*\] //' | sort -u | head -4
  done
done
rm -rf "$work"
