"""``--dry-run`` is the first half of ``submit`` on Flux too (where flux-core is on PATH): against the suite's
live Flux instance (two brokers, their cores and two GPUs each), a dry run and a real submit exit with the same
code, notes and error line (what Flux cannot express, a queue the instance does not have, a TrainJob that
already ran there), a TrainJob whose job is still there is found by both, and the jobspec the dry run printed is
the one submit handed the Flux adapter. Both transports (the flux command, flux-python) on one instance, the
second finding the first's jobs. The cases are the subset of the corpus the Kubernetes agreement test runs
(tests/integration/kubernetes/test_dry_run_agreement_kubernetes.py). Jobs start ``true launch …`` where they
would start ``hpcbridge launch …``: each runs its whole allocation and ends at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge import service
from bridge.adapters.base import Artifact
from tests import builders
from tests.integration.kubernetes.test_dry_run_agreement_kubernetes import FILES
from tests.integration.test_dry_run_agreement import ROOT, configured, recording, run_cli, sent_text

pytestmark = [pytest.mark.integration, pytest.mark.flux]

COUNTED: dict[str, int] = {"agreed": 0, "refused": 0, "existing": 0}


@pytest.fixture
def sent(flux_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Artifact]:  # type: ignore[no-untyped-def]
    """The cluster ``flux``: the suite's instance over each transport (``flux_cluster``, which skips flux-python
    where its bindings do not import), its jobs starting ``true launch``; the artifacts FluxAdapter.submit is
    handed."""
    from bridge.adapters.flux import FluxAdapter
    from bridge.api.loader import to_yaml

    flux = builders.cluster("flux", "flux", flux=flux_cluster.spec.flux.model_dump(by_alias=True, exclude_none=True),
                            defaults={"launchCommand": ["true", "launch"]})
    configured(monkeypatch, tmp_path, to_yaml([flux]), tmp_path)
    return recording(monkeypatch, FluxAdapter)[0]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dry_run_and_submit_agree_on_flux(path: Path, sent: list[Artifact]) -> None:
    file = str(path)
    dry = run_cli(["submit", file, "--cluster", "flux", "--dry-run"])
    real = run_cli(["submit", file, "--cluster", "flux"])
    assert (real.code, real.errors) == (dry.code, dry.errors), (dry, real)
    if dry.code:
        COUNTED["refused"] += 1
        assert real.err == dry.err, (dry.err, real.err)
        return
    assert real.err.startswith(dry.err), (dry.err, real.err)
    if "nothing was submitted" in real.err:  # the other transport's run left this uid's job pending or running
        COUNTED["existing"] += 1
        assert not sent and "nothing was submitted" in dry.err, (dry.err, real.err)
        return
    COUNTED["agreed"] += 1
    assert sent, "submit exited 0 and sent nothing"
    assert sent_text(sent, dry.out, fresh_uids=service.read_input(file, ()).script is not None) == dry.out


def test_the_cases_were_counted() -> None:
    """Printed with -s: how many cases agreed on a submitted job and how many on a refusal; both kinds ran."""
    print(f"\nFlux dry-run/submit agreement: {COUNTED['agreed']} submitted, {COUNTED['refused']} refused by both, "
          f"{COUNTED['existing']} found already there by both")
    if sum(COUNTED.values()):
        assert COUNTED["agreed"] and COUNTED["refused"], COUNTED
