"""Megatron's training schedule for a launch script's settings, from megatron-core's own code.

Usage: python3 megatron_schedule.py SPEC.json OUT.json

SPEC.json: {"global_batch_size", "micro_batch_size", "data_parallel_size", "rampup": [s, i, n] or
null, "train_iters" or "train_samples", "lr", "min_lr", "lr_decay_style", "lr_warmup_init",
"lr_warmup_iters" | "lr_warmup_samples" | "lr_warmup_fraction", "lr_decay_iters" |
"lr_decay_samples", "train_tokens", "seq_length", "skipped": [iterations whose update was
skipped], "lr_warmup_tokens" and "lr_decay_tokens" for Megatron-DeepSpeed's token schedule, "step_batch_size_schedule" for
Megatron-LM's step schedule (thresholds in tokens of seq_length)}

OUT.json: {"train_iters": n, "steps": [[iteration, consumed samples after it, global batch
size, learning rate used by it], ...]}.

A skipped iteration does not step the scheduler (Megatron steps it only when the update
succeeded). Megatron-DeepSpeed's token schedule is Megatron's schedule in units of seq_length
tokens, evaluated at the tokens consumed before the previous iteration: its scheduler reads
args.consumed_train_tokens, which train() updates only after train_step returns.

The batch sizes come from megatron-core's num-microbatches calculator and the learning rate from
megatron-core's OptimizerParamScheduler, stepped by the global batch after every iteration as
Megatron's train_step does (increment = num_microbatches x micro x dp). The number of iterations
of a sample-based run follows Megatron's training.update_train_iters (the ramp counted step by
step, a partial last batch dropped), and the warm-up / decay conversion follows
get_optimizer_param_scheduler (iterations x global batch size); those two functions live in
megatron/training, which the megatron-core wheel does not ship, so they are written out here.

A step schedule (--step-batch-size-schedule) uses megatron-core 0.19.2's
StepBatchsizeNumMicroBatchesCalculator, read from the pinned wheel (0.16.1 predates it; see
tests/data/reference/mcore_import.py), with the thresholds in tokens as Megatron-LM passes
seq_length; "global_batch_size" is then the value the run uses for --lr-*-iters (Megatron-LM's
args.global_batch_size).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                                "reference"))
from mcore_import import load_megatron_core, load_step_calculator  # noqa: E402

load_megatron_core()

from megatron.core.num_microbatches_calculator import (  # noqa: E402
    _build_num_microbatches_calculator,
)
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402


class _Optimizer:
    def __init__(self):
        self.param_groups = [{"lr": 0.0, "weight_decay": 0.0}]


def main():
    with open(sys.argv[1]) as f:
        a = json.load(f)
    gbs, mbs, dp = a["global_batch_size"], a["micro_batch_size"], a["data_parallel_size"]
    step = a.get("step_batch_size_schedule")
    if step is not None:
        calc = load_step_calculator()._build_num_microbatches_calculator(
            1, None, mbs, dp, False, step, a["seq_length"])
    else:
        calc = _build_num_microbatches_calculator(
            rank=1, rampup_batch_size=a.get("rampup"), global_batch_size=gbs,
            micro_batch_size=mbs, data_parallel_size=dp, decrease_batch_size_if_needed=False)

    if a.get("train_samples"):
        train_samples = a["train_samples"]
        if step is not None:  # update_train_iters, step-schedule branch
            iterations = consumed = 0
            while consumed < train_samples:
                calc.update(consumed, False)
                consumed += calc.get_current_global_batch_size()
                iterations += 1
            calc.update(0, False)
            train_iters = iterations
        elif a.get("rampup") is None:
            train_iters = train_samples // gbs
        else:  # update_train_iters
            iterations = consumed = 0
            while consumed <= int(a["rampup"][2]) and consumed <= train_samples:
                calc.update(consumed, False)
                consumed += calc.get_current_global_batch_size()
                iterations += 1
            calc.update(0, False)
            if train_samples > consumed:
                iterations += (train_samples - consumed) // gbs
            train_iters = iterations
        decay_steps = a.get("lr_decay_samples") or train_samples
        warmup_steps = (a["lr_warmup_fraction"] * decay_steps
                        if a.get("lr_warmup_fraction") is not None
                        else a.get("lr_warmup_samples", 0))
    else:
        train_iters = a["train_iters"]
        decay_steps = (a.get("lr_decay_iters") or train_iters) * gbs
        warmup_steps = (a["lr_warmup_fraction"] * decay_steps
                        if a.get("lr_warmup_fraction") is not None
                        else a.get("lr_warmup_iters", 0) * gbs)

    opt = _Optimizer()
    sched = OptimizerParamScheduler(
        opt, init_lr=a.get("lr_warmup_init", 0.0), max_lr=a["lr"], min_lr=a["min_lr"],
        lr_warmup_steps=warmup_steps, lr_decay_steps=decay_steps,
        lr_decay_style=a["lr_decay_style"], start_wd=0.1, end_wd=0.1,
        wd_incr_steps=train_iters * gbs, wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=False)

    tok_opt, tok_sched = _Optimizer(), None
    if a.get("lr_decay_tokens"):
        T = float(a["seq_length"])
        tok_sched = OptimizerParamScheduler(
            tok_opt, init_lr=0.0, max_lr=a["lr"], min_lr=a["min_lr"],
            lr_warmup_steps=a.get("lr_warmup_tokens", 0) / T,
            lr_decay_steps=a["lr_decay_tokens"] / T, lr_decay_style=a["lr_decay_style"],
            start_wd=0.1, end_wd=0.1, wd_incr_steps=1, wd_incr_style="constant",
            use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=False)

    skipped = set(a.get("skipped", []))
    steps = []
    consumed = 0
    before_previous = 0  # samples consumed before the previous iteration
    iteration = 0
    train_tokens = a.get("train_tokens") or 0
    while iteration < train_iters and (train_tokens == 0 or
                                       consumed * a["seq_length"] < train_tokens):
        calc.update(consumed, True)
        lr = opt.param_groups[0]["lr"]
        if tok_sched is not None:
            tok_sched.num_steps = before_previous
            lr = tok_sched.get_lr(tok_opt.param_groups[0])
        running = calc.get_current_running_global_batch_size()
        iteration += 1
        if iteration not in skipped:
            sched.step(increment=calc.get() * mbs * dp)
        before_previous = consumed
        consumed += running
        steps.append([iteration, consumed, running, lr])
    with open(sys.argv[2], "w") as f:
        json.dump({"train_iters": train_iters, "steps": steps}, f)


if __name__ == "__main__":
    main()
