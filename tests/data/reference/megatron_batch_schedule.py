"""Runs megatron-core's num-microbatches calculators for tests/data/data_loader_test.cc.

Usage: python3 megatron_batch_schedule.py SPEC.json OUT.json

SPEC.json: {"cases": [{"global_batch_size", "micro_batch_size", "data_parallel_size",
  "rampup": [start, increment, samples] or null, "decrease_batch_size_if_needed": bool,
  "consumed": [c, ...], "train_steps": n}]}

For each case OUT.json holds
  "at": for every c in consumed, [global, running global, num_micro_batches] after
        update(c, consistency_check=False) -- the calculator as a function of consumed samples;
  "loop": the first train_steps steps of Megatron's training loop, [consumed, global, running,
          num_micro] per step: update(consumed, True), then consumed += running global batch.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_import import load_megatron_core  # noqa: E402

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
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
