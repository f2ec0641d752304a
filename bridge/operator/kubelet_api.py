"""The kubelet API of the virtual nodes, served by the operator over HTTPS: what ``kubectl logs`` and the Kubeflow
SDK reach through the API server for a stand-in pod (``GET /containerLogs/{namespace}/{pod}/{container}``), and
``/healthz``.

As a kubelet with ``--anonymous-auth=false`` and ``--authorization-mode=Webhook``: a request without a client
certificate the API server's client CA signed is 401; the certificate's subject (CN the user, O its groups) must be
allowed ``get`` on ``nodes/proxy`` of the pod's node, asked of the API server in a SubjectAccessReview, else 403.

The backend keeps no time per output line: ``timestamps`` stamps each line with when the operator read it, and
``sinceSeconds``/``sinceTime`` keep what is read after that time (the output written before the request is read at
the request, so it is kept). A job's output is one stream: node 0's pod serves it all, the others none.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import os
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from bridge.annotations import (
    COMPLETION_INDEX_LABEL,
    JOB_CLUSTER_ANNOTATION,
    JOB_ID_ANNOTATION,
    MANAGED_LABEL,
)
from bridge.errors import BridgeError, InvalidSpec
from bridge.operator.kube import kube_call
from bridge.operator.standin_pods import NODE
from bridge.operator.virtual_node import MANAGED_BY, Endpoint

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter

log = logging.getLogger("hpcbridge.operator")

CERT_ENV, KEY_ENV, CLIENT_CA_ENV = "HPCBRIDGE_KUBELET_CERT", "HPCBRIDGE_KUBELET_KEY", "HPCBRIDGE_KUBELET_CLIENT_CA"
_TRUE, _FALSE = ("1", "t", "T", "true", "TRUE", "True"), ("0", "f", "F", "false", "FALSE", "False")


class BadQuery(ValueError):
    """A query parameter the kubelet would refuse (400)."""


@dataclass(frozen=True)
class LogQuery:
    """The kubelet's container-log options (``PodLogOptions``)."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since: datetime.datetime | None = None

    @classmethod
    def parse(cls, query: Mapping[str, list[str]], now: datetime.datetime) -> LogQuery:
        def flag(name: str) -> bool:
            value = (query.get(name) or ["false"])[-1]
            if value not in _TRUE + _FALSE:
                raise BadQuery(f"{name}: {value!r} is not a boolean")
            return value in _TRUE

        def number(name: str, least: int) -> int | None:
            values = query.get(name)
            if not values:
                return None
            try:
                found = int(values[-1])
            except ValueError:
                raise BadQuery(f"{name}: {values[-1]!r} is not a number") from None
            if found < least:
                raise BadQuery(f"{name}: must be at least {least}")
            return found

        since_seconds, since_time = number("sinceSeconds", 1), (query.get("sinceTime") or [""])[-1]
        if since_seconds is not None and since_time:
            raise BadQuery("at most one of sinceTime or sinceSeconds may be specified")
        since = now - datetime.timedelta(seconds=since_seconds) if since_seconds is not None else None
        if since_time:
            try:
                since = datetime.datetime.fromisoformat(since_time.replace("Z", "+00:00"))
            except ValueError:
                raise BadQuery(f"sinceTime: {since_time!r} is not an RFC 3339 time") from None
        return cls(follow=flag("follow"), previous=flag("previous"), timestamps=flag("timestamps"),
                   tail_lines=number("tailLines", 0), limit_bytes=number("limitBytes", 1), since=since)


def stamp(moment: datetime.datetime) -> str:
    """RFC 3339 with fractional seconds, as the kubelet prefixes a line with ``timestamps``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def shape(chunks: Iterable[str], query: LogQuery, clock: Callable[[], datetime.datetime]) -> Iterator[bytes]:
    """The backend's output *chunks* (the first one: what was written before the request) as the kubelet would
    send them for *query*: whole lines, the last *tail_lines* of the first chunk, stamped, from *since*, at most
    *limit_bytes* in all (the last line cut there)."""
    left = query.limit_bytes
    partial, first = "", True
    for chunk in chunks:
        moment = clock()
        lines = (partial + chunk).split("\n")
        partial = lines.pop()
        if first and query.tail_lines is not None:
            lines = lines[len(lines) - query.tail_lines:] if query.tail_lines else []
        first = False
        if query.since is not None and moment < query.since:
            continue
        for line in lines:
            data = (f"{stamp(moment)} {line}\n" if query.timestamps else f"{line}\n").encode()
            if left is not None:
                data, left = data[:left], left - len(data)
            if data:
                yield data
            if left is not None and left <= 0:
                return
    if partial and (query.since is None or clock() >= query.since):
        data = (f"{stamp(clock())} {partial}" if query.timestamps else partial).encode()
        yield data[:left] if left is not None else data


@dataclass(frozen=True)
class Caller:
    """Who a client certificate names: CN the user, O its groups."""

    user: str
    groups: tuple[str, ...]

    @classmethod
    def of(cls, cert: Mapping[str, Any] | None) -> Caller | None:
        if not cert:
            return None
        pairs = [pair for rdn in cert.get("subject", ()) for pair in rdn]
        users = [value for key, value in pairs if key == "commonName"]
        return cls(users[0], tuple(value for key, value in pairs if key == "organizationName")) if users else None


class KubeletApi:
    """What the handler asks of Kubernetes and the backends: who may read a node, a stand-in pod's job, its
    output."""

    def __init__(self, api: Any, adapter_for: Callable[[str], Adapter]) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api.api_client)
        self.authz = client.AuthorizationV1Api(api.api_client)
        self.adapter_for = adapter_for

    def allowed(self, caller: Caller, node: str, subresource: str) -> bool:
        """A SubjectAccessReview: may *caller* ``get`` ``nodes/<subresource>`` of *node*?"""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": caller.user, "groups": list(caller.groups),
                           "resourceAttributes": {"verb": "get", "resource": "nodes", "subresource": subresource,
                                                  "name": node}}}
        answer = kube_call("create subjectaccessreview", self.authz.create_subject_access_review, review)
        return bool(answer.status and answer.status.allowed)

    def standin(self, namespace: str, name: str) -> tuple[str, str, str, int] | None:
        """A stand-in pod's node, cluster, backend job id and node index; None when there is no such pod."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod = kube_call(f"read pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace)
        except ApiException:
            return None
        labels, annotations = pod.metadata.labels or {}, pod.metadata.annotations or {}
        if labels.get(MANAGED_LABEL) != MANAGED_BY or JOB_ID_ANNOTATION not in annotations:
            return None
        return (pod.spec.node_name or "", annotations.get(JOB_CLUSTER_ANNOTATION, ""), annotations[JOB_ID_ANNOTATION],
                int(labels.get(COMPLETION_INDEX_LABEL) or 0))

    def output(self, cluster: str, job_id: str, follow: bool) -> Iterator[str]:
        from bridge import service

        return service.logs(self.adapter_for(cluster), job_id, follow=follow)


class KubeletHandler(BaseHTTPRequestHandler):
    server: KubeletServer
    protocol_version = "HTTP/1.1"  # the log stream is chunked
    timeout = 60  # a client that stops reading for this long is dropped

    def setup(self) -> None:
        super().setup()
        self.request.do_handshake()  # here, in the request's thread, not in the accepting one

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("kubelet api: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self._reply(200, "ok")
        caller = Caller.of(self.request.getpeercert())
        if caller is None:
            return self._reply(401, "Unauthorized")
        parts = [unquote(part) for part in url.path.split("/")[1:]]
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._reply(404, "404 page not found")
        try:
            self._logs(caller, parts[1], parts[2], parts[3], parse_qs(url.query))
        except BridgeError as exc:
            self._reply(503, str(exc))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away

    def _logs(self, caller: Caller, namespace: str, pod: str, container: str, query: Mapping[str, list[str]]) -> None:
        api = self.server.api
        found = api.standin(namespace, pod)
        if found is None:
            return self._reply(404, f"pod {namespace}/{pod} is not a stand-in pod on this node")
        node, cluster, job_id, index = found
        if not api.allowed(caller, node, "proxy"):
            return self._reply(403, f"Forbidden (user={caller.user}, verb=get, resource=nodes, "
                                    "subResource=proxy)")
        if container != NODE:
            return self._reply(400, f"container {container} is not valid for pod {pod}")
        try:
            options = LogQuery.parse(query, datetime.datetime.now(datetime.UTC))
        except BadQuery as exc:
            return self._reply(400, str(exc))
        if options.previous:
            return self._reply(400, f'previous terminated container "{container}" in pod "{pod}" not found')
        chunks: Iterator[str] = api.output(cluster, job_id, options.follow) if index == 0 else iter(())
        try:
            first = next(chunks, None)  # the backend's refusal (no such job any more) before any header
        except BridgeError as exc:
            return self._reply(404 if not exc.retryable else 503, str(exc))
        if first is not None:
            chunks = itertools.chain([first], chunks)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for data in shape(chunks, options, lambda: datetime.datetime.now(datetime.UTC)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _reply(self, code: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class KubeletServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], api: KubeletApi, context: ssl.SSLContext) -> None:
        super().__init__(address, KubeletHandler)
        self.api = api
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)


def tls_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    """The serving certificate, and client certificates checked against *client_ca* when given (a request
    without one is answered 401)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for what, path in ((CERT_ENV, cert), (KEY_ENV, key), (CLIENT_CA_ENV, client_ca)):
        if not os.path.isfile(path):
            raise InvalidSpec(what, path, "is not a readable file")
    context.load_cert_chain(cert, key)
    context.load_verify_locations(client_ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def serve(api: KubeletApi, endpoint: Endpoint, env: Mapping[str, str] = os.environ) -> KubeletServer | None:
    """The kubelet API on every address at the endpoint's port, with the certificates $HPCBRIDGE_KUBELET_CERT,
    $HPCBRIDGE_KUBELET_KEY and $HPCBRIDGE_KUBELET_CLIENT_CA (the API server's client CA) name; None, with a
    warning, when they are not given (the nodes are registered; their logs cannot be read)."""
    cert, key, client_ca = env.get(CERT_ENV), env.get(KEY_ENV), env.get(CLIENT_CA_ENV)
    if not (cert and key and client_ca) or not all(os.path.isfile(path) for path in (cert, key, client_ca)):
        # the Deployment mounts them from an optional Secret: without it the nodes and pods are still written
        log.warning("no kubelet API: %s, %s and %s must name readable files to serve the virtual nodes' logs",
                    CERT_ENV, KEY_ENV, CLIENT_CA_ENV)
        return None
    server = KubeletServer(("", endpoint.port), api, tls_context(cert, key, client_ca))
    threading.Thread(target=server.serve_forever, name="kubelet-api", daemon=True).start()
    return server


def start(api: Any, reconciler: Any, env: Mapping[str, str] = os.environ) -> None:
    """Virtual nodes, stand-in pods and the kubelet API for the operator's *reconciler* (``KubeApi`` *api*),
    unless $HPCBRIDGE_VIRTUAL_NODES turns them off."""
    from bridge import service
    from bridge.operator.standin_pods import StandinPods
    from bridge.operator.virtual_node import VirtualNodes, enabled

    if not enabled(env):
        return
    endpoint = Endpoint.from_env(env)
    nodes = VirtualNodes(api, endpoint, api.cluster_specs)
    pods = StandinPods(api, nodes.node_for, lambda cluster: str(api.cluster_specs()[cluster].spec.type))
    reconciler.on_status = pods.mirror

    def adapter_for(cluster: str) -> Adapter:
        sync = reconciler.syncs.get(cluster)
        return sync.adapter if sync is not None else service.get_adapter(api.clusters()[cluster])

    serve(KubeletApi(api, adapter_for), endpoint, env)
    nodes.start()
    log.info("virtual nodes advertise %s:%d", endpoint.address, endpoint.port)
