"""bridge/annotations.py owns the annotation, label and finalizer names hpc-bridge uses, its own and those of
Kubeflow Trainer, Kueue, JobSet and the coscheduling plugin: no other module of bridge/ spells one out, and
docs/annotations.md lists every one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bridge
from bridge import annotations

BRIDGE = Path(bridge.__file__).resolve().parent
OWNER = BRIDGE / "annotations.py"
DOC = BRIDGE.parent / "docs" / "annotations.md"

#: an hpc-bridge name in a string: ``hpcbridge.io/…`` and the subdomains hpc-bridge writes under
#: (``operator.hpcbridge.io/…``, ``feature.hpcbridge.io/…``), up to the first character a key cannot hold
NAME = re.compile(r"(?:[a-z0-9-]+\.)*hpcbridge\.io/[A-Za-z0-9_.-]*")
#: ``hpcbridge.io/`` strings that are not annotations, labels or finalizers, and so are owned elsewhere: the
#: API version of BridgeCluster (bridge.api.cluster), the spec.managedBy value of hpc-bridge's TrainJobs
#: (bridge.api.trainjob), and the server-side-apply field manager of `hpcbridge convert` (bridge.convert)
NOT_NAMES = frozenset({"hpcbridge.io/v1alpha1", "hpcbridge.io/bridge", "hpcbridge.io/convert"})
#: another project's label or annotation name: under the domains of the projects hpc-bridge reads and writes for
FOREIGN_NAME = re.compile(r"(?:trainer\.kubeflow\.org|kueue\.x-k8s\.io|jobset\.sigs\.k8s\.io|scheduling\.x-k8s\.io)"
                          r"/[A-Za-z0-9_.-]*")
#: strings under those domains that are not labels or annotations, owned where they are used: API versions and
#: groups (bridge.api), spec.managedBy values (bridge.api.trainjob), Kueue's field manager (bridge.operator.kueue)
FOREIGN_NOT_NAMES = frozenset({"trainer.kubeflow.org/v1alpha1", "trainer.kubeflow.org/",
                               "trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue",
                               "kueue.x-k8s.io/manager"})


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes: prose about a name, not a use of it."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def spelled_names(source: str, pattern: re.Pattern[str] = NAME,
                  allowed: frozenset[str] = NOT_NAMES) -> list[tuple[int, str]]:
    """(line, name) for every name *pattern* finds in a string literal of *source* (f-string parts included),
    docstrings and comments aside."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return sorted((node.lineno, name) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            for name in pattern.findall(node.value) if name not in allowed)


def test_no_module_but_the_owner_spells_a_name():
    found = [f"{path.relative_to(BRIDGE.parent)}:{line}: {name!r}"
             for path in sorted(BRIDGE.rglob("*.py")) if path != OWNER
             for line, name in spelled_names(path.read_text())]
    assert not found, "import these from bridge.annotations instead:\n" + "\n".join(found)


def test_no_module_but_the_owner_spells_another_projects_label():
    found = [f"{path.relative_to(BRIDGE.parent)}:{line}: {name!r}"
             for path in sorted(BRIDGE.rglob("*.py")) if path != OWNER
             for line, name in spelled_names(path.read_text(), FOREIGN_NAME, FOREIGN_NOT_NAMES)]
    assert not found, "import these from bridge.annotations instead:\n" + "\n".join(found)


def test_the_check_sees_literals_and_f_string_parts_but_not_docstrings():
    source = ('"""About ``hpcbridge.io/cluster``."""\n'
              'A = "hpcbridge.io/cluster"\n'
              'B = f"metadata.annotations[hpcbridge.io/{knob}]"\n'
              'C = "operator.hpcbridge.io/job-id"\n'
              'D = "hpcbridge.io/v1alpha1"  # hpcbridge.io/cluster\n'
              'def f():\n    """hpcbridge.io/workdir"""\n    return "x hpcbridge.io/sbatch.* y"\n')
    assert spelled_names(source) == [(2, "hpcbridge.io/cluster"), (3, "hpcbridge.io/"),
                                     (4, "operator.hpcbridge.io/job-id"), (8, "hpcbridge.io/sbatch.")]


def _names() -> dict[str, str]:
    return {const: value for const, value in vars(annotations).items()
            if const.isupper() and isinstance(value, str)}


def test_every_name_is_defined_once_and_documented():
    names = _names()
    values = list(names.values())
    assert len(values) == len(set(values)), f"one name under two constants: {names}"
    doc = DOC.read_text()
    missing = [f"{const} = {value}" for const, value in names.items() if f"`{value}" not in doc]
    assert not missing, f"docs/annotations.md does not list: {missing}"


def test_the_knobs_are_the_prefix_and_their_names():
    assert all(key == annotations.PREFIX + knob
               for key, knob in zip(annotations.KNOB_ANNOTATIONS, annotations.KNOBS, strict=True))
    assert len(set(annotations.KNOBS)) == len(annotations.KNOBS)
