"""Every backend's artifact for the reference plans, byte for byte (tests/golden, --update-golden)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from bridge.adapters import adapter_class
from bridge.adapters.base import set_options
from bridge.api.catalog import builtin_runtimes
from bridge.api.cluster import BridgeCluster
from bridge.api.loader import load_file
from bridge.errors import InvalidSpec
from bridge.plan import find_runtime, resolve
from tests import builders

CASES = Path(__file__).resolve().parent.parent / "cases"
CASE_NAMES = ["torch-cpu-2nodes", "mpi-4x2-openmpi", "gpu-8x4-queue", "hostile", "flux-2x4", "steps-script",
              "xgboost-2x2-gpus", "mpi-2x4-gpus2", "gang-coscheduling", "gang-volcano", "initializers"]
SUFFIX = {"slurm": "sbatch", "flux": "jobspec.json", "kubernetes": "jobset.yaml", "local": "local.yaml"}
#: what a case's Kubernetes cluster has (its gang scheduler)
KUBERNETES = {"gang-coscheduling": {"gangScheduler": "coscheduling"},
              "gang-volcano": {"gangScheduler": "volcano", "queue": "team-a"}}


#: the HPC clusters' shared storage for staged data (a blank in it: every use must be quoted)
STAGING_DIR = "/shared/hpcbridge staging"


def cluster(kind: str, case: str = "") -> BridgeCluster:
    spec: dict = {}
    if kind != "kubernetes":
        spec["stagingDir"] = STAGING_DIR
    if kind == "kubernetes" and case in KUBERNETES:
        spec["kubernetes"] = KUBERNETES[case]
    return builders.cluster(kind, f"test-{kind}", **spec)


def plan_for(case: str, kind: str):
    """The case's TrainJob (its first document) on its runtime: one the file carries, else a built-in."""
    trainjob, *runtimes = load_file(CASES / f"{case}.yaml")
    return resolve(trainjob, find_runtime(trainjob, [*runtimes, *builtin_runtimes()]), cluster(kind, case))


@pytest.mark.parametrize("backend", list(SUFFIX))
@pytest.mark.parametrize("case", CASE_NAMES)
def test_artifact_matches_golden(case: str, backend: str, golden) -> None:
    """What `render` prints for each case. Where the backend lacks an option the case sets, the golden file
    starts with the one-line refusal, then pins the artifact of the same plan without those options."""
    plan = plan_for(case, backend)
    adapter = adapter_class(backend)(cluster(backend, case))
    refusal = ""
    try:
        adapter.check_options(plan)
    except InvalidSpec as exc:
        refusal = f"# refused: {exc}\n"
        declared = {option.name for option in adapter.options}
        cleared = {name: None for name, _ in set_options(plan) if name not in declared and name != "sbatch"}
        cleared = {name: (False if name == "exclusive" else None) for name in cleared}
        if "sbatch" not in declared:
            cleared["sbatch_extra"] = ()
        plan = dataclasses.replace(plan, options=dataclasses.replace(plan.options, **cleared))
        adapter.check_options(plan)
    golden(f"{case}.{SUFFIX[backend]}", refusal + adapter.render(plan).text())


@pytest.mark.parametrize("backend", list(SUFFIX))
def test_render_is_deterministic(backend: str) -> None:
    texts = {adapter_class(backend)(cluster(backend)).render(plan_for("hostile", backend)).text() for _ in range(3)}
    assert len(texts) == 1


def _bash_env_after(script: str) -> dict[str, str]:
    """Run the script's export lines in bash and read the resulting environment back."""
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    out = subprocess.run(["bash", "-c", exports + "\nenv -0"], capture_output=True, check=True, env={}).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def test_hostile_slurm_values_stay_literal(tmp_path: Path) -> None:
    plan = plan_for("hostile", "slurm")
    script = adapter_class("slurm")(cluster("slurm")).render(plan).main
    # no value can open a directive or a line of its own
    directive_lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert not any("stolen" in line for line in directive_lines)
    # the #SBATCH block is exactly the renderer's directives, each on one line, nothing smuggled in
    from bridge.adapters.slurm.render import directives

    assert len(directive_lines) == len(directives(plan))
    assert [line.split("=", 1)[0] for line in directive_lines] == [f"#SBATCH --{name}" for name, _ in directives(plan)]
    assert sum(1 for line in script.splitlines() if "stolen" in line) == 2  # inside $'…' on the export/exec lines
    env = _bash_env_after(script)
    for entry in plan.env:
        assert env[entry.name] == entry.value
    # the exec line, parsed by bash, yields the command verbatim after "--"
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    printed = subprocess.run(["bash", "-c", "printf '%s\\0' " + exec_line[len("exec "):]], capture_output=True,
                             check=True).stdout.decode().split("\0")[:-1]
    assert printed[printed.index("--") + 1:] == list(plan.command)
    assert not Path("/tmp/pwned").exists()


def test_hostile_flux_script_and_jobspec_literal() -> None:
    plan = plan_for("hostile", "flux")
    spec = json.loads(adapter_class("flux")(cluster("flux")).render(plan).main)
    assert spec["attributes"]["system"]["environment"]["MULTILINE"] == "first\n#SBATCH --account=stolen\nexport X=1"
    env = _bash_env_after(spec["attributes"]["system"]["files"]["script"]["data"])
    assert env["EVIL"] == plan.env[0].value


def test_hostile_kubernetes_values_round_trip() -> None:
    from bridge.adapters.kubernetes.render import launched_command

    plan = plan_for("hostile", "kubernetes")
    docs = list(yaml.safe_load_all(adapter_class("kubernetes")(cluster("kubernetes")).render(plan).main))
    jobset = docs[-1]
    launcher = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "launcher")
    node = launcher["template"]["spec"]["template"]["spec"]["containers"][0]
    assert launched_command(node) == list(plan.command)
    env = {e["name"]: e.get("value") for e in node["env"]}
    assert env["MULTILINE"] == "first\n#SBATCH --account=stolen\nexport X=1"
