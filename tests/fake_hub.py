"""A minimal Hugging Face Hub-compatible HTTP server for tests (stdlib only, 127.0.0.1, ephemeral port).

It implements just the endpoints that `HfApi.create_repo`, `create_branch` and `create_commit` call,
including the Git LFS "basic" transfer that `huggingface_hub` uses for binary files when Xet is off:

    POST /api/repos/create                                 -> create a model repo (409 if it exists)
    POST /api/validate-yaml                                -> README metadata check (always OK)
    POST /api/models/{ns}/{name}/branch/{branch}           -> create a branch (409 if it exists)
    POST /api/models/{ns}/{name}/preupload/{rev}           -> "lfs" for binary files, else "regular"
    POST /{ns}/{name}.git/info/lfs/objects/batch           -> upload + verify actions per object
    PUT  /lfs-upload/{oid}                                 -> store the blob (its sha256 is checked)
    POST /{ns}/{name}.git/info/lfs/objects/verify          -> 200 when the blob is stored
    POST /api/models/{ns}/{name}/commit/{rev}              -> apply an ndjson commit

Committed files are written to `store/{ns}/{name}/{revision}/{path}` so tests can load them from
disk; LFS blobs live in `store/.lfs/{oid}`. Every request is recorded (method, path, headers,
body size) in `FakeHub.requests`. `FakeHub.fail_commits = True` makes the commit endpoint answer 500.

Not implemented: the Xet protocol (tests set `HF_HUB_DISABLE_XET`), pull requests, deletions, copies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".png", ".parquet", ".gguf")
LFS_MIN_SIZE = 10 * 1024 * 1024

_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
ROUTES = [
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/branch/(?P<branch>[^/]+)$"), "create_branch"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(rf"^/{_REPO}\.git/info/lfs/objects/batch$"), "lfs_batch"),
    ("PUT", re.compile(r"^/lfs-upload/(?P<oid>[0-9a-f]{64})$"), "lfs_upload"),
    ("POST", re.compile(rf"^/{_REPO}\.git/info/lfs/objects/verify$"), "lfs_verify"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>[^/]+)$"), "commit"),
]


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body_size: int


@dataclass
class FakeHub:
    """State of the fake Hub; `url` is what to put in `HF_ENDPOINT`."""

    store: Path
    url: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    commits: list[dict[str, Any]] = field(default_factory=list)
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)  # repo_id -> {"branches": {...}}
    fail_commits: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def repo_dir(self, repo_id: str, revision: str = "main") -> Path:
        return self.store / repo_id / revision

    def blob_path(self, oid: str) -> Path:
        return self.store / ".lfs" / oid


def _json_response(status: int, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(payload).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub  # set on the subclass made by `start_fake_hub`

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr access logs
        return

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _dispatch(self) -> None:
        body = self._read_body()
        path = self.path.split("?")[0]
        with self.hub.lock:
            self.hub.requests.append(
                RecordedRequest(
                    self.command, path, {k.lower(): v for k, v in self.headers.items()}, len(body)
                )
            )
        status, headers, payload = (
            404,
            {"Content-Type": "application/json"},
            b'{"error":"not found"}',
        )
        for method, pattern, name in ROUTES:
            match = pattern.match(path)
            if method == self.command and match:
                status, headers, payload = getattr(self, f"_{name}")(body, **match.groupdict())
                break
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = _dispatch

    # --- endpoints -------------------------------------------------------------------------
    def _create_repo(self, body: bytes):
        request = json.loads(body)
        repo_id = f"{request['organization']}/{request['name']}"
        url = f"{self.hub.url}/{repo_id}"
        with self.hub.lock:
            if repo_id in self.hub.repos:
                return _json_response(
                    409, {"error": "You already created this model repo", "url": url}
                )
            visibility = request.get("visibility", "public")
            self.hub.repos[repo_id] = {"visibility": visibility, "branches": {"main"}}
        return _json_response(200, {"url": url, "name": repo_id, "id": repo_id})

    def _validate_yaml(self, body: bytes):
        return _json_response(200, {"errors": [], "warnings": []})

    def _create_branch(self, body: bytes, repo: str, branch: str):
        with self.hub.lock:
            branches = self.hub.repos[repo]["branches"]
            if branch in branches:
                return _json_response(409, {"error": f"Branch {branch} already exists"})
            branches.add(branch)
        return _json_response(200, {})

    def _preupload(self, body: bytes, repo: str, rev: str):
        files = []
        for entry in json.loads(body)["files"]:
            is_lfs = entry["path"].endswith(LFS_SUFFIXES) or entry["size"] >= LFS_MIN_SIZE
            files.append(
                {
                    "path": entry["path"],
                    "uploadMode": "lfs" if is_lfs else "regular",
                    "shouldIgnore": False,
                }
            )
        return _json_response(200, {"files": files})

    def _lfs_batch(self, body: bytes, repo: str):
        objects = []
        for obj in json.loads(body)["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not self.hub.blob_path(obj["oid"]).exists():
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/lfs-upload/{obj['oid']}"},
                    "verify": {"href": f"{self.hub.url}/{repo}.git/info/lfs/objects/verify"},
                }
            objects.append(entry)
        return _json_response(200, {"transfer": "basic", "objects": objects})

    def _lfs_upload(self, body: bytes, oid: str):
        if hashlib.sha256(body).hexdigest() != oid:
            return _json_response(400, {"error": "sha256 mismatch"})
        blob = self.hub.blob_path(oid)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(body)
        return 200, {}, b""

    def _lfs_verify(self, body: bytes, repo: str):
        oid = json.loads(body)["oid"]
        ok = self.hub.blob_path(oid).exists()
        return _json_response(200 if ok else 404, {} if ok else {"error": "blob missing"})

    def _commit(self, body: bytes, repo: str, rev: str):
        if self.hub.fail_commits:
            return _json_response(500, {"error": "Internal Error (fake hub told to fail)"})
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        files: dict[str, bytes] = {}
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                blob = self.hub.blob_path(value["oid"])
                if not blob.exists():
                    return _json_response(422, {"error": f"LFS object {value['oid']} not uploaded"})
                files[value["path"]] = blob.read_bytes()
        with self.hub.lock:
            if rev not in self.hub.repos[repo]["branches"]:
                return _json_response(404, {"error": f"Revision {rev} not found"})
            for rel_path, data in files.items():
                target = self.hub.repo_dir(repo, rev) / rel_path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            oid = hashlib.sha1(body).hexdigest()
            self.hub.commits.append(
                {"repo": repo, "revision": rev, "oid": oid, "files": sorted(files), **header}
            )
        url = f"{self.hub.url}/{repo}/commit/{oid}"
        return _json_response(200, {"commitUrl": url, "commitOid": oid, "success": True})


def start_fake_hub(store: Path) -> tuple[FakeHub, ThreadingHTTPServer]:
    """Start the server in a daemon thread; call `server.shutdown()` when done."""
    hub = FakeHub(store=Path(store))
    handler = type("BoundHandler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return hub, server
