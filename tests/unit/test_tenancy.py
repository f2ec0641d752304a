"""Tenants without daemons: which namespace runs as whom, what a tenant may ask for, and that the operator acts
only on the job the backend holds for a TrainJob's uid under its tenant's identity (the real two-tenant run on
Slurm and the apiserver: tests/integration/kubernetes/test_tenants.py)."""

from __future__ import annotations

import pytest

from bridge import service, tenancy
from bridge.adapters.base import JobRef, JobState, JobStatus
from bridge.api.cluster import BridgeCluster
from bridge.errors import InvalidSpec
from tests.builders import cluster, trainjob_doc
from tests.fakes import FakeTransport, replying

UID_A = "0b4c1f7e-0000-4000-8000-00000000000a"
UID_B = "0b4c1f7e-0000-4000-8000-00000000000b"


TENANTS = [
    {"name": "team-a", "namespaces": ["team-a"], "user": "alice", "accounts": ["proj-a", "proj-a2"],
     "partitions": ["debug"], "qos": ["normal", "high"]},
    {"name": "team-b", "namespaceSelector": {"matchLabels": {"hpc.example.org/tenant": "b"}}, "user": "bob",
     "accounts": ["proj-b"]},
]


def source(namespace: str = "team-a", annotations: dict | None = None, uid: str = UID_A) -> service.Input:
    from bridge.api.loader import parse_object

    trainjob = parse_object(trainjob_doc(namespace=namespace, uid=uid,
                                         annotations={"hpcbridge.io/cluster": "hpc", **(annotations or {})},
                                         trainer={"command": ["python3", "train.py"]}), "TrainJob")
    return service.Input((trainjob,), "TrainJob", None)


def prepare(target: BridgeCluster, namespace="team-a", labels=None, annotations=None) -> service.Prepared:
    return service.prepare(source(namespace, annotations), configured={target.name: target},
                           tenancy=tenancy.Request(namespace, labels))


def test_each_namespace_runs_as_its_tenants_user_and_an_unmapped_one_is_refused() -> None:
    target = cluster(tenants=TENANTS, defaults={"partition": "batch"})
    a = prepare(target)
    assert a.plan.tenant == "team-a" and a.adapter.cluster.spec.slurm.user == "alice"
    assert "#SBATCH --account=proj-a" in a.artifact.main and "#SBATCH --partition=debug" in a.artifact.main
    # started from an export file, the job has no name for slurmd's %x: the output file is named in full
    assert "#SBATCH --output=hpcbridge-train-%j.out" in a.artifact.main
    b = prepare(target, "team-b-prod", {"hpc.example.org/tenant": "b"})
    assert b.plan.tenant == "team-b" and b.adapter.cluster.spec.slurm.user == "bob"
    assert "#SBATCH --account=proj-b" in b.artifact.main and "#SBATCH --partition=batch" in b.artifact.main
    with pytest.raises(InvalidSpec) as refused:
        prepare(target, "team-c")
    assert refused.value.field == "metadata.namespace" and "maps no tenant" in str(refused.value)
    # labels a namespace does not have never match; a tenant cannot label its way into team-b
    with pytest.raises(InvalidSpec):
        prepare(target, "team-c", {"hpc.example.org/tenant": "c"})


def test_a_cluster_with_neither_tenants_nor_allowed_namespaces_serves_no_namespace_but_the_cli_runs() -> None:
    target = cluster()
    with pytest.raises(InvalidSpec, match="serves no namespace"):
        prepare(target, "default")
    cli = service.prepare(source("default"), configured={"hpc": target})  # the CLI: its own Unix user
    assert cli.plan.tenant is None
    single = cluster(allowedNamespaces=["team-a"], accountMapping={"team-a": "mapped"})
    plan = prepare(single).plan
    assert plan.tenant == "team-a" and plan.options.account == "mapped"
    with pytest.raises(InvalidSpec, match="spec.tenants, spec.allowedNamespaces"):
        prepare(single, "team-b")


def test_a_tenants_account_partition_and_qos_are_requests_within_its_mapping() -> None:
    target = cluster(tenants=TENANTS, defaults={"partition": "batch", "qos": "normal"})
    assert prepare(target, annotations={"hpcbridge.io/account": "proj-a2", "hpcbridge.io/qos": "high"}).plan \
        .options.account == "proj-a2"
    for knob, value in (("account", "proj-b"), ("partition", "gpu"), ("qos", "top")):
        with pytest.raises(InvalidSpec) as refused:
            prepare(target, annotations={f"hpcbridge.io/{knob}": value})
        assert refused.value.field == f"metadata.annotations[hpcbridge.io/{knob}]" and refused.value.value == value
    # team-b lists no partitions or QOS: the cluster's defaults, and no choice
    b = {"hpc.example.org/tenant": "b"}
    with pytest.raises(InvalidSpec, match="has no partition to choose"):
        prepare(target, "b", b, annotations={"hpcbridge.io/partition": "debug"})
    assert prepare(target, "b", b, annotations={"hpcbridge.io/partition": "batch"}).plan.options.partition == "batch"
    # a namespace of a single-identity cluster cannot override the cluster's accountMapping
    single = cluster(allowedNamespaces=["team-a"], accountMapping={"team-a": "mapped"})
    with pytest.raises(InvalidSpec, match="may use mapped"):
        prepare(single, annotations={"hpcbridge.io/account": "someone-elses"})


@pytest.mark.parametrize("option", ["clusters", "reservation", "nodelist", "container", "export-file", "input",
                                    "mail-user", "chdir", "comment", "account", "partition", "qos", "uid"])
def test_from_kubernetes_the_sbatch_pass_through_is_an_allowlist(option) -> None:
    target = cluster(tenants=TENANTS, defaults={"allowPrivilegedOptions": ["uid"]})
    with pytest.raises(InvalidSpec) as refused:
        prepare(target, annotations={f"hpcbridge.io/sbatch.{option}": "x"})
    assert refused.value.field == f"metadata.annotations[hpcbridge.io/sbatch.{option}]"
    assert "not among the sbatch options" in str(refused.value)


def test_allowed_pass_through_reaches_sbatch_and_the_cli_keeps_every_option() -> None:
    target = cluster(tenants=TENANTS)
    assert "#SBATCH --signal=USR1@60" in prepare(
        target, annotations={"hpcbridge.io/sbatch.signal": "USR1@60"}).artifact.main
    cli = service.prepare(source("team-a", {"hpcbridge.io/sbatch.reservation": "maint"}), configured={"hpc": target})
    assert "#SBATCH --reservation=maint" in cli.artifact.main


def test_the_operator_never_runs_a_local_cluster() -> None:
    with pytest.raises(InvalidSpec) as refused:
        prepare(cluster(kind="local", allowedNamespaces=["team-a"]))
    assert refused.value.field == "BridgeCluster hpc: spec.type"


@pytest.mark.parametrize("spec, message", [
    ({"tenants": [{"name": "a", "namespaces": ["x"], "user": "root"}]}, "never runs as root"),
    ({"tenants": [{"name": "a", "user": "alice"}]}, "give namespaces or namespaceSelector"),
    ({"tenants": [{"name": "a", "namespaces": ["x"], "user": "alice"},
                  {"name": "b", "namespaces": ["x"], "user": "bob"}]}, "already tenant a's"),
    ({"tenants": [{"name": "a", "namespaces": ["x"], "user": "alice"}], "allowedNamespaces": ["y"]}, "not both"),
    ({"slurm": {"transport": "ssh", "host": "login", "knownHostsFile": "/k"},
      "tenants": [{"name": "a", "namespaces": ["x"], "user": "alice"}]}, "keySecretRef is required over ssh"),
])
def test_tenant_mappings_that_cannot_be_honoured_are_refused(spec, message) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        cluster(**spec)


def test_a_tenant_without_a_user_of_its_own_logs_in_with_the_clusters_key() -> None:
    ssh = {"transport": "ssh", "host": "login", "user": "svc", "knownHostsFile": "/k", "keyFile": "/key"}
    shared = cluster(slurm=ssh, tenants=[{"name": "a", "namespaces": ["x"]}])
    assert tenancy.as_tenant(shared, shared.spec.tenants[0]).spec.slurm == shared.spec.slurm


@pytest.mark.parametrize("spec", [
    {"tenants": [{"name": "a", "namespaces": ["x"], "user": "alice"}, {"name": "b", "namespaces": ["y"]}]},
    {"allowedNamespaces": ["x", "y"]},
])
def test_a_flux_instance_serves_one_tenant(spec) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="serves one tenant"):
        cluster(kind="flux", **spec)
    cluster(kind="flux", tenants=[{"name": "a", "namespaces": ["x", "x-dev"], "user": "alice"}])


def test_a_tenant_on_the_local_transport_runs_every_slurm_command_through_sudo_as_its_user() -> None:
    from bridge.adapters.run_as import RunAs
    from bridge.adapters.slurm import make_transport

    target = tenancy.as_tenant(cluster(tenants=TENANTS), cluster(tenants=TENANTS).spec.tenants[0])
    transport = make_transport(target)
    assert isinstance(transport, RunAs) and transport.user == "alice"

    inner = FakeTransport()
    assert RunAs(inner, "alice").run(["scancel", "42"]).argv == ("scancel", "42")
    assert inner.calls[-1].argv == ("sudo", "-n", "-u", "alice", "--", "scancel", "42")
    # a job's environment goes on to the transport (which feeds it to sbatch on fd 3), never into argv
    RunAs(inner, "alice").run(["sbatch", "--export-file=3"], job_env={"TOKEN": "s3cret"})
    assert inner.calls[-1].job_env == {"TOKEN": "s3cret"} and "s3cret" not in " ".join(inner.calls[-1].argv)
    from bridge.errors import BackendRejected

    with pytest.raises(BackendRejected, match="sudoers rule"):
        RunAs(FakeTransport(replying(1, stderr="sudo: a password is required")), "alice").run(["squeue"])


def test_slurmrestd_never_falls_back_to_root(monkeypatch) -> None:
    from bridge.adapters.run_as import current_user
    from bridge.adapters.slurm.rest import RestClient

    monkeypatch.delenv("USER", raising=False)
    assert RestClient("http://127.0.0.1:1").user == current_user()
    monkeypatch.setenv("USER", "root")
    assert RestClient("http://127.0.0.1:1", user="alice").user == "alice"


@pytest.mark.parametrize("job_id", ["--me", "-u bob", "1 2", "../jobs", "12;rm", "", "1_2_3"])
def test_job_ids_are_checked_before_they_reach_a_command_or_url(job_id) -> None:
    from bridge.adapters.slurm import SlurmAdapter

    adapter = SlurmAdapter(cluster())
    with pytest.raises(InvalidSpec) as refused:
        adapter.ref(job_id)
    assert refused.value.field == "job id"
    with pytest.raises(InvalidSpec):
        adapter.cancel(JobRef("hpc", "slurm", job_id, "", ""))
    assert adapter.ref("123_4").job_id == "123_4" and adapter.ref("77+1").job_id == "77+1"


# --- the operator acts only on what the backend holds for the TrainJob's uid, as its tenant ----------------


class Backend:
    """Jobs by (user, id): what Slurm knows. ``find`` sees the identity's own jobs only, as squeue --me does."""

    backend = "slurm"

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[str, str, JobState]] = {}  # job id -> (user, uid, state)
        self.cancelled: list[tuple[str, str]] = []

    def adapter_for(self, target):
        from bridge.adapters.slurm import SlurmAdapter

        backend = self

        class Adapter(SlurmAdapter):
            """Slurm's rendering; its queue is *backend*, seen as the cluster's user (squeue --me)."""

            user = target.spec.slurm.user if target.spec.slurm else "operator"

            def find(self, identities):
                found = {}
                for job_id, (user, uid, state) in backend.jobs.items():
                    if user == self.user and uid in {i.uid for i in identities}:
                        found[uid] = JobStatus(JobRef(target.name, "slurm", job_id, uid, "train"), state)
                return found

            def poll(self, refs):
                return {ref: JobStatus(ref, backend.jobs.get(ref.job_id, ("", "", JobState.UNKNOWN))[2])
                        for ref in refs}

            def cancel(self, ref, signal=None, grace_seconds=None):
                backend.cancelled.append((self.user, ref.job_id))

            def submit(self, artifact):
                raise AssertionError("nothing is submitted here")

            def changes(self):
                return None

        return Adapter(target)


class Api:
    def __init__(self, clusters) -> None:
        self._clusters = clusters
        self.events: list[tuple[str, str, str]] = []
        self.written: list = []

    def clusters(self):
        return self._clusters

    def credentialed(self, target):
        return target

    def namespace_labels(self, namespace):
        return {}

    def runtime(self, namespace, kind, name):
        return None

    def event(self, namespace, name, uid, reason, message, warning=False) -> None:
        self.events.append((namespace, reason, message))

    def write_conditions(self, namespace, name, uid, conditions) -> None:
        self.written.append((namespace, name, conditions))


def trainjob_body(namespace: str, uid: str, annotations: dict, suspend: bool = False) -> dict:
    return {**trainjob_doc(namespace=namespace, uid=uid, annotations=annotations, suspend=suspend,
                           trainer={"command": ["python3", "train.py"]}),
            "status": {"conditions": [{"type": "Submitted", "status": "True", "reason": "Submitted",
                                       "message": ""}]}}


@pytest.fixture
def two_tenants():
    from bridge.operator.reconciler import Reconciler
    from bridge.operator.sync import Timing

    backend = Backend()
    backend.jobs = {"100": ("alice", UID_A, JobState.RUNNING), "200": ("bob", UID_B, JobState.RUNNING)}
    target = cluster(tenants=[{"name": "a", "namespaces": ["team-a"], "user": "alice"},
                              {"name": "b", "namespaces": ["team-b"], "user": "bob"}])
    reconciler = Reconciler(Api({"hpc": target}), timing=Timing(fast=60, slow=60), adapter_for=backend.adapter_for)
    yield backend, reconciler
    reconciler.shutdown()


FORGED = {"operator.hpcbridge.io/job-id": "100", "operator.hpcbridge.io/job-cluster": "hpc"}


def test_b_deleting_a_trainjob_annotated_with_as_job_cancels_only_bs_own_job(two_tenants) -> None:
    backend, reconciler = two_tenants
    reconciler.delete(trainjob_body("team-b", UID_B, FORGED))
    assert backend.cancelled == [("bob", "200")]  # B's own job, found by B's uid as bob; never job 100
    backend.cancelled.clear()
    # a TrainJob of B that never ran, claiming A's job: nothing is cancelled
    reconciler.delete(trainjob_body("team-b", "0b4c1f7e-0000-4000-8000-0000000000ff", FORGED))
    assert backend.cancelled == []


def test_b_suspending_a_trainjob_annotated_with_as_job_stops_nothing_of_a(two_tenants) -> None:
    backend, reconciler = two_tenants
    reconciler.suspend(trainjob_body("team-b", "0b4c1f7e-0000-4000-8000-0000000000ff", FORGED, suspend=True))
    assert backend.cancelled == []
    assert not any("100" in message for _, _, message in reconciler.api.events)
    # B's own uid but in A's namespace: the namespace maps to alice, whose jobs carry no B uid
    reconciler.suspend(trainjob_body("team-a", UID_B, FORGED, suspend=True))
    assert backend.cancelled == []


def test_a_job_whose_state_is_unknown_is_never_cancelled(two_tenants) -> None:
    backend, reconciler = two_tenants
    backend.jobs["100"] = ("alice", UID_A, JobState.UNKNOWN)
    reconciler.suspend(trainjob_body("team-a", UID_A, {"operator.hpcbridge.io/job-cluster": "hpc"}, suspend=True))
    assert backend.cancelled == []
    backend.jobs["100"] = ("alice", UID_A, JobState.RUNNING)
    reconciler.suspend(trainjob_body("team-a", UID_A, {"operator.hpcbridge.io/job-cluster": "hpc"}, suspend=True))
    assert backend.cancelled == [("alice", "100")]


def test_migrating_with_a_forged_job_id_moves_nothing_of_another_tenant(two_tenants) -> None:
    backend, reconciler = two_tenants
    body = trainjob_body("team-b", "0b4c1f7e-0000-4000-8000-0000000000ff",
                         {**FORGED, "hpcbridge.io/migrate-to": "other", "hpcbridge.io/checkpoint-dir": "/ckpt"})
    reconciler.api._clusters["other"] = cluster(name="other", tenants=[{"name": "b", "namespaces": ["team-b"],
                                                                   "user": "bob"}])
    result = reconciler.migrate(body)
    assert backend.cancelled == [] and result == {"hpcbridge.io/migrate-to": None, "hpcbridge.io/cluster": "other"}
    assert not any("100" in message for _, _, message in reconciler.api.events)


def test_a_namespace_the_cluster_does_not_map_stops_nothing_there(two_tenants) -> None:
    """Suspend and delete look the job up as the namespace's tenant: a namespace that is no tenant of the
    cluster has no identity there, so nothing is cancelled, whatever uid or annotations it shows."""
    backend, reconciler = two_tenants
    reconciler.delete(trainjob_body("team-z", UID_A, FORGED))
    reconciler.suspend(trainjob_body("team-z", UID_A, FORGED, suspend=True))
    assert backend.cancelled == []
