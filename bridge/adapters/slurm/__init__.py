"""Slurm backend: batch scripts for sbatch (DESIGN §5)."""

from __future__ import annotations

from bridge.adapters.base import Adapter, Artifact, ArtifactFile
from bridge.adapters.slurm.render import render_script
from bridge.plan import LaunchPlan


class SlurmAdapter(Adapter):
    backend = "slurm"

    def render(self, plan: LaunchPlan) -> Artifact:
        return Artifact("slurm", "sbatch-script", plan,
                        (ArtifactFile(f"{plan.name}.sbatch", render_script(plan), "text/x-shellscript"),))
