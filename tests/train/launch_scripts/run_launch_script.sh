#!/usr/bin/env bash
# Runs a Megatron / Megatron-DeepSpeed launch script (one of this directory's copies, written in
# those projects' style) through trident with only the launcher changed: torchrun / deepspeed /
# torch.distributed.launch -> mpirun -np NP trident train, pretrain_gpt.py dropped, srun removed.
# Usage: run_launch_script.sh TRIDENT NP SCRIPT OUTDIR [ENV=VALUE ...] [-- SCRIPT ARGS ...]
# The script's sizes come from ENV=VALUE (the scripts read them from the environment).
set -euo pipefail
trident=$1 np=$2 script=$3 out=$4
shift 4
envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
[ $# -gt 0 ] && shift
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
launch="mpirun -np $np $trident train"
sed -e "s|^export LAUNCHER=.*|export LAUNCHER=\"$launch\"|" \
    -e "s|^LAUNCHER=.*|LAUNCHER=\"$launch\"|" \
    -e 's|bash -c "$LAUNCHER --node_rank \\$SLURM_PROCID $CMD"|bash -c "$LAUNCHER $CMD"|' \
    -e 's|^srun --jobid ${SLURM_JOBID:-0} ||' \
    -e 's|^clear; srun $SRUN_ARGS --jobid $SLURM_JOB_ID ||' \
    -e 's|`pwd`/pretrain_gpt.py||' \
    -e "s|^torchrun \${DISTRIBUTED_ARGS\[@\]} pretrain_gpt.py|$launch|" \
    -e "s|^python -m torch.distributed.launch \$DISTRIBUTED_ARGS|$launch|" \
    -e "s|^deepspeed \${dir}/pretrain_gpt.py|$launch|" \
    -e "/^ *pretrain_gpt.py \\\\\$/d" \
    "$script" > "$out/launch.sh"
# What changed, for the log: only launcher lines.
diff "$script" "$out/launch.sh" || true
cd "$out"
env "${envs[@]}" bash ./launch.sh "$@"
