"""The CRD versions this operator understands, checked against the installed CRDs before it starts: an
operator older than its CRDs (an upgrade applied the new CRDs first, or a rollback left them) would read and
write objects in a version whose fields it does not know, so it refuses to start instead."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bridge.operator.kube import BRIDGE_GROUP, BRIDGE_VERSION, TRAINER_GROUP, TRAINER_VERSION

#: CRD name -> the versions this operator can read and write; the first is the one it asks the API server for
UNDERSTOOD: Mapping[str, tuple[str, ...]] = {
    f"trainjobs.{TRAINER_GROUP}": (TRAINER_VERSION,),
    f"trainingruntimes.{TRAINER_GROUP}": (TRAINER_VERSION,),
    f"clustertrainingruntimes.{TRAINER_GROUP}": (TRAINER_VERSION,),
    f"bridgeclusters.{BRIDGE_GROUP}": (BRIDGE_VERSION,),
}


class UnsupportedCrd(Exception):
    """An installed CRD this operator does not understand; the message is the one line it logs."""


def check(crds: Iterable[Mapping[str, Any]]) -> None:
    """Raise UnsupportedCrd for the first of *crds* (CustomResourceDefinitions as dicts) that this operator
    needs and does not understand: the version it speaks is not served, or the version stored is one it does
    not know. CRDs it does not use, and CRDs not installed (the operator waits for them), pass."""
    for crd in crds:
        name = (crd.get("metadata") or {}).get("name", "")
        known = UNDERSTOOD.get(name)
        if known is None:
            continue
        versions = (crd.get("spec") or {}).get("versions") or []
        served = [v.get("name") for v in versions if v.get("served")]
        stored = [v.get("name") for v in versions if v.get("storage")]
        if known[0] not in served:
            raise UnsupportedCrd(f"CRD {name} serves {', '.join(map(str, served)) or 'no version'}; this operator "
                                 f"reads {known[0]}: install the operator release that matches the CRDs")
        unknown = [v for v in stored if v not in known]
        if unknown:
            raise UnsupportedCrd(f"CRD {name} stores version {unknown[0]}, which this operator does not "
                                 f"understand (it knows {', '.join(known)}): install the operator release that "
                                 "matches the CRDs")


def check_installed(api_client: Any) -> None:
    """``check`` against the CRDs the API server has (the operator's RBAC lets it list them)."""
    from kubernetes import client

    listed = client.ApiextensionsV1Api(api_client).list_custom_resource_definition()
    check(api_client.sanitize_for_serialization(item) for item in listed.items)
