"""A local HTTP server laid out as the Hugging Face Hub's API, for ``hf://`` staging (the hub itself is
unreachable here). It answers what ``huggingface_hub`` asks when it resolves a repository and downloads a
snapshot: repo info, the tree listing and ``resolve/<rev>/<file>``; private repositories want the token. It
counts what it served, so a test can tell a download from a cache hit.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    private: bool = False
    #: seconds each file body waits before it is sent: a download slow enough to watch
    delay: float = 0.0

    @property
    def sha(self) -> str:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path])
        return digest.hexdigest()


@dataclass
class HubServer:
    token: str = "hf_test_token_5e1d"
    #: the address it serves on (pods reach this machine at the real-node cluster's gateway)
    host: str = "127.0.0.1"
    #: (repo type, repo id) -> Repo; repo type is "model" or "dataset"
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)
    served: Counter = field(default_factory=Counter)
    #: every Authorization header value seen, to show where the token went
    authorizations: list[str] = field(default_factory=list)

    def add(self, kind: str, repo_id: str, files: dict[str, bytes], private: bool = False,
            delay: float = 0.0) -> Repo:
        self.repos[(kind, repo_id)] = Repo(files, private, delay)
        return self.repos[(kind, repo_id)]

    def downloads(self) -> int:
        """File bodies served (GET of resolve/…)."""
        return self.served["file"]

    def start(self) -> HubServer:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None,
                      head: bool = False) -> None:
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, doc) -> None:
                self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

            def _repo(self, kind: str, repo_id: str) -> Repo | None:
                repo = hub.repos.get((kind, repo_id))
                auth = self.headers.get("Authorization", "")
                if auth:
                    hub.authorizations.append(auth)
                if repo is None or (repo.private and auth != f"Bearer {hub.token}"):
                    self._send(404 if repo is None or not auth else 401,
                               json.dumps({"error": "Repository Not Found"}).encode(),
                               {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound",
                                "X-Error-Message": "Repository Not Found"})
                    return None
                return repo

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                api = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?", path)
                if api:
                    kind = "model" if api.group(1) == "models" else "dataset"
                    repo = self._repo(kind, api.group(2))
                    if repo is None:
                        return
                    if api.group(3) == "tree":
                        hub.served["tree"] += 1
                        entries, dirs = [], set()
                        for name, data in sorted(repo.files.items()):
                            parts = name.split("/")
                            for depth in range(1, len(parts)):
                                dirs.add("/".join(parts[:depth]))
                            entries.append({"type": "file", "path": name, "size": len(data),
                                            "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()})
                        entries += [{"type": "directory", "path": d, "oid": "0" * 40, "size": 0} for d in sorted(dirs)]
                        self._json(entries)
                        return
                    hub.served["info"] += 1
                    self._json({"id": api.group(2), "sha": repo.sha, "private": repo.private,
                                "siblings": [{"rfilename": name} for name in sorted(repo.files)]})
                    return
                resolve = re.fullmatch(r"/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if resolve:
                    kind = "dataset" if resolve.group(1) else "model"
                    repo = self._repo(kind, resolve.group(2))
                    if repo is None:
                        return
                    data = repo.files.get(resolve.group(4))
                    if data is None:
                        self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                        return
                    etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                    headers = {"ETag": f'"{etag}"', "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes",
                               "Content-Type": "application/octet-stream"}
                    if not head:
                        hub.served["file"] += 1
                        time.sleep(repo.delay)
                    self._send(200, data, headers, head)
                    return
                self._send(404, b"not a hub path")

        self.httpd = ThreadingHTTPServer((self.host, 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
