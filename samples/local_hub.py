"""A Hugging Face Hub on 127.0.0.1: the endpoints ``huggingface_hub`` calls, for ``HF_ENDPOINT``.

Served: the revision API (``/api/datasets/ORG/NAME[/revision/REV]``), the tree API
(``/api/datasets/ORG/NAME/tree/REV[/PATH]``, ``recursive``, paginated by a ``Link`` header), the
paths-info API (``POST .../paths-info/REV``) and the resolve endpoint
(``/datasets/ORG/NAME/resolve/REV/PATH``, GET and HEAD, with ``Range``). As on the real Hub, a
large ("LFS") file is answered with a redirect to a CDN on another host (here another port),
whose signed URL refuses requests that carry an ``Authorization`` header; errors carry
``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``); a
private repository is 401 without its token, a gated one's files 401/403 without access, and
``throttle(n)`` answers the next ``n`` requests 429 with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socketserver
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_THRESHOLD = 1024  # files at least this large are "LFS" files, served through the CDN
PAGE = 50  # tree entries per page


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    private: bool = False
    gated: bool = False
    readers: set[str] = field(default_factory=set)  # tokens that may read it (private or gated)


class _Threading(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class HubServer:
    """A Hub holding dataset repositories in memory; ``url`` is its endpoint.

    ``requests`` lists ``(method, path, authorization)`` of every request to the Hub, and
    ``cdn_requests`` those to the CDN.
    """

    def __init__(self, retry_after: float = 0.2, lfs_threshold: int = LFS_THRESHOLD):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.cdn_requests: list[tuple[str, str, str | None]] = []
        self.retry_after = retry_after
        #: files at least this large are served through the CDN (a redirect to another host)
        self.lfs_threshold = lfs_threshold
        self._throttle = 0
        #: repo id -> a URL its requests are redirected to (307, the path kept): a moved repository
        self.moved: dict[str, str] = {}
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}
        self.cdn = _Threading(("127.0.0.1", 0), self._handler(cdn=True))
        self.httpd = _Threading(("127.0.0.1", 0), self._handler(cdn=False))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"
        for server in (self.httpd, self.cdn):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    # -- the repositories --------------------------------------------------------------------------
    def create(self, repo_id: str, private: bool = False, gated: bool = False, readers=()) -> Repo:
        repo = self.repos[repo_id] = Repo(private=private, gated=gated, readers=set(readers))
        return repo

    def commit(self, repo_id: str, files: dict[str, bytes], branch: str = "main", replace: bool = False) -> str:
        """Commit ``files`` (path -> bytes) on ``branch`` (on top of it unless ``replace``); the new sha."""
        repo = self.repos.get(repo_id) or self.create(repo_id)
        parent = repo.refs.get(branch, repo.refs.get("main"))  # a new branch starts from main
        tree = {} if replace or parent is None else dict(repo.commits[parent])
        tree.update(files)
        sha = hashlib.sha1(f"{repo_id}{time.time_ns()}{sorted(tree)}".encode()).hexdigest()
        repo.commits[sha], repo.refs[branch] = tree, sha
        for data in tree.values():
            self._blobs[hashlib.sha256(data).hexdigest()] = data
        return sha

    def upload_folder(self, repo_id: str, folder: str | Path, path_in_repo: str = "", **kw) -> str:
        """Commit every file under ``folder`` (as ``path_in_repo/relative/path``)."""
        root = Path(folder)
        files = {
            "/".join(p for p in (path_in_repo.strip("/"), f.relative_to(root).as_posix()) if p): f.read_bytes()
            for f in sorted(root.rglob("*"))
            if f.is_file()
        }
        return self.commit(repo_id, files, **kw)

    def throttle(self, n: int) -> None:
        """Answer the next ``n`` requests to the Hub 429 with ``Retry-After``."""
        with self._lock:
            self._throttle = n

    def stop(self) -> None:
        for server in (self.httpd, self.cdn):
            server.shutdown()
            server.server_close()

    # -- the handler ---------------------------------------------------------------------------------
    def _handler(self, cdn: bool):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                (hub._cdn if cdn else hub._serve)(self)

            do_HEAD = do_POST = do_GET

        return Handler

    @staticmethod
    def _send(h, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _error(self, h, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(
            h, status, body, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        )

    def _json(self, h, value, headers: dict | None = None) -> None:
        self._send(h, 200, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

    @staticmethod
    def _ranged(h, data: bytes, headers: dict) -> None:
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else max(len(data) - int(b), 0)
            end = min(int(b) + 1, len(data)) if a and b else len(data)
            if start >= len(data):
                HubServer._send(h, 416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            HubServer._send(
                h, 206, data[start:end], {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
            )
            return
        HubServer._send(h, 200, data, headers)

    def _cdn(self, h) -> None:
        auth = h.headers.get("Authorization")
        self.cdn_requests.append((h.command, h.path, auth))
        parts = urlsplit(h.path)
        blob = self._blobs.get(parts.path.rsplit("/", 1)[-1])
        if auth is not None:  # a signed URL: a second credential is refused, as S3 refuses it
            self._send(
                h, 400, b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed</Message></Error>"
            )
            return
        if blob is None or "sig" not in parse_qs(parts.query):
            self._send(h, 403, b"<Error><Code>AccessDenied</Code></Error>")
            return
        self._ranged(h, blob, {"Accept-Ranges": "bytes", "ETag": f'"{hashlib.md5(blob).hexdigest()}"'})

    def _serve(self, h) -> None:
        auth = h.headers.get("Authorization")
        self.requests.append((h.command, h.path, auth))
        with self._lock:
            throttled = self._throttle > 0
            self._throttle -= throttled
        if throttled:
            self._send(h, 429, b"rate limited", {"Retry-After": f"{self.retry_after:g}"})
            return
        token = auth[7:] if auth and auth.startswith("Bearer ") else None
        parts = urlsplit(h.path)
        segs = [unquote(s) for s in parts.path.strip("/").split("/")]
        api = segs[:1] == ["api"]
        if api:
            segs = segs[1:]
        if len(segs) < 3 or segs[0] != "datasets":
            self._error(h, 404, "RepoNotFound", "Not Found")
            return
        repo_id, rest = f"{segs[1]}/{segs[2]}", segs[3:]
        if repo_id in self.moved:
            self._send(h, 307, b"", {"Location": self.moved[repo_id] + h.path})
            return
        repo = self.repos.get(repo_id)
        can_read = repo is not None and (not (repo.private or repo.gated) or token in repo.readers)
        if repo is None or (repo.private and not can_read):
            # the real Hub: 401 without a token (a private repo's existence is not told), 404 with one
            status = 404 if token else 401
            self._error(h, status, "RepoNotFound", f"Repository Not Found for url: {self.url}{h.path}.")
            return
        kind, rev, path = (rest[0] if rest else "revision"), (rest[1] if len(rest) > 1 else "main"), "/".join(rest[2:])
        sha = repo.refs.get(rev, rev if rev in repo.commits else None)
        if sha is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        tree = repo.commits[sha]
        if api and kind == "revision":
            siblings = [{"rfilename": p} for p in sorted(tree)]
            self._json(
                h,
                {
                    "id": repo_id,
                    "sha": sha,
                    "private": repo.private,
                    "gated": repo.gated and "auto",
                    "siblings": siblings,
                },
            )
        elif api and kind == "tree":
            self._tree(h, repo_id, tree, sha, path, parse_qs(parts.query))
        elif api and kind == "paths-info":
            length = int(h.headers.get("Content-Length") or 0)
            form = parse_qs(h.rfile.read(length).decode())
            asked = form.get("paths", [])
            out = [self._entry(p, tree) for p in asked if p in tree]
            out += [
                {"type": "directory", "oid": "0" * 40, "size": 0, "path": p} for p in asked if self._is_dir(p, tree)
            ]
            self._json(h, out)
        elif not api and kind == "resolve":
            if repo.gated and not can_read:
                status = 403 if token else 401
                self._error(
                    h,
                    status,
                    "GatedRepo",
                    f"Access to dataset {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                )
                return
            data = tree.get(path)
            if data is None:
                self._error(h, 404, "EntryNotFound", f"{path} does not exist on {rev}")
                return
            oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            head = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "ETag": f'"{oid}"'}
            if len(data) >= self.lfs_threshold:
                digest = hashlib.sha256(data).hexdigest()
                location = f"{self.cdn_url}/blobs/{digest}?sig={hashlib.md5(digest.encode()).hexdigest()}"
                self._send(
                    h,
                    302,
                    b"",
                    {**head, "Location": location, "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data))},
                )
                return
            self._ranged(h, data, head)
        else:
            self._error(h, 404, "EntryNotFound", "Not Found")

    @staticmethod
    def _is_dir(path: str, tree: dict) -> bool:
        return any(p.startswith(path.rstrip("/") + "/") for p in tree)

    def _entry(self, path: str, tree: dict) -> dict:
        data = tree[path]
        entry = {
            "type": "file",
            "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
            "size": len(data),
            "path": path,
        }
        if len(data) >= self.lfs_threshold:
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _tree(self, h, repo_id: str, tree: dict, sha: str, path: str, query: dict) -> None:
        base = path.strip("/")
        if base and base not in tree and not self._is_dir(base, tree):
            self._error(h, 404, "EntryNotFound", f"{base} does not exist")
            return
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = base + "/" if base else ""
        entries: dict[str, dict] = {}
        for p in sorted(tree):
            if not p.startswith(prefix):
                continue
            rel = p[len(prefix) :]
            if recursive or "/" not in rel:
                entries[p] = self._entry(p, tree)
            # folders on the way, as the Hub lists them
            pieces = rel.split("/")[:-1]
            for i in range(len(pieces) if recursive else min(len(pieces), 1)):
                d = prefix + "/".join(pieces[: i + 1])
                entries.setdefault(d, {"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
        ordered = [entries[k] for k in sorted(entries)]
        start = int(query.get("cursor", ["0"])[0])
        page = ordered[start : start + PAGE]
        headers = {}
        if start + PAGE < len(ordered):
            q = "&".join(f"{k}={quote(v[0])}" for k, v in query.items() if k != "cursor")
            headers["Link"] = f'<{self.url}{urlsplit(h.path).path}?{q}&cursor={start + PAGE}>; rel="next"'
        self._json(h, page, headers)
