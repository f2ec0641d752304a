"""Environment variables the planner validates and ``hpcbridge launch`` reads: constants only, imported on
every node's start-up path, so nothing heavy here."""

#: who runs the XGBoost tracker: "script" (task 0's script, as with Kubeflow's runtime) or "launch" (node 0's
#: hpcbridge launch, so scripts need no tracker code)
XGBOOST_TRACKER_ENV = "HPCBRIDGE_XGBOOST_TRACKER"
XGBOOST_TRACKERS = ("script", "launch")

#: set on a converted TFJob: its roles in rank order, e.g. ``chief=1,worker=2,ps=1``; `hpcbridge launch` gives
#: each node TF_CONFIG for its own role from it (bridge.mpi.launchers.tf_config), as the TFJob operator gives
#: each pod
TF_ROLES_ENV = "HPCBRIDGE_TF_ROLES"

#: set ("1") by the local cluster on each node's launch: every line of the job's output goes out whole, after
#: the node and rank that wrote it (MPI ranks through their launcher's tags, bridge.mpi.group.RankLines)
TAG_OUTPUT_ENV = "HPCBRIDGE_TAG_OUTPUT"
