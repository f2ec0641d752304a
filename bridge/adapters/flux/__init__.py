"""Flux backend: jobspec v1 batch allocations (DESIGN §5). flux-python is imported only to talk to Flux."""

from __future__ import annotations

from bridge.adapters.base import Adapter, Artifact, ArtifactFile
from bridge.adapters.flux.render import render_jobspec
from bridge.plan import LaunchPlan


class FluxAdapter(Adapter):
    backend = "flux"

    def render(self, plan: LaunchPlan) -> Artifact:
        return Artifact("flux", "jobspec", plan, (ArtifactFile(f"{plan.name}.jobspec.json", render_jobspec(plan),
                                                               "application/json"),))
