"""Kubernetes backend: JobSets in Kubeflow's conventions (DESIGN §5). The client is imported only to talk."""

from __future__ import annotations

from bridge.adapters.base import Adapter, Artifact, ArtifactFile
from bridge.adapters.kubernetes.render import render_manifests
from bridge.plan import LaunchPlan


class KubernetesAdapter(Adapter):
    backend = "kubernetes"

    def render(self, plan: LaunchPlan) -> Artifact:
        return Artifact("kubernetes", "jobset", plan,
                        (ArtifactFile(f"{plan.name}.jobset.yaml", render_manifests(plan), "application/yaml"),))
