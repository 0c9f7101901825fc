#!/usr/bin/env bash
# Slurm: a real single-machine cluster (munged, slurmctld, slurmd; tests/cluster/slurm-cluster)
# runs `srun -n 4 trident train` in TP2 x DP2, which must give the same losses as `mpirun -np 4`.
# Also checks which PMI works: Slurm's PMIx plugin (--mpi=pmix) with Debian's Open MPI; --mpi=pmi2
# fails in MPI_Init (Open MPI has no PMI-2 client here). Planned stops (--exit-interval,
# --exit-duration-in-mins, the kill switch, SIGTERM with --exit-signal-handler, the end of
# training) of an sbatch job's srun exit 0 and leave the job COMPLETED (exit code 0:0); two jobs
# chained with --dependency=afterok continue one run (the second resumes from the first's
# checkpoint and gives the uninterrupted run's losses), while a failed job's afterok successor
# never starts (docs/failures-and-recovery.md).
# Usage: slurm_test.sh TRIDENT_CLI
set -euo pipefail
TRIDENT=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"

for b in munged slurmctld slurmd srun; do
  command -v "$b" >/dev/null || fail "$b is not installed (scripts/install-deps installs it)"
done
work=$(mktemp -d /tmp/trident_slurm_test.XXXXXX)
cleanup() { "$here/slurm-cluster" down "$work/slurm" || true; rm -rf "$work"; }
trap cleanup EXIT
"$here/slurm-cluster" up "$work/slurm" 8
source "$work/slurm/env"

make_corpus "$work"
layout=(--tensor-model-parallel-size 2)

mpirun -np 4 "$TRIDENT" $(train_args "$work" mpirun) "${layout[@]}" > "$work/mpirun.log" 2>&1 ||
  { cat "$work/mpirun.log"; fail "mpirun -np 4 trident train failed"; }
TRIDENT_LOG_ALL_RANKS=1 srun -n 4 --mpi=pmix "$TRIDENT" $(train_args "$work" srun) "${layout[@]}" \
  > "$work/srun.log" 2>&1 || { cat "$work/srun.log"; fail "srun -n 4 --mpi=pmix trident train failed"; }
same_losses "$work/mpirun.jsonl" "$work/srun.jsonl" 1e-6 || fail "srun and mpirun losses differ"
# Every rank ran in one world of 4 under srun: the prefix names the rank and the host.
for r in 0 1 2 3; do
  grep -q "\[r$r tp[01] dp[01] pp0 @$(hostname -s)\]" "$work/srun.log" ||
    { cat "$work/srun.log"; fail "no log line of rank $r with its host in the prefix"; }
done
grep "\[r3 .*\] launch: 4 ranks; host $(hostname -s): 4 ranks x 1 OpenMP thread" "$work/srun.log" |
  grep -q "local rank 3," || { cat "$work/srun.log"; fail "rank 3 does not report local rank 3"; }

# PMI2 does not reach Debian's Open MPI (built with PMIx only, no s1/s2 component): MPI_Init
# fails in every task and the step fails (documented in docs/clusters.md).
if srun -n 2 --mpi=pmi2 "$TRIDENT" $(train_args "$work" pmi2 2) > "$work/pmi2.log" 2>&1; then
  cat "$work/pmi2.log"; fail "srun --mpi=pmi2 unexpectedly ran: update docs/clusters.md"
fi
grep -q "MPI_Init" "$work/pmi2.log" ||
  { cat "$work/pmi2.log"; fail "srun --mpi=pmi2 failed for another reason than MPI_Init"; }
# --- Planned stops in sbatch jobs: srun exits 0, the job is COMPLETED with exit code 0:0. ---
# job_field JOBID FIELD: a field of `scontrol show job` (JobState, ExitCode, Reason, ...).
job_field() { scontrol show job "$1" -o | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# wait_job JOBID: waits until the job has ended (at most 5 minutes); prints its state.
wait_job() {
  local st=""
  for _ in $(seq 1200); do
    st=$(job_field "$1" JobState)
    case $st in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
        echo "$st"; return ;;
    esac
    sleep 0.25
  done
  echo "still-$st-after-5-minutes"
}
# submit NAME [sbatch options...] -- [train flags...]: an sbatch job running
# `srun -n 2 trident train <the tiny model, 12 iterations> FLAGS`, writing $work/NAME.out and
# $work/NAME.jsonl; prints the job id.
submit() {
  local name=$1
  shift
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  {
    echo "#!/bin/bash"
    echo "srun -n 2 --mpi=pmix $TRIDENT $(train_args "$work" "$name" 12) $*"
  } > "$work/$name.sbatch"
  sbatch --parsable -n 2 -o "$work/$name.out" "${opts[@]}" "$work/$name.sbatch"
}
# expect_completed JOBID NAME: the job COMPLETED with exit code 0:0 and its output has no abort.
expect_completed() {
  local st code
  st=$(wait_job "$1")
  code=$(job_field "$1" ExitCode)
  if [ "$st" != COMPLETED ] || [ "$code" != 0:0 ]; then
    cat "$work/$2.out"; fail "$2: job $1 ended $st with exit code $code, not COMPLETED 0:0"
  fi
  if grep -qiE "abort|non-zero" "$work/$2.out"; then
    cat "$work/$2.out"; fail "$2: the job's output reports an abort"
  fi
}
# records FILE.jsonl: the number of training records in a metrics file (0 when absent).
records() {
  python3 -c 'import json, sys; print(sum(1 for l in open(sys.argv[1]) if "split" not in json.loads(l)))' \
    "$1" 2>/dev/null || echo 0
}
# expect_line NAME TEXT: the job's output holds TEXT.
expect_line() { grep -qF "$2" "$work/$1.out" || { cat "$work/$1.out"; fail "$1: no line '$2'"; }; }

touch "$work/STOP"
j_int=$(submit stop_interval -- --exit-interval 3 --save "$work/ck_int")
j_dur=$(submit stop_duration -- --exit-duration-in-mins 0.0001 --save "$work/ck_dur")
j_ks=$(submit stop_killswitch -- --kill-switch-path "$work/STOP" --save "$work/ck_ks")
j_end=$(submit stop_end -- --save "$work/ck_end")
j_sig=$(submit stop_signal -- --train-iters 100000 --exit-signal-handler --save "$work/ck_sig")
expect_completed "$j_int" stop_interval
expect_completed "$j_dur" stop_duration
expect_completed "$j_ks" stop_killswitch
expect_completed "$j_end" stop_end
expect_line stop_interval "exiting at iteration 3 with code 0 (stopped: --exit-interval"
expect_line stop_duration "with code 0 (stopped: --exit-duration-in-mins"
expect_line stop_killswitch "exiting at iteration 1 with code 0 (stopped: --kill-switch-path"
[ "$(cat "$work/ck_int/latest_checkpointed_iteration.txt")" = 3 ] ||
  fail "--exit-interval 3 did not save iteration 3"
[ "$(cat "$work/ck_end/latest_checkpointed_iteration.txt")" = 12 ] ||
  fail "the run to the end did not save iteration 12"
# SIGTERM to the job's steps (what --signal sends before the time limit): saved, exit 0.
for _ in $(seq 600); do [ "$(records "$work/stop_signal.jsonl")" -ge 2 ] && break; sleep 0.2; done
[ "$(records "$work/stop_signal.jsonl")" -ge 2 ] ||
  { cat "$work/stop_signal.out"; fail "the signal job did not train"; }
scancel --signal=TERM "$j_sig"
expect_completed "$j_sig" stop_signal
expect_line stop_signal "with code 0 (stopped: signal"
[ -f "$work/ck_sig/latest_checkpointed_iteration.txt" ] || fail "the signal stop saved nothing"
echo "slurm_test: every planned stop exits 0, its job COMPLETED 0:0"

# --- An afterok chain continues a run: job 1 stops at --exit-interval 6, job 2 resumes. ---
srun -n 2 --mpi=pmix "$TRIDENT" $(train_args "$work" chain_ref 12) > "$work/chain_ref.log" 2>&1 ||
  { cat "$work/chain_ref.log"; fail "the uninterrupted reference run failed"; }
chain=(--exit-interval 6 --save "$work/ck_chain" --load "$work/ck_chain")
j1=$(submit chain -- "${chain[@]}")
j2=$(submit chain2 --dependency=afterok:"$j1" -- "${chain[@]}")
expect_completed "$j1" chain
expect_completed "$j2" chain2
expect_line chain "exiting at iteration 6 with code 0"
n1=$(records "$work/chain.jsonl")
n2=$(records "$work/chain2.jsonl")
[ "$n1" = 6 ] && [ "$n2" = 6 ] || fail "the chain's jobs trained $n1 + $n2 iterations, not 6 + 6"
python3 - "$work/chain2.jsonl" <<'PY' || fail "the second job did not resume at iteration 7"
import json, sys
its = [j["iteration"] for j in map(json.loads, open(sys.argv[1])) if "split" not in j]
sys.exit(0 if its == list(range(7, 13)) else f"iterations {its}")
PY
cat "$work/chain.jsonl" "$work/chain2.jsonl" > "$work/chain_all.jsonl"
same_losses "$work/chain_ref.jsonl" "$work/chain_all.jsonl" 1e-6 ||
  fail "the afterok chain's losses differ from the uninterrupted run's"
# A failed job (bad input, exit code 2) never starts its afterok successor.
j_bad=$(submit chain_bad -- --num-layerz 3)
j_next=$(submit chain_next --dependency=afterok:"$j_bad" -- --save "$work/ck_next")
st=$(wait_job "$j_bad")
[ "$st" = FAILED ] || { cat "$work/chain_bad.out"; fail "a job with a wrong flag ended $st, not FAILED"; }
for _ in $(seq 100); do
  [ "$(job_field "$j_next" Reason)" = DependencyNeverSatisfied ] && break
  sleep 0.2
done
if [ "$(job_field "$j_next" JobState)" != PENDING ] ||
  [ "$(job_field "$j_next" Reason)" != DependencyNeverSatisfied ]; then
  fail "the successor of a failed job is $(job_field "$j_next" JobState) ($(job_field "$j_next" Reason)), not PENDING (DependencyNeverSatisfied)"
fi
scancel "$j_next"
echo "slurm_test: an afterok chain continues the run; a failed job's successor never starts"

echo "slurm_test: PASS"
