"""Reads TensorBoard event files with TensorBoard's own reader (EventAccumulator).

Usage: python3 read_tensorboard.py LOGDIR OUT.json
OUT.json: {"tags": {tag: [[step, value], ...]}, "files": n}
"""
import glob
import json
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    logdir, out = sys.argv[1], sys.argv[2]
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    with open(out, "w") as f:
        json.dump({"tags": tags, "files": len(files)}, f)


if __name__ == "__main__":
    main()
