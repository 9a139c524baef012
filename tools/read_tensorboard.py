#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event file with TensorBoard's own reader and checks
what fpt wrote: every step's train/loss, train/lr and train/grad_norm, and every
evaluation's test/accuracy, which must equal metrics.jsonl's. CI runs it on a fresh run
(`pip install tensorboard`); exits 1 on a mismatch.

    python3 tools/read_tensorboard.py RUN_DIR
"""
import json
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    run = sys.argv[1]
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for need in ["train/loss", "train/lr", "train/grad_norm", "test/accuracy", "test/loss"]:
        if need not in tags:
            sys.exit(f"{run}: no `{need}` scalars in the event file (tags: {tags})")
    with open(os.path.join(run, "spec.json")) as f:
        steps = json.load(f)["train"]["steps"]
    loss = acc.Scalars("train/loss")
    if [e.step for e in loss] != list(range(1, steps + 1)):
        sys.exit(f"{run}: train/loss at steps {[e.step for e in loss]}, expected 1..{steps}")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        metrics = [json.loads(l) for l in f]
    got = {e.step: e.value for e in acc.Scalars("test/accuracy")}
    for m in metrics:
        if not math.isclose(got.get(m["step"], float("nan")), m["test_accuracy"], rel_tol=1e-6):
            sys.exit(f"{run}: test/accuracy at step {m['step']} is {got.get(m['step'])}, metrics.jsonl {m['test_accuracy']}")
    print(f"{run}: TensorBoard reads {len(tags)} scalar series, {len(loss)} steps of train/loss, "
          f"{len(got)} evaluations matching metrics.jsonl")


if __name__ == "__main__":
    main()
