"""Backends by name, imported lazily so the CLI loads only the one it uses."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bridge.backends import REGISTRY
from bridge.errors import InvalidSpec

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter
    from bridge.api.cluster import BridgeCluster

__all__ = ["REGISTRY", "adapter_class", "get_adapter"]


def adapter_class(backend: str) -> type[Adapter]:
    try:
        target = REGISTRY[backend]
    except KeyError:
        raise InvalidSpec("backend", backend, f"unknown backend; known: {', '.join(REGISTRY)}") from None
    module_name, class_name = target.split(":")
    adapter: type[Adapter] = getattr(importlib.import_module(module_name), class_name)
    return adapter


def get_adapter(cluster: BridgeCluster) -> Adapter:
    return adapter_class(cluster.spec.type)(cluster)
