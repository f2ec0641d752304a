"""Rendered jobspecs against our RFC 14/25 validator, and the validator against what the RFCs forbid."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bridge.adapters.flux.validate import validate_jobspec
from bridge.errors import InvalidSpec

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SPECS = sorted(GOLDEN.glob("*.jobspec.json"))


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_golden_jobspec_is_valid(path: Path) -> None:
    # a golden file may start with the refusal of an option the flux backend lacks (test_render_golden)
    text = "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("# refused:"))
    validate_jobspec(json.loads(text))


def test_batch_and_direct_shapes() -> None:
    batch = json.loads((GOLDEN / "mpi-4x2-openmpi.jobspec.json").read_text())
    assert batch["tasks"][0]["command"] == ["flux", "broker", "{{tmpdir}}/script"]
    assert batch["attributes"]["system"]["files"]["script"]["data"].startswith("#!/bin/bash\n")
    direct = json.loads((GOLDEN / "flux-2x4.jobspec.json").read_text())
    node = direct["resources"][0]
    assert (node["count"], node["with"][0]["count"]) == (2, 4)  # flux run -N2 -n8
    assert direct["tasks"][0]["command"] == ["lmp", "-in", "in.reaxff.hns"]
    assert direct["attributes"]["user"]["hpcbridge"]["uid"] == "0b7f9d2e-0000-4000-8000-000000000005"


def test_gpus_reach_every_task_flux_starts() -> None:
    """Flux gives a task no GPU unless it asks (gpu-affinity then sets CUDA_VISIBLE_DEVICES=-1): the flux policy
    asks per task, or per node when the GPUs don't split over the ranks; each node's launch asks for all of the
    node's GPUs; MPI ranks ask per node."""
    import dataclasses

    from bridge.adapters.flux.render import batch_script, direct_jobspec
    from bridge.api.catalog import builtin_runtimes
    from bridge.api.loader import load_file
    from bridge.mpi import launchers
    from bridge.mpi.discovery import Topology
    from bridge.plan import find_runtime, resolve
    from tests.builders import cluster as build_cluster

    cluster = build_cluster("flux", "f")
    trainjob = load_file(GOLDEN.parent / "cases" / "flux-2x4.yaml")[0]
    plan = resolve(trainjob, find_runtime(trainjob, builtin_runtimes()), cluster)
    even = direct_jobspec(plan)["resources"][0]["with"][0]
    assert (even["count"], even["with"][1]) == (4, {"type": "gpu", "count": 1})  # 4 GPUs, 4 ranks
    uneven = direct_jobspec(dataclasses.replace(plan, resources=dataclasses.replace(plan.resources, gpus=2)))
    slot = uneven["resources"][0]["with"][0]
    assert (slot["count"], slot["with"][1], uneven["tasks"][0]["count"]) == (
        1, {"type": "gpu", "count": 2}, {"per_slot": 4})  # 2 GPUs shared by the node's 4 ranks
    xgb = load_file(GOLDEN.parent / "cases" / "xgboost-2x2-gpus.yaml")[0]
    script = batch_script(resolve(xgb, find_runtime(xgb, builtin_runtimes()), cluster))
    assert "exec flux run --nodes=2 --ntasks=2 --cores-per-task=4 --gpus-per-task=2 hpcbridge launch" in script
    assert launchers.flux_run_argv(Topology(("a", "b"), 0, 4), ["x"], 2) == [
        "flux", "run", "--nodes=2", "--tasks-per-node=4", "--gpus-per-node=2", "x"]


BASE = json.loads((GOLDEN / "flux-2x4.jobspec.json").read_text())


def broken(mutate):
    spec = copy.deepcopy(BASE)
    mutate(spec)
    return spec


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda s: s.pop("attributes"), "jobspec"),
    (lambda s: s.update(extra=1), "jobspec"),
    (lambda s: s.update(version=2), "jobspec.version"),
    (lambda s: s["resources"].append(copy.deepcopy(s["resources"][0])), "jobspec.resources"),
    (lambda s: s["resources"][0].update(type="socket"), "jobspec.resources[0].type"),
    (lambda s: s["resources"][0].update(count=0), "jobspec.resources[0].count"),
    (lambda s: s["resources"][0].update(count="1-4"), "jobspec.resources[0].count"),
    (lambda s: s["resources"][0]["with"][0].pop("label"), "jobspec.resources[0].with[0].label"),
    (lambda s: s["resources"][0]["with"][0]["with"].pop(0), "jobspec.resources"),
    (lambda s: s["tasks"][0].update(slot="nope"), "jobspec.tasks[0].slot"),
    (lambda s: s["tasks"][0].update(count={"per_slot": 2}), "jobspec.tasks[0].count.per_slot"),
    (lambda s: s["tasks"][0].update(count={"per_slot": 1, "total": 2}), "jobspec.tasks[0].count"),
    (lambda s: s["tasks"][0].update(command=[]), "jobspec.tasks[0].command"),
    (lambda s: s["attributes"]["system"].pop("duration"), "jobspec.attributes.system.duration"),
    (lambda s: s["attributes"]["system"].update(duration=-1), "jobspec.attributes.system.duration"),
    (lambda s: s["attributes"]["system"].update(cwd="relative"), "jobspec.attributes.system.cwd"),
    (lambda s: s["attributes"]["system"].update(environment={"A": 1}), "jobspec.attributes.system.environment.A"),
    (lambda s: s["attributes"].update(other={}), "jobspec.attributes"),
])
def test_validator_rejects(mutate, field) -> None:
    with pytest.raises(InvalidSpec) as info:
        validate_jobspec(broken(mutate))
    assert info.value.field == field


@pytest.mark.parametrize(("job_id", "number"), [
    # decimal values from flux-core 0.88's own `flux job id --to=dec`
    ("ƒfdmMW5d", 1470741086208), ("ƒdshYwpj", 1403749662720), ("ƒ2RyHVBf1", 3158575330532),
    ("fffff", 7544330), ("f1", 0), ("1470741086208", 1470741086208),
])
def test_f58_job_ids_read_as_flux_reads_them(job_id: str, number: int) -> None:
    from bridge.adapters.flux import f58_number

    assert f58_number(job_id) == number


def test_the_newer_of_two_jobs_is_the_larger_id_when_one_starts_with_the_digit_f() -> None:
    from bridge.adapters.flux import f58_number

    # the conformance suite's rerun (ƒfdm…) was taken for older than the first run (ƒdsh…)
    assert f58_number("ƒfdmMW5d") > f58_number("ƒdshYwpj")
