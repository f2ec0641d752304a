"""Two tenants on one shared Slurm cluster through the operator: the real API server, real Slurm, two Unix users.

Namespace A maps to Unix user hpcb-alice, namespace B to hpcb-bob (a BridgeCluster's ``spec.tenants``); the
operator (as its ServiceAccount) reaches Slurm through the local transport and acts for each tenant through the
sudoers rule the project ships (contrib/sudoers.d/hpcbridge), installed here as a site would install it. B tries
what a hostile tenant would: A's job id in its own annotations, then suspend and delete; an account outside its
mapping; a namespace no tenant maps.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.kubernetes.test_operator import (
    GROUP,
    ROOT,
    VERSION,
    Operator,
    _apply_kustomization,
    condition,
    is_true,
    plain_runtime,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

USERS = {"a": "hpcb-alice", "b": "hpcb-bob"}
TENANT_GROUP = "hpcb-tenants"
SUDOERS = Path("/etc/sudoers.d/hpcbridge-tests")


def _ensure_users() -> None:
    try:
        grp.getgrnam(TENANT_GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", TENANT_GROUP], check=True)
    for user in USERS.values():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--gid", TENANT_GROUP, user],
                           check=True)
        # no password, but not locked ('!'): sshd without PAM refuses any login to a locked account
        subprocess.run(["usermod", "--password", "*", user], check=True)


def _install_sudoers(install=None) -> None:
    """The shipped rule, with this machine's operator user (root) and the tests' tenant group; for another Slurm
    release (HPCBRIDGE_SLURM), its commands where a site would install them: the rule's paths and sudo's
    secure_path name the release's bin/."""
    text = (ROOT / "contrib" / "sudoers.d" / "hpcbridge").read_text()
    operator_user = pwd.getpwuid(os.geteuid()).pw_name
    text = text.replace("%hpcbridge-tenants", f"%{TENANT_GROUP}").replace("\nhpcbridge ALL", f"\n{operator_user} ALL")
    if install is not None:
        for command in ("sbatch", "squeue", "scancel", "scontrol", "sacct", "sinfo"):
            text = text.replace(f"/usr/bin/{command},", f"{install.bin_dir}/{command},")
        text += (f'Defaults:{operator_user} secure_path="{install.bin_dir}:/usr/local/sbin:/usr/local/bin:'
                 '/usr/sbin:/usr/bin:/sbin:/bin"\n')
    candidate = SUDOERS.with_suffix(".new")
    candidate.write_text(text)
    candidate.chmod(0o440)
    checked = subprocess.run(["visudo", "-cf", str(candidate)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    candidate.replace(SUDOERS)


def _traversable(paths: list[Path]) -> list[tuple[Path, int]]:
    """Let other users traverse to *paths* (the Python the jobs start, the checkout, the Slurm config): each
    folder on the way gets o+x where it lacks it; returns what to put back."""
    changed = []
    for path in paths:
        for folder in [*reversed(path.parents), path]:
            mode = folder.stat().st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                changed.append((folder, stat.S_IMODE(mode)))
                folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


@pytest.fixture(scope="module")
def tenant_machine(slurm_cluster):
    """The tenants' Unix users, the shipped sudoers rule, and what they need to reach (the Python and checkout the
    jobs run, the Slurm config, a shared work folder); all put back afterwards, even when setting up fails."""
    if shutil.which("sudo") is None:
        pytest.fail("sudo is not installed: scripts/setup.sh --all installs it")
    _ensure_users()
    import bridge

    changed: list[tuple[Path, int]] = []
    workdir = Path(tempfile.mkdtemp(prefix="hpcbridge-tenants-"))
    conf_mode = stat.S_IMODE(slurm_cluster.conf.stat().st_mode)
    try:
        _install_sudoers(slurm_cluster.install)
        release = [slurm_cluster.install.bin_dir] if slurm_cluster.install else []
        changed += _traversable([Path(os.path.realpath(sys.executable)).parent, Path(sys.prefix),
                                 Path(bridge.__file__).resolve().parent, slurm_cluster.conf.parent, *release])
        slurm_cluster.conf.chmod(0o644)
        workdir.chmod(0o1777)  # both users write their job's output here
        for user in USERS.values():  # each can start the Python the jobs run
            ran = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", "import bridge.mpi"],
                                 capture_output=True, text=True, cwd=workdir)
            assert ran.returncode == 0, ran.stderr
        yield workdir, changed
    finally:
        SUDOERS.unlink(missing_ok=True)
        for folder, mode in reversed(changed):
            folder.chmod(mode)
        slurm_cluster.conf.chmod(conf_mode)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(real_kube, slurm_cluster, netns_slurm, netns_hosts, tenant_machine, tmp_path_factory):
    """The operator, tenants A and B on BridgeClusters `shared-hpc` (the local Slurm client through sudo),
    `shared-rest` (slurmrestd) and `shared-ssh`, and namespace C that no tenant maps."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    workdir, changed = tenant_machine
    base = tmp_path_factory.mktemp("tenants")
    admin = real_kube.api_client()
    _apply_kustomization(admin, ROOT / "manifests" / "operator")
    admin.close()
    op = Operator(real_kube, slurm_cluster, base)
    namespaces = {tenant: op.namespace() for tenant in ("a", "b", "c")}
    tenants = [{"name": "team-a", "namespaces": [namespaces["a"]], "user": USERS["a"], "accounts": ["proj-a"]},
               {"name": "team-b", "namespaces": [namespaces["b"]], "user": USERS["b"], "accounts": ["proj-b"]}]
    defaults = {"partition": "debug", "workdir": str(workdir),
                "launchCommand": [sys.executable, "-m", "bridge", "launch"]}
    # slurmrestd with auth/jwt: the SlurmUser's token (root here) in the operator's credentials Secret acts for
    # each tenant's user, named per request
    rest_url = slurm_cluster.rest_url or slurm_cluster.start_rest()
    _credential(op, "slurmuser-jwt", slurm_cluster.token("root"))
    # a Kubernetes cluster both tenants share: each one's JobSets in its own namespace, under the default policy
    pods = {"kubeconfig": str(real_kube.kube.kubeconfig), "imagePullPolicy": "Never",
            "images": {"hpcbridge.test/plain": real_kube.images["node"].ref}}
    op.define_clusters({
        "shared-pods": {"type": "kubernetes", "kubernetes": pods,
                        "tenants": [{"name": f"team-{t}", "namespaces": [namespaces[t]]} for t in ("a", "b")]},
        "shared-hpc": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                       "defaults": defaults, "tenants": tenants},
        "shared-rest": {"type": "slurm", "slurm": {
            "transport": "rest", "restUrl": rest_url, "user": "root", "slurmConf": str(slurm_cluster.conf),
            "tokenSecretRef": {"name": "hpcbridge-credentials", "key": "slurmuser-jwt"}},
            "defaults": defaults, "tenants": tenants}})
    try:
        client.CustomObjectsApi(op.api).create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes",
                                                                     plain_runtime("plain-slurm"))
    except ApiException as exc:
        assert exc.status == 409, exc.body
    op.workdir = workdir
    _over_ssh(op, namespaces, netns_slurm, netns_hosts, tmp_path_factory.mktemp("tenant-keys"), changed)
    op.start()
    try:
        yield op, namespaces
    finally:
        op.close()


def _over_ssh(op: Operator, ns: dict, netns_slurm, netns_hosts, keys: Path, changed: list) -> None:
    """BridgeCluster `shared-ssh`: Slurm on the emulated hosts, its login host node-0 reached over SSH; each
    tenant logs in as its own user with its own key (sshd takes a user's keys from authorized_keys.<user>)."""
    for tenant, user in USERS.items():
        key = keys / f"team-{tenant}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user, "-f", str(key)], check=True)
        authorized = Path(f"{netns_hosts.authorized_keys}.{user}")
        authorized.write_text(Path(f"{key}.pub").read_text())
        authorized.chmod(0o644)  # sshd reads a user's keys as that user
        _credential(op, f"team-{tenant}-key", key.read_text())
    changed += _traversable([netns_hosts.authorized_keys.parent, netns_slurm.conf.parent])
    netns_slurm.conf.chmod(0o644)
    _credential(op, "root-key", netns_hosts.client_key.read_text())
    _credential(op, "known-hosts", netns_hosts.known_hosts.read_text())
    ref = {"name": "hpcbridge-credentials"}
    op.define_clusters({"shared-ssh": {
        "type": "slurm", "slurm": {
            "transport": "ssh", "host": netns_hosts.host("node-0").ip, "user": "root",
            "slurmConf": str(netns_slurm.conf), "keySecretRef": {**ref, "key": "root-key"},
            "knownHostsSecretRef": {**ref, "key": "known-hosts"}},
        "defaults": {"workdir": str(op.workdir), "launchCommand": [sys.executable, "-m", "bridge", "launch"]},
        "tenants": [{"name": f"team-{tenant}", "namespaces": [ns[tenant]], "user": user,
                     "accounts": [f"proj-{tenant}"],
                     "credentials": {"keySecretRef": {**ref, "key": f"team-{tenant}-key"}}}
                    for tenant, user in USERS.items()]}})


def _credential(op: Operator, key: str, value: str) -> None:
    """*key* in the operator's one credentials Secret (its Role reads that Secret by name, nothing else)."""
    from kubernetes.client.exceptions import ApiException

    try:
        op.core.create_namespaced_secret("hpcbridge-system", {
            "metadata": {"name": "hpcbridge-credentials"}, "type": "Opaque", "stringData": {key: value}})
    except ApiException as exc:
        assert exc.status == 409, exc.body
        op.core.patch_namespaced_secret("hpcbridge-credentials", "hpcbridge-system", {"stringData": {key: value}})


def apply(op: Operator, namespace: str, name: str, command: list[str], annotations: dict | None = None,
          cluster: str = "shared-hpc") -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "annotations": {"hpcbridge.io/cluster": cluster, **(annotations or {})}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain-slurm"},
                     "trainer": {"numNodes": 1, "command": command}}}
    return op.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body)


def job_field(op: Operator, job_id: str, key: str) -> str:
    """A field of `scontrol show job`, on the Slurm cluster the test's BridgeCluster reaches."""
    env = {**op.env, "SLURM_CONF": str(getattr(op, "slurm_conf", op.slurm.conf))}
    shown = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True,
                           env=env).stdout
    return next((f.split("=", 1)[1] for f in shown.split() if f.startswith(f"{key}=")), "")


@pytest.fixture(params=["shared-hpc", "shared-rest", "shared-ssh"])
def cluster(request, shared, netns_slurm):
    """Each way the operator reaches Slurm: the local client through sudo, slurmrestd, SSH as the tenant."""
    op, _ = shared
    if request.param == "shared-ssh":
        op.slurm_conf = netns_slurm.conf
    yield request.param
    op.__dict__.pop("slurm_conf", None)


def job_id_of(obj: dict) -> str:
    return obj["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]


def test_each_namespace_runs_as_its_tenants_unix_user(shared, cluster) -> None:
    op, ns = shared
    name = f"whoami-{cluster}"
    apply(op, ns["a"], name, ["sh", "-c", "id -un"], cluster=cluster)
    apply(op, ns["b"], name, ["sh", "-c", "id -un"], cluster=cluster)
    for tenant in ("a", "b"):
        done = op.until(ns[tenant], name, is_true("Complete"))
        job_id = job_id_of(done)
        assert job_field(op, job_id, "UserId").startswith(f"{USERS[tenant]}("), job_id
        assert job_field(op, job_id, "Account") == f"proj-{tenant}"


def test_b_cannot_stop_as_job_through_annotations_suspend_or_delete(shared, cluster) -> None:
    op, ns = shared
    long, decoy = f"long-{cluster}", f"decoy-{cluster}"
    apply(op, ns["a"], long, ["sleep", "300"], cluster=cluster)
    a_job = job_id_of(op.until(ns["a"], long, is_true("Running")))
    assert job_field(op, a_job, "UserId").startswith(f"{USERS['a']}(")
    forged = {"operator.hpcbridge.io/job-id": a_job, "operator.hpcbridge.io/job-cluster": cluster}
    apply(op, ns["b"], decoy, ["sleep", "300"], annotations=forged, cluster=cluster)
    b_job = job_id_of(op.until(ns["b"], decoy, lambda o: is_true("Running")(o) and
                               job_id_of(o) != a_job))
    # B writes A's job id back over its own record, as a tenant may, then suspends and deletes
    op.custom.patch_namespaced_custom_object(GROUP, VERSION, ns["b"], "trainjobs", decoy,
                                             {"metadata": {"annotations": forged}})
    op.suspend(ns["b"], decoy, True)
    op.until(ns["b"], decoy, is_true("Suspended"))
    deadline = time.monotonic() + 60
    while job_field(op, b_job, "JobState") not in ("CANCELLED", "COMPLETED"):  # B's own job is what stops
        assert time.monotonic() < deadline, op.logs()
        time.sleep(0.3)
    assert job_field(op, a_job, "JobState") == "RUNNING"
    op.custom.delete_namespaced_custom_object(GROUP, VERSION, ns["b"], "trainjobs", decoy)
    time.sleep(3)
    assert job_field(op, a_job, "JobState") == "RUNNING"
    assert not any(a_job in message for _, _, message in op.events(ns["b"], decoy))
    # A's own delete cancels A's job, as hpcb-alice
    op.custom.delete_namespaced_custom_object(GROUP, VERSION, ns["a"], "trainjobs", long)
    deadline = time.monotonic() + 60
    while job_field(op, a_job, "JobState") != "CANCELLED":
        assert time.monotonic() < deadline, op.logs()
        time.sleep(0.3)


def test_a_namespace_no_tenant_maps_and_an_account_outside_the_mapping_are_refused(shared) -> None:
    op, ns = shared
    created = apply(op, ns["c"], "stranger", ["true"])
    failed = condition(op.until(ns["c"], "stranger", is_true("Failed")), "Failed")
    assert failed["reason"] == "NamespaceNotAllowed" and ns["c"] in failed["message"], failed
    assert op.slurm_jobs(created["metadata"]["uid"]) == []
    created = apply(op, ns["b"], "borrow", ["true"], annotations={"hpcbridge.io/account": "proj-a"})
    failed = condition(op.until(ns["b"], "borrow", is_true("Failed")), "Failed")
    assert failed["reason"] == "InvalidTrainJob" and "hpcbridge.io/account" in failed["message"], failed
    assert op.slurm_jobs(created["metadata"]["uid"]) == []
    created = apply(op, ns["b"], "elsewhere", ["true"], annotations={"hpcbridge.io/sbatch.reservation": "maint"})
    failed = condition(op.until(ns["b"], "elsewhere", is_true("Failed")), "Failed")
    assert "hpcbridge.io/sbatch.reservation" in failed["message"], failed
    assert op.slurm_jobs(created["metadata"]["uid"]) == []


def test_a_planted_secret_reaches_only_its_job(shared, cluster) -> None:
    """A value in a tenant's TrainJob env reaches its job's processes and nothing else the operator writes or
    runs: not the batch script Slurm keeps, `scontrol show job -dd`, any process's command line while the job
    runs, the operator's log, the TrainJob's Events or status, or the metrics."""
    import urllib.request
    import uuid

    op, ns = shared
    planted = f"planted-{uuid.uuid4().hex}"
    name = f"secret-{cluster}"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "annotations": {"hpcbridge.io/cluster": cluster}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain-slurm"},
                     "trainer": {"numNodes": 1, "env": [{"name": "API_TOKEN", "value": planted}],
                                 "command": ["sh", "-c", 'sleep 4; echo "token length ${#API_TOKEN}"']}}}
    op.custom.create_namespaced_custom_object(GROUP, VERSION, ns["a"], "trainjobs", body)
    job_id = job_id_of(op.until(ns["a"], name, is_true("Running")))
    env = {**op.env, "SLURM_CONF": str(getattr(op, "slurm_conf", op.slurm.conf))}
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    shown = subprocess.run(["scontrol", "-dd", "show", "job", job_id], capture_output=True, text=True,
                           env=env).stdout
    script = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True,
                            env=env).stdout
    done = op.until(ns["a"], name, is_true("Complete"))
    out = Path(op.workdir) / f"hpcbridge-{name}-{job_id}.out"
    assert f"token length {len(planted)}" in out.read_text()  # the job had it, whole
    assert "hpcbridge launch" in script or "bridge launch" in script, script  # the script was read
    metrics = urllib.request.urlopen(f"http://{op.metrics}/metrics", timeout=10).read().decode()
    # what the operator wrote on the TrainJob: its status and its own annotations (kopf's copy of the spec the
    # tenant wrote holds the value as the spec does, for whoever may read the TrainJob anyway)
    written = {"status": done.get("status"), "annotations": {
        key: value for key, value in done["metadata"]["annotations"].items()
        if key != "operator.hpcbridge.io/last-handled-configuration"}}
    seen = {"processes": processes, "scontrol -dd": shown, "batch script": script, "operator log": op.logs(None),
            "events": repr(op.events(ns["a"], name)), "trainjob": repr(written), "metrics": metrics}
    assert [where for where, text in seen.items() if planted in text] == []


def test_on_a_shared_kubernetes_cluster_each_tenants_pods_run_in_its_namespace_within_the_policy(shared) -> None:
    """Real kubelet pods: B's TrainJob runs as a JobSet in B's namespace, never elsewhere; a TrainJob of B whose
    runtime asks for the node's network, or for A's Secret, is refused naming the field, and nothing is created."""
    from kubernetes import client

    op, ns = shared
    apply(op, ns["b"], "pods-ok", ["sh", "-c", "echo hello from b"], cluster="shared-pods")
    done = op.until(ns["b"], "pods-ok", is_true("Complete"), timeout=180)
    assert job_id_of(done) == f"{ns['b']}/pods-ok"
    core = client.CoreV1Api(op.api)
    pods = core.list_namespaced_pod(ns["b"], label_selector="jobset.sigs.k8s.io/jobset-name=pods-ok").items
    assert pods and all(pod.metadata.namespace == ns["b"] for pod in pods)
    runtime = plain_runtime("host-network")
    runtime["kind"] = "TrainingRuntime"
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "hostNetwork"] = True
    op.custom.create_namespaced_custom_object(GROUP, VERSION, ns["b"], "trainingruntimes", runtime)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": "pods-host", "annotations": {"hpcbridge.io/cluster": "shared-pods"}},
            "spec": {"managedBy": "hpcbridge.io/bridge",
                     "runtimeRef": {"name": "host-network", "kind": "TrainingRuntime"},
                     "trainer": {"numNodes": 1, "command": ["true"]}}}
    op.custom.create_namespaced_custom_object(GROUP, VERSION, ns["b"], "trainjobs", body)
    failed = condition(op.until(ns["b"], "pods-host", is_true("Failed")), "Failed")
    assert failed["reason"] == "InvalidTrainJob" and "hostNetwork" in failed["message"], failed
    # A's Secret, named by B's TrainJob
    core.create_namespaced_secret(ns["a"], {"metadata": {"name": "a-token"}, "stringData": {"token": "a's"}})
    body["metadata"]["name"] = "pods-steal"
    body["spec"]["runtimeRef"] = {"name": "plain-slurm"}
    body["spec"]["trainer"]["env"] = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "a-token",
                                                                                    "key": "token"}}}]
    op.custom.create_namespaced_custom_object(GROUP, VERSION, ns["b"], "trainjobs", body)
    submitted = op.until(ns["b"], "pods-steal", is_true("Submitted"))
    # its JobSet is in B's namespace, where a-token does not exist: the reference cannot reach A's Secret
    assert job_id_of(submitted) == f"{ns['b']}/pods-steal"
    custom = client.CustomObjectsApi(op.api)
    assert custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns["a"], "jobsets")["items"] == []
    op.custom.delete_namespaced_custom_object(GROUP, VERSION, ns["b"], "trainjobs", "pods-steal")
