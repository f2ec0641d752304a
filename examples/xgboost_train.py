"""Workers train one XGBoost model together, each on its own shard of the data; every worker ends with the
same model, and prints its digest (compare them: they must be identical).

Written as for Kubeflow's xgboost-distributed runtime: the coordinates come from DMLC_TRACKER_URI,
DMLC_TRACKER_PORT, DMLC_TASK_ID and DMLC_NUM_WORKER, which hpcbridge launch sets for every worker on every
backend, and task 0 runs the tracker. With HPCBRIDGE_XGBOOST_TRACKER=launch node 0's launch runs it instead, and
this script's tracker lines are not needed. XGB_DEVICE=cuda trains on each worker's own GPU.
"""

import hashlib
import os

import numpy as np
import xgboost as xgb
from xgboost import collective as coll
from xgboost.tracker import RabitTracker

task = os.environ["DMLC_TASK_ID"]
workers = int(os.environ["DMLC_NUM_WORKER"])
uri, port = os.environ["DMLC_TRACKER_URI"], int(os.environ["DMLC_TRACKER_PORT"])

tracker = None
if int(task) == 0 and os.environ.get("HPCBRIDGE_XGBOOST_TRACKER", "script") == "script":
    # sorted by task id, so collective rank = task id
    tracker = RabitTracker(n_workers=workers, host_ip="0.0.0.0", port=port, sortby="task")
    tracker.start()

# the same synthetic data everywhere; each worker keeps every workers-th row from its own offset
rng = np.random.default_rng(7)
features = rng.normal(size=(4000, 8))
labels = (features[:, 0] + 0.5 * features[:, 1] - features[:, 2] > 0).astype(int)
shard = slice(int(task), None, workers)

# the tracker may start a moment after this worker (another node, a slower import): retry for a while
with coll.CommunicatorContext(dmlc_tracker_uri=uri, dmlc_tracker_port=port, dmlc_task_id=task, dmlc_retry=30):
    rank = coll.get_rank()
    booster = xgb.train({"tree_method": "hist", "objective": "binary:logistic", "max_depth": 4, "nthread": 1,
                         "device": os.environ.get("XGB_DEVICE", "cpu")},
                        xgb.DMatrix(features[shard], label=labels[shard]), num_boost_round=10)
    dump = "\n".join(booster.get_dump(dump_format="json"))
    error = float(((booster.predict(xgb.DMatrix(features)) > 0.5) != labels).mean())
    print(f"worker {rank}/{coll.get_world_size()} task {task}: model {hashlib.sha256(dump.encode()).hexdigest()[:16]} "
          f"train error {error:.3f}", flush=True)
if tracker is not None:
    tracker.wait_for()
