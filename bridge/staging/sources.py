"""Reading a storage URI: what version it names now (one metadata request) and its download.

The settings are Kubeflow's initializer variables, from the initializer's env and its secret: ``ENDPOINT``,
``ACCESS_KEY_ID``, ``SECRET_ACCESS_KEY``, ``REGION`` (S3), ``ACCESS_TOKEN`` (Hugging Face), ``IGNORE_PATTERNS``;
whatever they leave unset, boto3 and huggingface_hub take from the process environment as usual (``AWS_*``,
``HF_ENDPOINT``, ``HF_TOKEN``). boto3 and huggingface_hub are imported only by the source that needs them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import TYPE_CHECKING, Any

from bridge.api.storage import StorageLocation
from bridge.extras import MissingExtra

if TYPE_CHECKING:
    from boto3.session import Session

#: Kubeflow's model initializer keeps weights in these formats only, and skips the rest by default
HF_MODEL_ALLOW = ("*.json", "*.safetensors", "*.model", "*.txt")
HF_MODEL_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
#: parallel object downloads from S3 (each also multipart for large objects)
S3_WORKERS = 8


class StageError(Exception):
    """A source that cannot be read: the initializer fails with this reason."""


@dataclass(frozen=True)
class Resolved:
    #: what identifies the content now: the cache key hangs on it
    version: str
    #: what of the source is taken (patterns): part of the key too
    selection: tuple[object, ...]
    download: Callable[[Path], None]
    #: a path already on shared storage, used in place (file://): nothing to download or cache
    in_place: Path | None = None
    #: where the bytes come from (the endpoint that answered, the bucket or repository): part of the key, so
    #: a listing from one endpoint is never taken for another endpoint's content
    origin: Mapping[str, str] = field(default_factory=dict)


def _patterns(settings: Mapping[str, str], default: tuple[str, ...]) -> tuple[str, ...]:
    raw = settings.get("IGNORE_PATTERNS")
    return tuple(p.strip() for p in raw.split(",") if p.strip()) if raw else default


def resolve(location: StorageLocation, role: str, settings: Mapping[str, str]) -> Resolved:
    if location.scheme == "file":
        path = Path(location.path)
        if not path.exists():
            raise StageError(f"{location.path} does not exist (on {os.uname().nodename})")
        return Resolved("", (), lambda _into: None, in_place=path)
    if location.scheme == "pvc":
        return _claim(location)
    if location.scheme == "hf":
        return _huggingface(location, role, settings)
    if location.scheme == "s3":
        return _s3(location, role, settings)
    raise StageError(f"{location.scheme}:// cannot be staged here")


def _claim(location: StorageLocation) -> Resolved:
    """pvc://claim/path, in an initializer pod whose claim is mounted (the JobSet renderer mounts it)."""
    from bridge.api.storage import PVC_SOURCE_MOUNT

    mount = Path(PVC_SOURCE_MOUNT)
    source = mount / location.path if location.path else mount
    if not mount.is_dir():
        raise StageError(f"claim {location.authority!r} is not mounted at {PVC_SOURCE_MOUNT} (pvc:// is read in an "
                         "initializer pod of a Kubernetes cluster)")
    if not source.exists():
        raise StageError(f"{location.path or '/'} does not exist on claim {location.authority!r}")

    def download(into: Path) -> None:
        import shutil

        if source.is_dir():
            shutil.copytree(source, into, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(source, into / source.name)

    return Resolved("", (), download)


def _huggingface(location: StorageLocation, role: str, settings: Mapping[str, str]) -> Resolved:
    # progress bars are for terminals; the stage step writes to a job's log, and says the totals itself
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    except ImportError:
        raise StageError(str(MissingExtra("staging", "an hf:// source", where="where the stage step runs"))) from None
    endpoint = settings.get("HF_ENDPOINT") or os.environ.get("HF_ENDPOINT") or None
    token = settings.get("ACCESS_TOKEN") or settings.get("HF_TOKEN") or None
    repo_type = "dataset" if role == "dataset" else "model"
    allow = None if role == "dataset" else list(HF_MODEL_ALLOW)
    ignore = list(_patterns(settings, () if role == "dataset" else HF_MODEL_IGNORE)) or None
    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.repo_info(location.authority, repo_type=repo_type)
    except RepositoryNotFoundError:
        raise StageError(f"no {repo_type} repository {location.authority!r} on the hub "
                         f"({endpoint or 'huggingface.co'})") from None
    except (HfHubHTTPError, OSError) as exc:
        raise StageError(f"the hub ({endpoint or 'huggingface.co'}) did not answer: {_first_line(exc)}") from None
    revision = info.sha or ""

    def download(into: Path) -> None:
        try:
            snapshot_download(location.authority, repo_type=repo_type, revision=revision or None, local_dir=into,
                              allow_patterns=allow, ignore_patterns=ignore, token=token, endpoint=endpoint)
        except (HfHubHTTPError, OSError) as exc:
            raise StageError(f"download from the hub failed: {_first_line(exc)}") from None
        # huggingface_hub's own bookkeeping for a local_dir download; the trainer reads only the files
        bookkeeping = into / ".cache"
        if bookkeeping.is_dir():
            import shutil

            shutil.rmtree(bookkeeping, ignore_errors=True)

    # the endpoint the client actually asked (HF_ENDPOINT, or the hub's default), not just what was given
    origin = {"endpoint": str(api.endpoint).rstrip("/"), "repo": location.authority, "type": repo_type}
    return Resolved(revision, (repo_type, allow, ignore), download, origin=origin)


def _s3(location: StorageLocation, role: str, settings: Mapping[str, str]) -> Resolved:
    try:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise StageError(str(MissingExtra("staging", "an s3:// source", where="where the stage step runs"))) from None
    if settings.get("ROLE_ARN"):
        raise StageError("ROLE_ARN: assuming a role is Kubernetes' (IRSA); give ACCESS_KEY_ID and "
                         "SECRET_ACCESS_KEY in the initializer's secret instead")
    client = _boto3_session(boto3).client(
        "s3", endpoint_url=settings.get("ENDPOINT") or None, region_name=settings.get("REGION") or None,
        aws_access_key_id=settings.get("ACCESS_KEY_ID") or None,
        aws_secret_access_key=settings.get("SECRET_ACCESS_KEY") or None)
    bucket, prefix = location.authority, location.path
    ignore = _patterns(settings, ())
    objects = _s3_objects(client, bucket, prefix, ignore)
    if not objects:
        raise StageError(f"no objects under s3://{bucket}/{prefix}")
    digest = hashlib.sha256()
    for _key, relative, etag, size in sorted(objects, key=lambda o: o[1]):
        digest.update(f"{relative}\t{etag}\t{size}\n".encode())
    transfer = TransferConfig(max_concurrency=S3_WORKERS, multipart_chunksize=16 * 1024 * 1024)

    def fetch(into: Path, key: str, relative: str) -> None:
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target), Config=transfer)

    def download(into: Path) -> None:
        try:
            with ThreadPoolExecutor(max_workers=min(S3_WORKERS, len(objects))) as pool:
                for future in [pool.submit(fetch, into, key, relative) for key, relative, _e, _s in objects]:
                    future.result()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise StageError(f"S3 download failed: {error.get('Code')}: {error.get('Message') or ''}") from None
        except BotoCoreError as exc:
            raise StageError(f"S3 download failed: {_first_line(exc)}") from None

    # the endpoint boto3 resolved (ENDPOINT, AWS_ENDPOINT_URL*, or the region's), not just what was given
    origin = {"endpoint": str(client.meta.endpoint_url).rstrip("/"), "region": str(client.meta.region_name or ""),
              "bucket": bucket, "prefix": prefix}
    return Resolved(digest.hexdigest(), ("s3", ignore), download, origin=origin)


def _s3_objects(client: Any, bucket: str, prefix: str, ignore: tuple[str, ...]) -> list[tuple[str, str, str, int]]:
    """The objects the URI names, as (key, relative path, etag, size): the one object *prefix* is, or those
    under it as a directory, less the ignored ones."""
    from botocore.exceptions import BotoCoreError, ClientError

    objects: list[tuple[str, str, str, int]] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/"):
                    continue  # a "directory" marker
                if key == prefix:
                    relative = PurePosixPath(key).name  # the URI names one object
                elif not prefix or key.startswith(prefix + "/"):
                    relative = key[len(prefix):].lstrip("/")
                else:
                    continue  # s3://b/data must not take s3://b/database/…
                if any(fnmatch.fnmatch(relative, pattern) for pattern in ignore):
                    continue
                objects.append((key, _safe_relative(key, relative), item.get("ETag", ""), item.get("Size", 0)))
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise StageError(f"S3 refused listing s3://{bucket}/{prefix}: {error.get('Code')}: "
                         f"{error.get('Message') or ''}".rstrip(": ")) from None
    except BotoCoreError as exc:
        raise StageError(f"S3 did not answer: {_first_line(exc)}") from None
    return objects


_SESSIONS: list[Session] = []


def _boto3_session(boto3: ModuleType) -> Session:
    """One boto3 session per process: making one loads botocore's service models (~60 ms), a client from it
    then costs ~3 ms; a stage step with an S3 dataset and an S3 model pays once."""
    if not _SESSIONS:
        _SESSIONS.append(boto3.session.Session())
    return _SESSIONS[0]


def _safe_relative(key: str, relative: str) -> str:
    """An object's path inside the staged directory; a key that would land outside it is refused."""
    parts = PurePosixPath(relative).parts
    if not relative or relative.startswith("/") or any(p in ("..", ".") for p in parts) or "\x00" in relative:
        raise StageError(f"object key {key!r} does not name a file inside the staged directory")
    return relative


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
