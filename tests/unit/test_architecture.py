"""docs/architecture.md, checked: a backend added the way the document says works through the orchestration
layer, the import graph of bridge/ follows the layer diagram, and comments point only inside the repository."""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

import bridge
from bridge import service
from bridge.adapters import REGISTRY
from bridge.adapters.base import JobState
from bridge.api.cluster import BridgeCluster
from bridge.errors import InvalidSpec

# --- how to add a backend ----------------------------------------------------------------------------------

#: the toy backend's package, as docs/architecture.md ("How to add a backend") says to write one: an Adapter
#: subclass whose render is pure and whose submit sends exactly the artifact (here: into a dict)
TOY_PACKAGE = '''
"""A backend that keeps its jobs in memory: the smallest complete Adapter."""

from __future__ import annotations

import itertools

from bridge.adapters.base import (Adapter, Artifact, ArtifactFile, Capabilities, Capacity, JobRef, JobState,
                                  JobStatus, NodeNeed, OptionSpec)

#: what submit sent, by job id: the same for every adapter of this process, as a scheduler's queue would be
SENT: dict[str, dict] = {}
_IDS = itertools.count(1)


class ToyAdapter(Adapter):
    backend = "toy"
    capabilities = Capabilities(signals=False, hold=False, follow_logs=False)
    options = (OptionSpec("partition", "the toy's queue name"),)

    def render(self, plan) -> Artifact:
        text = f"toy job {plan.name} uid={plan.uid} nodes={plan.nodes} argv={list(plan.command)!r}\\n"
        if plan.options.partition:
            text += f"queue {plan.options.partition}\\n"
        return Artifact("toy", "text", plan, (ArtifactFile("job.toy", text),))

    def submit(self, artifact: Artifact) -> JobRef:
        job_id = str(next(_IDS))
        plan = artifact.plan
        SENT[job_id] = {"text": artifact.main, "uid": plan.uid, "name": plan.name, "state": JobState.RUNNING}
        return self.ref_of(job_id)

    def ref_of(self, job_id: str) -> JobRef:
        job = SENT[job_id]
        return JobRef(self.cluster.name, self.backend, job_id, job["uid"], job["name"])

    def status_of(self, job_id: str) -> JobStatus:
        return JobStatus(self.ref_of(job_id), SENT[job_id]["state"])

    def find(self, identities):
        wanted = {identity.uid for identity in identities}
        return {job["uid"]: self.status_of(job_id) for job_id, job in SENT.items() if job["uid"] in wanted}

    def poll(self, refs):
        return {ref: self.status_of(ref.job_id) if ref.job_id in SENT else JobStatus(ref, JobState.UNKNOWN)
                for ref in refs}

    def wait(self, ref, timeout=None):
        return self.poll([ref])[ref]

    def cancel(self, ref, signal=None, grace_seconds=None) -> None:
        if signal is not None:
            raise self.unsupported("cancel --signal", "the toy stops jobs only")
        if ref.job_id in SENT:
            SENT[ref.job_id]["state"] = JobState.CANCELLED

    def logs(self, ref, follow=False):
        return iter(())

    def list_jobs(self):
        return [self.status_of(job_id) for job_id in SENT]

    def capacity(self, plan) -> Capacity:
        return Capacity(free=1, fitting=1, detail=f"one toy node for {NodeNeed.of(plan).text()}")

    def check(self) -> str:
        return "toy: in memory"
'''

TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: toy-runtime}
spec: {mlPolicy: {numNodes: 1}}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: hello-toy
  annotations: {hpcbridge.io/partition: small}
spec:
  runtimeRef: {name: toy-runtime}
  trainer: {numNodes: 2, command: [echo, hello]}
"""


def toy_cluster(name: str) -> BridgeCluster:
    """A configured cluster of type ``toy``: a type because the registry has its line, nothing else added."""
    return BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                         "metadata": {"name": name}, "spec": {"type": "toy"}})


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy backend added as the document says: its package (here written into tmp_path, on sys.path) and
    one line in the registry. Yields the package's module once the service has imported it."""
    package = tmp_path / "toybackend"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(TOY_PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the service's durable record, per test
    monkeypatch.setitem(REGISTRY, "toy", "toybackend:ToyAdapter")  # the one registry line (bridge/backends.py)
    yield lambda: sys.modules["toybackend"]
    sys.modules.pop("toybackend", None)


def test_a_backend_added_as_the_document_says_renders_and_submits_through_the_service(toy) -> None:
    configured = {"toys": toy_cluster("toys")}
    source = service.read_input("-", stdin=TRAINJOB)
    prepared = service.prepare(source, cluster="toys", configured=configured)
    assert type(prepared.adapter).__module__ == "toybackend"
    assert prepared.artifact.main == (f"toy job hello-toy uid={prepared.plan.uid} nodes=2 argv=['echo', 'hello']\n"
                                      "queue small\n")
    # render is pure: the same plan renders the same artifact again
    assert prepared.adapter.render(prepared.plan) == prepared.artifact

    first = service.submit(prepared)
    sent = toy().SENT
    assert not first.existing and sent[first.ref.job_id]["text"] == prepared.artifact.main
    # the service finds the job by its uid: a second submit of the same TrainJob sends nothing
    again = service.submit(service.prepare(source, cluster="toys", configured=configured))
    assert again.existing and again.ref.job_id == first.ref.job_id and len(sent) == 1
    assert [s.state for s in service.status(prepared.adapter, [first.ref.job_id])] == [JobState.RUNNING]
    service.cancel(prepared.adapter, [first.ref.job_id])
    assert service.status(prepared.adapter, [first.ref.job_id])[0].state == JobState.CANCELLED


def test_an_option_the_toy_does_not_declare_is_refused_before_anything_is_sent(toy) -> None:
    docs = list(yaml.safe_load_all(TRAINJOB))
    docs[1]["metadata"]["annotations"] = {"hpcbridge.io/account": "physics"}
    with pytest.raises(InvalidSpec, match=r"\(toy\) has no account option \(it understands: partition\)"):
        service.prepare(service.read_input("-", stdin=yaml.safe_dump_all(docs)), cluster="toys",
                        configured={"toys": toy_cluster("toys")})
    assert toy().SENT == {}


# --- the import graph ----------------------------------------------------------------------------------------

BRIDGE = Path(bridge.__file__).resolve().parent

#: the layers of docs/architecture.md, lowest first: a module may import from its own layer and the ones below
LAYERS: tuple[tuple[str, ...], ...] = (
    ("bridge", "bridge.annotations", "bridge.backends", "bridge.errors", "bridge.extras", "bridge.envnames", "bridge.sbatch", "bridge.shell"),  # foundation ("bridge": the package itself)
    ("bridge.api",),  # wire objects
    ("bridge.plan", "bridge.convert", "bridge.staging", "bridge.tenancy", "bridge.placement", "bridge.records"),
    ("bridge.adapters", "bridge.mpi"),  # backends, and what runs on the nodes
    ("bridge.service",),  # orchestration
    ("bridge.cli", "bridge.operator", "bridge.__main__"),  # front ends
)

#: findings the rules know about and allow for now, each with a comment naming the issue that removes it:
#: (kind, text as the test reports it), kind one of "cycle", "private", "upward". None at present.
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(BRIDGE.rglob("*.py")):
        parts = list(path.relative_to(BRIDGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer_of(module: str) -> int:
    """The layer of the longest LAYERS prefix that names *module* or a package above it."""
    best, where = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, where = len(prefix), index
    assert where is not None, f"{module} is in no layer of docs/architecture.md: place it in LAYERS and the page"
    return where


class Import(NamedTuple):
    importer: str
    target: str  # the module imported from
    name: str | None  # the name taken from it (from-imports and attribute reads), else None
    line: int


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer.split(".") if MODULES[importer].name == "__init__.py" else importer.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str) -> list[Import]:
    """Every import of a bridge module in *module* — module level, in functions, under TYPE_CHECKING — and every
    attribute read through a name bound to a bridge module (``plan._x`` after ``from bridge import plan``)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: list[Import] = []
    bound: dict[str, str] = {}  # local name → the bridge module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "bridge" or alias.name.startswith("bridge."):
                    found.append(Import(module, alias.name, None, node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = "bridge"
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if source != "bridge" and not source.startswith("bridge."):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    found.append(Import(module, submodule, None, node.lineno))
                    bound[alias.asname or alias.name] = submodule
                else:
                    found.append(Import(module, source, alias.name, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                dotted.insert(0, value.attr)
                value = value.value
            if not isinstance(value, ast.Name) or value.id not in bound:
                continue
            target = bound[value.id]
            for part in dotted[:-1]:  # bridge.adapters.base._x: walk down the submodules named
                if f"{target}.{part}" not in MODULES:
                    break
                target = f"{target}.{part}"
            else:
                found.append(Import(module, target, dotted[-1], node.lineno))
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def _private(name: str | None) -> bool:
    return bool(name) and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    edges = {module: sorted({i.target for i in GRAPH[module] if i.target in MODULES and i.target != module})
             for module in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    return found


def all_findings() -> set[tuple[str, str]]:
    """What breaks a rule, as (kind, text): cycles, private names taken from another module, upward imports."""
    found = {("cycle", " <-> ".join(cycle)) for cycle in _cycles()}
    for module in MODULES:
        for i in GRAPH[module]:
            if _private(i.name) and i.target != module:
                found.add(("private", f"{i.importer} takes {i.name} from {i.target}"))
            if i.target in MODULES and layer_of(i.target) > layer_of(module):
                found.add(("upward", f"{i.importer} imports {i.target}"))
    return found


FINDINGS = all_findings()


def _new(kind: str) -> list[str]:
    return sorted(text for found, text in FINDINGS - KNOWN_EXCEPTIONS if found == kind)


def test_the_reader_sees_every_kind_of_import() -> None:
    """The rules hold only if the reader finds what they forbid, wherever it is written."""
    service_imports = {(i.target, i.name) for i in GRAPH["bridge.service.targets"]}
    assert ("bridge.errors", "InvalidSpec") in service_imports  # at module level
    assert ("bridge.adapters", "get_adapter") in service_imports  # inside a function, under another name
    assert ("bridge.adapters.base", None) in {(i.target, None) for i in GRAPH["bridge.adapters"]}  # TYPE_CHECKING
    assert ("bridge.service", "submit") in {(i.target, i.name) for i in GRAPH["bridge.cli.submit"]}  # service.submit


def test_no_import_cycle_among_the_modules_of_bridge() -> None:
    assert _new("cycle") == []


def test_no_module_imports_another_modules_private_names() -> None:
    assert _new("private") == []


def test_no_layer_imports_a_layer_above_it() -> None:
    assert _new("upward") == []


def test_every_known_exception_is_still_there() -> None:
    """An exception that no longer occurs leaves the list, so the list never allows more than it says."""
    assert KNOWN_EXCEPTIONS - FINDINGS == set()


# --- comments point inside the repository ----------------------------------------------------------------------

#: how a pointer out of the repository was written: a design document's sections, the workspace beside the checkout
_OUTSIDE = re.compile(r"DESIGN(\.md| §)|reference §|\.\./shared/|/work/shared/|shared/(infra|reference)/")


def test_comments_and_documents_point_only_inside_the_repository() -> None:
    root = BRIDGE.parent
    files = [*(path for folder in ("bridge", "tests", "bench", "scripts") for path in (root / folder).rglob("*.py")),
             *(root / "docs").glob("*.md"), root / "README.md"]
    here = Path(__file__).resolve()
    found = [f"{path.relative_to(root)}:{number}: {line.strip()[:100]}"
             for path in files if path.resolve() != here
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if _OUTSIDE.search(line)]
    assert found == []


def test_a_cluster_type_is_a_registered_backend_and_nothing_else() -> None:
    """spec.type is checked against the registry when a BridgeCluster is read, not against a list of its own."""
    with pytest.raises(ValueError, match=r"Input should be 'local', 'slurm', 'flux' or 'kubernetes'"):
        toy_cluster("toys")
