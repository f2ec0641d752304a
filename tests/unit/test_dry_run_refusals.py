"""What the local cluster refuses, it refuses while preparing (issue 40: ``--dry-run`` is the first half of
submit), and ``--cluster auto`` takes it for what it runs: each test here failed before, when the GPU and
working-directory checks ran only in the adapter's submit and its capacity counted node-sized CPU shares.
tests/integration/test_dry_run_agreement.py runs dry runs and real submits side by side over every corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bridge import service
from bridge.adapters.local import LocalAdapter
from bridge.annotations import WORKDIR_ANNOTATION
from bridge.errors import InvalidSpec
from tests.builders import cluster, trainjob_doc

ROOT = Path(__file__).resolve().parents[2]
FOUR_GPUS = ["0", "1", "2", "3"]


def _source(nodes: int = 2, gpus: int = 0, cpu: str | None = None,
            annotations: dict[str, str] | None = None) -> service.Input:
    limits = {**({"nvidia.com/gpu": gpus} if gpus else {}), **({"cpu": cpu} if cpu else {})}
    trainer = {"numNodes": nodes, "command": ["true"], **({"resourcesPerNode": {"limits": limits}} if limits else {})}
    doc = trainjob_doc("job", trainer=trainer, annotations=annotations)
    return service.read_input("-", stdin=yaml.safe_dump(doc))


def _local(gpus: list[str]) -> dict[str, object]:
    return {"local": cluster("local", "local", gpus=gpus)}


def test_a_gpu_job_the_machine_cannot_hold_is_refused_by_the_dry_run_as_by_submit() -> None:
    """2 nodes x 2 GPUs on a machine with none: the dry run printed a layout that submit then refused."""
    with pytest.raises(InvalidSpec) as refused:
        service.prepare(_source(gpus=2), cluster="local", configured=_local([]))
    assert refused.value.exit_code == 2
    assert str(refused.value) == ("spec.trainer.resourcesPerNode: needs 4 GPUs; this machine has 0 (the cluster's "
                                  "gpus) (got '2 nodes x 2 GPUs')")
    prepared = service.prepare(_source(gpus=2), cluster="local", configured=_local(FOUR_GPUS))
    assert prepared.plan.nodes == 2 and prepared.artifact.kind == "process-layout"


def test_auto_takes_the_local_cluster_for_the_gpu_jobs_it_runs_and_refuses_the_rest_alike() -> None:
    """Auto counted a GPU job as fitting no node of the local cluster, whatever GPUs the machine lends."""
    chosen = service.prepare(_source(gpus=2), cluster="auto", configured=_local(FOUR_GPUS))
    assert chosen.plan.cluster == "local" and chosen.notes[0] == "placement: chose local (starts now)"
    with pytest.raises(InvalidSpec) as refused:
        service.prepare(_source(gpus=2), cluster="auto", configured=_local(["0"]))
    assert "local (local): cannot run — spec.trainer.resourcesPerNode: needs 4 GPUs; this machine has 1" \
           in str(refused.value)


def test_auto_takes_the_local_cluster_for_nodes_larger_than_a_share_of_its_cpus() -> None:
    """The emulated nodes share the machine's CPUs, as many as a job asks: the main example (2 nodes x 2 ranks)
    ran on the local cluster by name, but auto refused it on a 2-CPU machine ("needs 2 nodes, 1 could ever
    take one"); a node asking 1000 CPUs was refused on every machine."""
    example = service.read_input(str(ROOT / "examples" / "mpi-allreduce.yaml"))
    assert service.prepare(example, cluster="auto", configured=_local([])).plan.cluster == "local"
    big = service.prepare(_source(cpu="1000"), cluster="auto", configured=_local([]))
    assert big.plan.cluster == "local" and big.notes[0] == "placement: chose local (starts now)"


def test_a_working_directory_the_machine_lacks_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """The dry run printed the layout; submit then failed with "workdir … does not exist" (exit 1)."""
    missing = str(tmp_path / "nowhere")
    with pytest.raises(InvalidSpec) as refused:
        service.prepare(_source(annotations={WORKDIR_ANNOTATION: missing}), cluster="local", configured=_local([]))
    assert refused.value.exit_code == 2
    assert refused.value.field == f"metadata.annotations[{WORKDIR_ANNOTATION}]" and refused.value.value == missing


def test_local_capacity_is_what_submit_starts() -> None:
    """Every node a CPU job asks for; a GPU job's nodes while the machine's GPUs go round, else the reason."""
    prepared = service.prepare(_source(nodes=3, gpus=1), cluster="local", configured=_local(FOUR_GPUS))
    adapter = prepared.adapter
    assert isinstance(adapter, LocalAdapter)
    fits = adapter.capacity(prepared.plan)
    assert (fits.free, fits.fitting, fits.limit) == (4, 4, None)
    short = LocalAdapter(cluster("local", "local", gpus=["0", "1"])).capacity(prepared.plan)
    assert (short.fitting, short.limit) == (0, "needs 3 GPUs; this machine has 2 (the cluster's gpus)")
    cpu_only = service.prepare(_source(nodes=5, cpu="1000"), cluster="local", configured=_local([]))
    assert cpu_only.adapter.capacity(cpu_only.plan).fitting >= 5
