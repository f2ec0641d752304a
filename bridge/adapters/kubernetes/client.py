"""Talking to a Kubernetes API server: the official client, imported only here (never at CLI start-up).

Importing this module is what needs the kubernetes extra: without it, the import raises MissingExtra, one
line naming the extra. Rendering manifests needs no client and never imports this module.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from bridge.errors import BackendRejected, BackendUnavailable
from bridge.extras import MissingExtra

try:
    # the adapter takes the client's modules from here, so that this is the one place it can be missing
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException, ApiValueError
    from urllib3.exceptions import HTTPError
except ImportError:
    raise MissingExtra("kubernetes", "the Kubernetes backend") from None

if TYPE_CHECKING:
    from bridge.api.cluster import KubernetesConnection

__all__ = ["ApiException", "CLIENT_ERRORS", "api_client", "client", "translate"]


def api_client(connection: KubernetesConnection | None) -> Any:
    """An ApiClient for the cluster's connection: in-cluster, or a kubeconfig (file and context)."""
    try:
        if connection is not None and connection.in_cluster:
            config.load_incluster_config()
            return client.ApiClient()
        kubeconfig = connection.kubeconfig if connection and connection.kubeconfig else None
        return config.new_client_from_config(config_file=os.path.expanduser(kubeconfig)
                                             if kubeconfig else None,
                                             context=connection.context if connection else None)
    except config.ConfigException as exc:
        raise BackendUnavailable("kubernetes", f"no usable kubeconfig: {exc}") from None
    except OSError as exc:
        raise BackendUnavailable("kubernetes", f"kubeconfig: {exc}") from None


#: what the client raises for an API answer or a transport failure (translate() types them)
CLIENT_ERRORS: tuple[type[Exception], ...] = (ApiException, ApiValueError, HTTPError, OSError)


def translate(exc: Exception, what: str) -> Exception:
    """ApiException and connection errors → our typed errors (4xx permanent, 5xx/transport retryable)."""
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        try:
            import json

            message = json.loads(exc.body or "{}").get("message") or message
        except (ValueError, TypeError):
            pass
        if exc.status in (None, 0, 429) or (exc.status or 0) >= 500:
            return BackendUnavailable("kubernetes", f"{what}: HTTP {exc.status}: {message}")
        return BackendRejected("kubernetes", f"{what}: HTTP {exc.status}: {message}")
    if isinstance(exc, ApiValueError):  # the client refused the request before sending it
        return BackendRejected("kubernetes", f"{what}: {exc}")
    return BackendUnavailable("kubernetes", f"{what}: {exc}")  # connection refused, reset, timed out, TLS
