"""A training loop that can move between clusters: it checkpoints after every step and resumes from
$HPCBRIDGE_RESUME_FROM, which `hpcbridge migrate` sets to the TrainJob's hpcbridge.io/checkpoint-dir.

SIGUSR1 or SIGTERM (migrate's --signal) ends it after the step in progress, with the checkpoint written, so the
next cluster goes on from there: no step is lost and none is done twice. Each step is logged with the cluster
it ran on. Usage: checkpointed_train.py CHECKPOINT_DIR [STEPS] [SECONDS_PER_STEP]
"""

import json
import os
import signal
import sys
import time

directory = os.environ.get("HPCBRIDGE_RESUME_FROM") or sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.25
cluster = os.environ.get("HPCBRIDGE_CLUSTER", "?")
state = os.path.join(directory, "state.json")
os.makedirs(directory, exist_ok=True)

stop = []
for number in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(number, lambda signum, _frame: stop.append(signum))

step = 0
if os.path.exists(state):
    with open(state) as handle:
        step = json.load(handle)["step"]
    print(f"resuming at step {step} on {cluster}", flush=True)
while step < steps and not stop:
    time.sleep(pause)  # the work of one step
    step += 1
    with open(os.path.join(directory, "steps.log"), "a") as log:
        log.write(f"{step} {cluster}\n")
    with open(state + ".tmp", "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(state + ".tmp", state)  # the checkpoint is whole or the previous one
if stop:
    print(f"stopped by signal {stop[0]} after step {step} on {cluster}; checkpoint in {directory}", flush=True)
else:
    print(f"finished {steps} steps on {cluster}", flush=True)
