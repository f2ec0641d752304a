"""Every annotation, label and finalizer name of hpc-bridge's own (``hpcbridge.io/…``), defined here once.

docs/annotations.md lists them with who writes each and who reads it; tests/unit/test_annotations.py keeps
every other module of ``bridge/`` from spelling one out. Constants only: the foundation layer, imported by
everything above it.
"""

#: the prefix of the knobs a user sets on a TrainJob; the plan refuses a name under it that it does not know
PREFIX = "hpcbridge.io/"

# -- written by the user on a TrainJob (or by `hpcbridge convert`), read by the plan --------------------------

#: which BridgeCluster runs the TrainJob (also read as a label, as Kueue's ResourceFlavor nodeLabels write it);
#: the operator rewrites it when it moves the TrainJob
CLUSTER_ANNOTATION = f"{PREFIX}cluster"
#: the Slurm/Flux partition; on Kubernetes also the node label a partition selects, and a Kueue placement label
PARTITION_ANNOTATION = f"{PREFIX}partition"
#: the account charged; on Kubernetes also the label the JobSet carries for chargeback
ACCOUNT_ANNOTATION = f"{PREFIX}account"
#: the quality of service
QOS_ANNOTATION = f"{PREFIX}qos"
#: the node features required (a Slurm constraint expression)
CONSTRAINT_ANNOTATION = f"{PREFIX}constraint"
#: whole nodes for the job: "true" or "false"
EXCLUSIVE_ANNOTATION = f"{PREFIX}exclusive"
#: a job array (sbatch's --array grammar)
ARRAY_ANNOTATION = f"{PREFIX}array"
#: the job waits for another (sbatch's --dependency grammar)
DEPENDENCY_ANNOTATION = f"{PREFIX}dependency"
#: where the job's standard output goes
OUTPUT_ANNOTATION = f"{PREFIX}output"
#: where the job's standard error goes
ERROR_ANNOTATION = f"{PREFIX}error"
#: the job's working directory (relative to the TrainJob's file on the CLI)
WORKDIR_ANNOTATION = f"{PREFIX}workdir"
#: move a running TrainJob to this cluster (the operator acts on it and removes it)
MIGRATE_ANNOTATION = f"{PREFIX}migrate-to"
#: the signal and grace that stop the job before a move (default TERM@30)
MIGRATE_SIGNAL_ANNOTATION = f"{PREFIX}migrate-signal"
#: why the TrainJob moved, kept in its history
MIGRATE_REASON_ANNOTATION = f"{PREFIX}migrate-reason"
#: the job's checkpoint directory, which a move carries to the target cluster
CHECKPOINT_ANNOTATION = f"{PREFIX}checkpoint-dir"
#: the job name as a converted sbatch script had it (Slurm keeps it)
SLURM_JOB_NAME_ANNOTATION = f"{PREFIX}slurm-job-name"
#: how a converted sbatch script spelled its GPU request (e.g. ``gres=gpu:a100:2``; Slurm re-emits it)
SLURM_GPUS_ANNOTATION = f"{PREFIX}slurm-gpus"
#: which of ``--nodes`` and ``--ntasks-per-node`` a converted sbatch script gave (``nodes,ntasks-per-node``, or
#: ``none``): on Slurm the job asks for those alone, so Slurm still picks what the script left to it
SLURM_LAYOUT_ANNOTATION = f"{PREFIX}slurm-layout"
#: the knobs above, in the order the plan's "unknown annotation" error lists them
KNOB_ANNOTATIONS = (PARTITION_ANNOTATION, ACCOUNT_ANNOTATION, QOS_ANNOTATION, CONSTRAINT_ANNOTATION,
                    EXCLUSIVE_ANNOTATION, ARRAY_ANNOTATION, DEPENDENCY_ANNOTATION, OUTPUT_ANNOTATION,
                    ERROR_ANNOTATION, WORKDIR_ANNOTATION, CLUSTER_ANNOTATION, MIGRATE_ANNOTATION,
                    MIGRATE_SIGNAL_ANNOTATION, MIGRATE_REASON_ANNOTATION, CHECKPOINT_ANNOTATION,
                    SLURM_JOB_NAME_ANNOTATION, SLURM_GPUS_ANNOTATION, SLURM_LAYOUT_ANNOTATION)
#: their names after the prefix
KNOBS = tuple(key[len(PREFIX):] for key in KNOB_ANNOTATIONS)
#: ``hpcbridge.io/sbatch.<option>: value``: an sbatch option carried verbatim (the user, or `hpcbridge convert`)
SBATCH_PASSTHROUGH_PREFIX = f"{PREFIX}sbatch."

# -- written by the cluster admin on Kubernetes nodes ----------------------------------------------------------

#: ``feature.hpcbridge.io/<feature>``: a node label per feature a constraint may require
FEATURE_LABEL_PREFIX = f"feature.{PREFIX}"

# -- written by hpc-bridge ------------------------------------------------------------------------------------

#: the TrainJob's uid on everything the Kubernetes backend creates (JobSet, pods, Secrets, ConfigMaps)
UID_LABEL = f"{PREFIX}uid"
#: ``hpcbridge.io/uid=<uid>``: the mark the Slurm backend writes in a job's comment
UID_COMMENT_PREFIX = f"{UID_LABEL}="
#: the per-job SSH keys a rendered JobSet carries until the Kubernetes backend turns them into a Secret
KEYS_ANNOTATION = f"{PREFIX}ssh-keys"
#: the Kubernetes backend's mark on a cancelled (suspended) JobSet, which stays as the record
CANCELLED_ANNOTATION = f"{PREFIX}cancelled"
#: the tenant an overlay BridgeCluster acts for (a label bridge.tenancy writes on the in-memory copy)
TENANT_LABEL = f"{PREFIX}tenant"
#: the model a generated CRD came from (`hpcbridge crds`)
GENERATED_FROM_ANNOTATION = f"{PREFIX}generated-from"
#: the operator's finalizer on the TrainJobs it manages
FINALIZER = f"{PREFIX}finalizer"
#: the prefix of what the operator writes on TrainJobs (its own, apart from the knobs users set; kopf's
#: progress and diff-base annotations use it too)
OPERATOR_PREFIX = f"operator.{PREFIX}"
#: the backend job a TrainJob runs as, so a restarted operator, `kubectl` and the CLI find it
JOB_ID_ANNOTATION = f"{OPERATOR_PREFIX}job-id"
#: the cluster that job runs on
JOB_CLUSTER_ANNOTATION = f"{OPERATOR_PREFIX}job-cluster"
#: every move of the TrainJob between clusters, a JSON list (hpcbridge migrate's history entries)
HISTORY_ANNOTATION = f"{OPERATOR_PREFIX}history"
#: on a BridgeCluster (the admin's): ``"false"`` keeps the operator from registering a virtual node for it
VIRTUAL_NODE_ANNOTATION = f"{PREFIX}virtual-node"
#: the type of the BridgeCluster a virtual node stands for (``slurm``, ``flux``…)
NODE_CLUSTER_TYPE_LABEL = f"{PREFIX}cluster-type"
#: on a virtual node: where its capacity came from (the backend's query and when), or why it is unknown
CAPACITY_ANNOTATION = f"{OPERATOR_PREFIX}capacity"
#: a virtual node's extended resource: how many of the backend's nodes the cluster has
NODES_RESOURCE = f"{PREFIX}nodes"
#: what made a Node or pod: ``virtual-node`` on the operator's Nodes and stand-in pods
MANAGED_LABEL = f"{PREFIX}managed-by"
#: on a stand-in pod (besides the job-id and job-cluster annotations): the hosts its backend job runs on
HOSTS_ANNOTATION = f"{OPERATOR_PREFIX}hosts"


# -- other projects' labels hpc-bridge reads or writes, spelled as those projects define them ------------------

#: Kubeflow Trainer: the TrainJob a JobSet (and its pods) belongs to; the Kubeflow SDK finds pods by it
TRAINJOB_NAME_LABEL = "trainer.kubeflow.org/trainjob-name"
#: Kubeflow Trainer: the framework of a runtime (``torch``, ``mpi``…; hpc-bridge's own runtimes add ``sbatch``)
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
#: Kubeflow Trainer: which replicated job of a runtime's template is the trainer (value ``trainer``)
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: Kueue: the LocalQueue a workload is submitted to
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Kueue: the uid of the job a workload stands for, on the workload's pods
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: JobSet: the JobSet a pod belongs to
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: JobSet: the replicated job a pod belongs to
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
#: JobSet: the index of a pod's Job within its replicated job
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
#: Kubernetes Jobs: an indexed Job's pod index (the Kubeflow SDK reads a node's rank from it)
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: the scheduler-plugins coscheduling PodGroup a pod belongs to (gang scheduling)
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
