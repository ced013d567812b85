#!/usr/bin/env python3
"""A task kind in Python 3 (standard library only) that resumes from its checkpoint.

Shows progress over 5 steps, a checkpoint after each step, and resuming: a later run of
the task (a retry, or the task given back by a drain) gets the last checkpoint in the
task's "checkpoint" and starts after the last step it records (docs/programs.md).
Nothing is resized: each step sleeps for payload "ms" milliseconds (default 500).

Kind `resize` (the file name without `.py`). With this folder as the tasks folder:
    artex worker --tasks-dir examples/programs
    artex submit resize --payload '{"file": "a.png"}' --wait
By hand, fd 3 shown on the terminal, resuming after step 3:
    echo '{"payload": {"ms": 10}, "checkpoint": {"done": 3}}' | examples/programs/resize.py 3>&1
"""

import json
import os
import sys
import time

STEPS = 5


def main():
    task = json.load(sys.stdin)
    payload = task.get("payload") or {}
    step_ms = payload.get("ms", 500)

    # File descriptor 3 carries the protocol: one JSON object a line. Flush each line so
    # that the worker sees it now, not when a buffer fills or the program exits.
    protocol = os.fdopen(3, "w")

    def send(line):
        protocol.write(json.dumps(line) + "\n")
        protocol.flush()

    # null on a first run; then whatever the last checkpoint line held.
    checkpoint = task.get("checkpoint") or {}
    resumed_from = checkpoint.get("done", 0)

    for step in range(resumed_from + 1, STEPS + 1):
        time.sleep(step_ms / 1000)  # the work of one step
        send({"checkpoint": {"done": step}})
        send({"progress": step / STEPS, "message": f"step {step} of {STEPS}"})
        print(f"step {step} done", file=sys.stderr)  # to the worker's log

    send({"result": {"steps": STEPS, "resumed_from": resumed_from}})


if __name__ == "__main__":
    main()
