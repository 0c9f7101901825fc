"""Runs megatron-core's num-microbatches calculators for tests/data/data_loader_test.cc.

Usage: python3 megatron_batch_schedule.py SPEC.json OUT.json

SPEC.json: {"cases": [{"global_batch_size", "micro_batch_size", "data_parallel_size",
  "rampup": [start, increment, samples] or null, "decrease_batch_size_if_needed": bool,
  "consumed": [c, ...], "train_steps": n}], "step_cases": [...], "parse": [...]}

"step_cases" run megatron-core 0.19.2's StepBatchsizeNumMicroBatchesCalculator (see
mcore_import.load_step_calculator: 0.16.1 has no step schedules): each {"schedule", "seq_length"
or null, "micro_batch_size", "data_parallel_size", "consumed", "train_steps", "train_samples"};
"parse" is a list of [schedule, seq_length or null] strings for _parse_schedule +
_validate_schedule alone.

For each case OUT.json holds
  "at": for every c in consumed, [global, running global, num_micro_batches] after
        update(c, consistency_check=False) -- the calculator as a function of consumed samples;
  "loop": the first train_steps steps of Megatron's training loop, [consumed, global, running,
          num_micro] per step: update(consumed, True), then consumed += running global batch.
"""
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_import import load_megatron_core, load_step_calculator  # noqa: E402

load_megatron_core()

from megatron.core.num_microbatches_calculator import (  # noqa: E402
    _build_num_microbatches_calculator,
)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = []
    for case in spec["cases"]:
        calc = _build_num_microbatches_calculator(
            rank=1,  # not 0: keeps the calculator from logging
            rampup_batch_size=case["rampup"],
            global_batch_size=case["global_batch_size"],
            micro_batch_size=case["micro_batch_size"],
            data_parallel_size=case["data_parallel_size"],
            decrease_batch_size_if_needed=case["decrease_batch_size_if_needed"],
        )

        def state():
            return [
                calc.get_current_global_batch_size(),
                calc.get_current_running_global_batch_size(),
                calc.get(),
            ]

        at = []
        for c in case["consumed"]:
            calc.update(c, False)
            at.append(state())
        loop = []
        consumed = 0
        for _ in range(case["train_steps"]):
            calc.update(consumed, True)
            loop.append([consumed] + state())
            consumed += calc.get_current_running_global_batch_size()
        out.append({"at": at, "loop": loop})
    if not spec.get("step_cases") and not spec.get("parse"):
        with open(sys.argv[2], "w") as f:
            json.dump(out, f)
        return
    step = load_step_calculator()
    step_out = []
    for case in spec.get("step_cases", []):
        calc = step._build_num_microbatches_calculator(
            1, None, case["micro_batch_size"], case["data_parallel_size"], False,
            case["schedule"], case["seq_length"])
        stages = [list(s) for s in calc.schedule]
        at = []
        for c in case["consumed"]:
            calc.update(c, False)
            at.append([calc.get_current_global_batch_size(),
                       calc.get_current_running_global_batch_size(), calc.get()])
        # Megatron-LM's training.update_train_iters (megatron/training, not in the wheel): the
        # step-schedule branch, iterations until consumed >= train_samples.
        iterations = consumed = 0
        while consumed < case["train_samples"]:
            calc.update(consumed, False)
            consumed += calc.get_current_global_batch_size()
            iterations += 1
        loop = []
        consumed = 0
        for _ in range(case["train_steps"]):
            calc.update(consumed, False)
            loop.append([consumed, calc.get_current_global_batch_size(),
                         calc.get_current_running_global_batch_size(), calc.get()])
            consumed += calc.get_current_running_global_batch_size()
        step_out.append({"stages": stages, "at": at, "loop": loop,
                         "train_iters_for_samples": iterations})
    parsed = []
    for schedule, seq_length in spec.get("parse", []):
        try:
            stages = step.StepBatchsizeNumMicroBatchesCalculator._parse_schedule(schedule,
                                                                                 seq_length)
            holder = types.SimpleNamespace(schedule=stages)
            step.StepBatchsizeNumMicroBatchesCalculator._validate_schedule(holder)
            parsed.append([list(s) for s in stages])
        except (ValueError, AssertionError, OverflowError) as e:
            parsed.append("error: " + type(e).__name__ + ": " + str(e))
    with open(sys.argv[2], "w") as f:
        json.dump({"cases": out, "step_cases": step_out, "parse": parsed}, f)


if __name__ == "__main__":
    main()
