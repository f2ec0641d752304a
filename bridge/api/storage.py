"""Where an initializer's ``storageUri`` points, parsed once for the plan (validation) and the stage step
(download). Pure: no network, no filesystem.

Kubeflow's initializers read ``hf://`` and ``s3://``; hpc-bridge adds ``file://`` and plain absolute paths for
data already on the cluster's shared storage, and ``pvc://`` where there are volumes (Kubernetes).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

#: scheme → where it can be read
SCHEMES = {"hf": "every backend", "s3": "every backend", "file": "every backend", "pvc": "Kubernetes only"}
#: pvc://claim/path on Kubernetes: the claim's volume in the initializer pod, and where it is mounted
PVC_SOURCE_VOLUME = "initializer-source"
PVC_SOURCE_MOUNT = "/mnt/initializer-source"
#: the two initializers, in the order they run (Kubeflow's replicated job and container names)
ROLES = ("dataset", "model")


@dataclass(frozen=True)
class StorageLocation:
    scheme: str
    #: hf: the repository id (org/name); s3: the bucket; pvc: the claim; file: "" (the path is all)
    authority: str
    #: hf: a path inside the repository (datasets: ignored, as by Kubeflow); s3: the key prefix; file: the path
    path: str

    @property
    def is_local_path(self) -> bool:
        return self.scheme == "file"


def parse_storage_uri(uri: str, role: str = "dataset") -> StorageLocation:
    """*uri* as the stage step reads it; ValueError with the reason when it names nothing readable."""
    if uri.startswith("/"):
        uri = "file://" + uri
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {parts.scheme!r}: use one of " + ", ".join(f"{s}://" for s in SCHEMES)
                         + " or an absolute path")
    if parts.query or parts.fragment:
        raise ValueError("a storage URI has no query or fragment")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError("file:// names a path on the cluster's shared storage: file:///path (no host)")
        path = unquote(parts.path)
        if not path.startswith("/") or "\x00" in path:
            raise ValueError("file:// needs an absolute path")
        return StorageLocation("file", "", posixpath.normpath(path))
    if not parts.netloc:
        raise ValueError(f"{scheme}:// needs a {'repository' if scheme == 'hf' else 'bucket' if scheme == 's3' else 'name'}")
    segments = [s for s in unquote(parts.path).split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError("'.' and '..' are not path segments of a storage URI")
    if scheme == "hf":
        if not segments:
            raise ValueError("hf:// needs org/name, e.g. hf://meta-llama/Llama-3.2-1B")
        # Kubeflow: a dataset is netloc/first segment (the rest is ignored); a model is netloc/path
        repo = f"{parts.netloc}/{segments[0]}" if role == "dataset" else "/".join([parts.netloc, *segments])
        return StorageLocation("hf", repo, "/".join(segments[1:]) if role == "dataset" else "")
    return StorageLocation(scheme, parts.netloc, "/".join(segments))


#: an initializer's secretRef name off Kubernetes: one file name in the secrets folder (a tenant's: its
#: namespace's folder), never a path
SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")


def secret_name_problem(name: str) -> str | None:
    """Why *name* cannot name a secret file, or None."""
    if not SECRET_NAME.fullmatch(name) or ".." in name:
        return "must be a file name: letters, digits and _ . - (no '/', no '..')"
    return None


@dataclass(frozen=True)
class StageSource:
    """One initializer: what the trainer needs before it starts (Kubeflow's ``spec.initializer.<role>``)."""

    #: "dataset" or "model"
    role: str
    uri: str
    #: the initializer's own env (Kubeflow's ENDPOINT, ACCESS_KEY_ID, IGNORE_PATTERNS…), in order
    env: tuple[tuple[str, str], ...] = ()
    #: Kubernetes: a Secret the initializer container reads (envFrom); elsewhere ``<secretsDir>/<name>`` on the
    #: node (a tenant's job: ``<secretsDir>/<namespace>/<name>``, its own namespace's only)
    secret: str | None = None

    @property
    def container(self) -> str:
        return f"{self.role}-initializer"
