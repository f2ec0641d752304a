"""The kubelet API of the virtual nodes, served by the operator over HTTPS: what ``kubectl logs`` and the Kubeflow
SDK reach through the API server for a stand-in pod (``GET /containerLogs/{namespace}/{pod}/{container}``), the
stand-in pods' status (``GET /pods``), and ``/healthz``.

As a kubelet with ``--anonymous-auth=false`` and ``--authentication-token-webhook``/``--authorization-mode=Webhook``:
the caller is the subject of a client certificate the API server's client CA signed (CN the user, O its groups),
else the user a bearer token is, asked of the API server in a TokenReview; neither is 401. The caller must be
allowed ``get`` on ``nodes/proxy`` of the node, asked of the API server in a SubjectAccessReview, else 403.

The backend keeps no time per output line: ``timestamps`` stamps each line with when the operator read it, and
``sinceSeconds``/``sinceTime`` keep what is read after that time (the output written before the request is read at
the request, so it is kept). A job's output is one stream, in which the operator's jobs tag each line with the
node that wrote it (``[node-N] ``, ``[node-N rank-R] ``: ``hpcbridge launch``'s tags): each pod serves its node's
lines without the node's tag; an untagged line (a one-node job's, the batch script's own, the backend's) is node
0's.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import re
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
    from bridge.operator.standin_pods import StandinPods

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


#: the tag ``hpcbridge launch`` writes before each line of a tagged job (bridge.mpi.bootstrap.node_label and
#: rank_label): group 1 the node, group 2 the rank's own tag, if any
NODE_TAG = re.compile(r"\[node-(\d+)(?: (rank-\d+))?\] ")


def of_node(line: str, node: int) -> str | None:
    """*line* as node *node*'s pod shows it (its node tag gone, a rank's tag kept as ``[rank-R] ``), or None
    where another node wrote it; an untagged line is node 0's."""
    match = NODE_TAG.match(line)
    if match is None:
        return line if node == 0 else None
    if int(match.group(1)) != node:
        return None
    return (f"[{match.group(2)}] " if match.group(2) else "") + line[match.end():]


def node_lines(chunks: Iterable[str], node: int) -> Iterator[str]:
    """The job's output *chunks* cut down to node *node*'s lines, a chunk for each (empty where a chunk holds none
    of them, so that the first stays the first: what was written before the request). A line is kept whole
    until its newline comes (a tag says whose line it is only at its start)."""
    partial = ""
    for chunk in chunks:
        lines = (partial + chunk).split("\n")
        partial = lines.pop()
        yield "".join(f"{kept}\n" for line in lines if (kept := of_node(line, node)) is not None)
    if partial and (kept := of_node(partial, node)) is not None:
        yield kept


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
    """Who a request comes from: a client certificate's CN and O, or the user and groups a TokenReview found."""

    user: str
    groups: tuple[str, ...]
    uid: str = ""

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

    def __init__(self, api: Any, adapter_for: Callable[[str], Adapter], standins: StandinPods) -> None:
        """*standins*: what knows the stand-in pods this operator wrote (``/pods`` lists those)."""
        from kubernetes import client

        self.core = client.CoreV1Api(api.api_client)
        self.authz = client.AuthorizationV1Api(api.api_client)
        self.authn = client.AuthenticationV1Api(api.api_client)
        self.adapter_for = adapter_for
        self.standins = standins

    def token_user(self, token: str) -> Caller | None:
        """A TokenReview: who the bearer *token* is, None where the API server does not know it."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        answer = kube_call("create tokenreview", self.authn.create_token_review, review)
        status = answer.status
        if status is None or not status.authenticated or status.user is None or not status.user.username:
            return None
        return Caller(status.user.username, tuple(status.user.groups or ()), status.user.uid or "")

    def allowed(self, caller: Caller, node: str, subresource: str) -> bool:
        """A SubjectAccessReview: may *caller* ``get`` ``nodes/<subresource>`` of *node*?"""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": caller.user, "groups": list(caller.groups),
                           **({"uid": caller.uid} if caller.uid else {}),
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

    def pods(self, caller: Caller) -> dict[str, Any] | None:
        """The stand-in pods (a PodList, as a kubelet's ``/pods``) on the virtual nodes *caller* may read; None
        where it may read none. One port serves every virtual node and a request through the API server's node
        proxy does not say which node it was for: the answer holds each node's pods the caller may see. They are
        the pods this operator wrote, each read afresh (it may not list pods: least privilege), so a pod of a job
        that ended before the operator last started is not among them."""
        from kubernetes.client.exceptions import ApiException

        selector = f"{MANAGED_LABEL}={MANAGED_BY}"
        nodes = kube_call("list virtual nodes", self.core.list_node, label_selector=selector).items
        readable = {node.metadata.name for node in nodes if self.allowed(caller, node.metadata.name, "proxy")}
        if not readable:
            return None
        items: list[Any] = []
        for namespace, name, node in self.standins.written():
            if node not in readable:
                continue
            try:
                items.append(kube_call(f"read pod {namespace}/{name}", self.core.read_namespaced_pod, name,
                                       namespace))
            except ApiException:  # 404 (kube_call raises other answers as BackendUnavailable)
                self.standins.forget(namespace, name)  # deleted with its TrainJob
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                "items": self.core.api_client.sanitize_for_serialization(items)}


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
        parts = [unquote(part) for part in url.path.split("/")[1:]]
        try:
            caller = self._caller()
            if caller is None:
                return self._reply(401, "Unauthorized")
            if parts in (["pods"], ["pods", ""]):
                return self._pods(caller)
            if len(parts) != 4 or parts[0] != "containerLogs":
                return self._reply(404, "404 page not found")
            self._logs(caller, parts[1], parts[2], parts[3], parse_qs(url.query))
        except BridgeError as exc:
            self._reply(503, str(exc))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away

    def _caller(self) -> Caller | None:
        """The client certificate's subject, else the bearer token's user (a TokenReview), else None."""
        caller = Caller.of(self.request.getpeercert())
        if caller is not None:
            return caller
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        return self.server.api.token_user(token)

    def _pods(self, caller: Caller) -> None:
        found = self.server.api.pods(caller)
        if found is None:
            return self._reply(403, f"Forbidden (user={caller.user}, verb=get, resource=nodes, subResource=proxy)")
        body = json.dumps(found).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
        source = api.output(cluster, job_id, options.follow)
        try:
            self._stream(node_lines(source, index), options)
        finally:
            close = getattr(source, "close", None)  # a followed file's reader, a transport's channel
            if close is not None:
                close()

    def _stream(self, chunks: Iterator[str], options: LogQuery) -> None:
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
        for data in shape(chunks, options, lambda: datetime.datetime.now(datetime.UTC)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

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
    reconciler.tag_output = True  # each pod serves its node's lines

    def adapter_for(cluster: str) -> Adapter:
        sync = reconciler.syncs.get(cluster)
        return sync.adapter if sync is not None else service.get_adapter(api.clusters()[cluster])

    serve(KubeletApi(api, adapter_for, pods), endpoint, env)
    nodes.start()
    log.info("virtual nodes advertise %s:%d", endpoint.address, endpoint.port)
