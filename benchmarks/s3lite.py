"""A small, fast object server for the remote benchmarks: S3's path-style GET/HEAD (with ``Range``)
and ListObjectsV2 over a local folder, plain HTTP GET on the same paths, a fixed latency added to
every request, and counters of requests and bytes sent.

    python benchmarks/s3lite.py ROOT --port 0 --latency-ms 20     # prints "port N" when ready

``ROOT/BUCKET/KEY`` is object ``s3://BUCKET/KEY`` and ``http://HOST:PORT/BUCKET/KEY``. Requests are
not authenticated (the signature is ignored), so any client configured with an endpoint and dummy
keys can read. It also serves ``ROOT/ORG/NAME`` as the Hugging Face Hub dataset ``ORG/NAME``
(``HF_ENDPOINT=http://HOST:PORT``: revision and tree APIs, resolve redirecting to the plain GET).
``GET /__stats__`` returns ``{"requests": N, "bytes": B}``; ``POST /__reset__``
zeroes them; ``POST /__latency__?ms=N`` changes the latency. Loopback only: it binds 127.0.0.1.
It is aiohttp (sendfile, one event loop), so it serves thousands of small ranged reads a second
on one core, unlike moto (the tests' S3), which is a Flask app.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import email.utils
import hashlib
import os
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from aiohttp import web

STATE = {"requests": 0, "bytes": 0, "latency": 0.0}
HUB_SHA = "0123456789abcdef0123456789abcdef01234567"  # the one commit of every Hub repository served


def _etag(st: os.stat_result) -> str:
    return '"' + hashlib.md5(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest() + '"'


def make_app(root: Path) -> web.Application:
    root = root.resolve()

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"requests": STATE["requests"], "bytes": STATE["bytes"]})

    async def reset(request: web.Request) -> web.Response:
        STATE["requests"] = STATE["bytes"] = 0
        return web.Response(text="ok")

    async def latency(request: web.Request) -> web.Response:
        STATE["latency"] = float(request.query.get("ms", "0")) / 1000
        return web.Response(text="ok")

    async def listing(request: web.Request, bucket: str) -> web.Response:
        prefix = request.query.get("prefix", "")
        base = root / bucket
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                key = os.path.relpath(os.path.join(dirpath, name), base).replace(os.sep, "/")
                if key.startswith(prefix):
                    keys.append(key)
        items = []
        for key in sorted(keys):
            st = os.stat(base / key)
            iso = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            items.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{iso}</LastModified>"
                f"<ETag>{escape(_etag(st))}</ETag><Size>{st.st_size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(items)}</KeyCount>"
            f"<MaxKeys>100000</MaxKeys><IsTruncated>false</IsTruncated>{''.join(items)}</ListBucketResult>"
        )
        return web.Response(text=body, content_type="application/xml")

    async def handle(request: web.Request) -> web.StreamResponse:
        STATE["requests"] += 1
        if STATE["latency"]:
            await asyncio.sleep(STATE["latency"])
        parts = request.path.lstrip("/").split("/", 1)
        if len(parts) == 1 or not parts[1]:
            if request.method == "GET":
                return await listing(request, parts[0])
            return web.Response(status=200)
        path = (root / parts[0] / parts[1]).resolve()
        if root not in path.parents or not path.is_file():
            return web.Response(
                status=404, text="<Error><Code>NoSuchKey</Code></Error>", content_type="application/xml"
            )
        st = path.stat()
        headers = {
            "ETag": _etag(st),
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(st.st_size)})
        start, end = 0, st.st_size
        rng = request.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            if a == "":
                start = max(st.st_size - int(b), 0)
            else:
                start, end = int(a), min(int(b) + 1, st.st_size) if b else st.st_size
            if start >= st.st_size:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{st.st_size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{st.st_size}"
        STATE["bytes"] += end - start
        resp = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(end - start)})
        await resp.prepare(request)
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                await resp.write(chunk)
                left -= len(chunk)
        await resp.write_eof()
        return resp

    # The Hugging Face Hub's endpoints for a dataset repository ORG/NAME whose files are
    # ROOT/ORG/NAME/...: the revision API (one commit), the tree API, and the resolve endpoint,
    # which redirects to the file's plain GET (the Hub's CDN), as the Hub does for LFS files.
    async def hub_revision(request: web.Request) -> web.Response:
        STATE["requests"] += 1
        if STATE["latency"]:
            await asyncio.sleep(STATE["latency"])
        return web.json_response({"id": f"{request.match_info['org']}/{request.match_info['name']}", "sha": HUB_SHA})

    async def hub_tree(request: web.Request) -> web.Response:
        STATE["requests"] += 1
        if STATE["latency"]:
            await asyncio.sleep(STATE["latency"])
        base = root / request.match_info["org"] / request.match_info["name"]
        sub = request.match_info.get("tail", "").strip("/")
        out = []
        for dirpath, _dirs, files in os.walk(base / sub):
            for name in files:
                rel = os.path.relpath(os.path.join(dirpath, name), base).replace(os.sep, "/")
                out.append(
                    {"type": "file", "path": rel, "size": os.path.getsize(os.path.join(dirpath, name)), "oid": "0" * 40}
                )
        return web.json_response(sorted(out, key=lambda e: e["path"]))

    async def hub_resolve(request: web.Request) -> web.Response:
        STATE["requests"] += 1
        if STATE["latency"]:
            await asyncio.sleep(STATE["latency"])
        m = request.match_info
        target = f"/{m['org']}/{m['name']}/{m['tail']}"
        if not (root / m["org"] / m["name"] / m["tail"]).is_file():
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        return web.Response(status=302, headers={"Location": target, "X-Repo-Commit": HUB_SHA})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/api/datasets/{org}/{name}/revision/{rev}", hub_revision)
    app.router.add_get("/api/datasets/{org}/{name}/tree/{rev}", hub_tree)
    app.router.add_get("/api/datasets/{org}/{name}/tree/{rev}/{tail:.*}", hub_tree)
    app.router.add_route("*", "/datasets/{org}/{name}/resolve/{rev}/{tail:.*}", hub_resolve)
    app.router.add_get("/__stats__", stats)
    app.router.add_post("/__reset__", reset)
    app.router.add_post("/__latency__", latency)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=0.0)
    args = p.parse_args()
    STATE["latency"] = args.latency_ms / 1000

    async def run() -> None:
        runner = web.AppRunner(make_app(Path(args.root)), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"port {port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
