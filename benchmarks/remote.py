"""Reading from object storage: mmloader vs WebDataset, MosaicML Streaming and LitData, all served
by one local S3/HTTP server (benchmarks/s3lite.py) with a fixed latency added to every request.

    pip install -e '.[bench]'
    python benchmarks/remote.py                          # 20,000 256-px JPEG+caption pairs, 0/20/50 ms
    python benchmarks/remote.py --samples 4000 --latencies 20 --only mmloader,webdataset
    python benchmarks/remote.py clients                  # the client measurement (obstore vs fsspec)

Contenders (each run in a fresh process, two epochs, shuffled):

* ``mmloader``: ``mmloader.open("s3://bench/mm")`` with its defaults (thread backend, read-ahead
  chunks, no disk cache);
* ``mmloader-ranged``: the same with read-ahead off (per-sample ranged reads only, coalesced);
* ``mmloader-cache``: with ``cache_dir=`` (whole shards copied to local disk in the background);
* ``mmloader-local``: the same shards from local disk (the reference for the cached epoch);
* ``webdataset``: ``wds.WebDataset`` streaming the same shard files over HTTP (curl), shuffle
  buffer 1000, DataLoader workers;
* ``mosaicml-streaming``: ``StreamingDataset(remote="s3://bench/mds", local=...)``;
* ``litdata``: ``litdata.StreamingDataset("s3://bench/litdata")``.

``remote.py hub`` (default latency 20 ms) reads the same shards as the Hub dataset ``bench/mm``
from the server's Hub endpoints (revision and tree APIs; the resolve endpoint redirecting to the
file, as the Hub redirects to its CDN): ``mmloader-hub`` (``mmloader.open("hf://datasets/bench/mm")``
with ``HF_ENDPOINT``) and ``webdataset-hub`` (WebDataset on the resolve URLs with ``curl -L`` and a
bearer token, as the Hub's documentation shows), beside the S3/HTTP rows above; its results go to
their own section of RESULTS.md.

Measured: time from constructing the dataset to the first batch, samples/s over epoch 1 and over
epoch 2, and bytes the server sent per sample delivered. Peers decode with the same decoder as
mmloader (simplejpeg). Results replace the "Remote" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

CONTENDERS = [
    "mmloader",
    "mmloader-ranged",
    "mmloader-cache",
    "mmloader-local",
    "webdataset",
    "mosaicml-streaming",
    "litdata",
]
#: ``remote.py hub``: the same shards as a Hugging Face Hub dataset (the server's Hub endpoints)
HUB_CONTENDERS = ["mmloader-hub", "webdataset-hub", "mmloader", "webdataset", "litdata"]
SECTION = "## Remote (object storage)"
HUB_SECTION = "## Remote: the Hugging Face Hub (`benchmarks/remote.py hub`)"
BUCKET = "bench"


# -- the server ------------------------------------------------------------------------------------
class Server:
    def __init__(self, root: Path, latency_ms: float):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "s3lite.py"), str(root), "--latency-ms", str(latency_ms)],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"the benchmark server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        return json.loads(urllib.request.urlopen(f"{self.url}/__stats__").read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def env_for(endpoint: str) -> dict:
    return {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "S3_ENDPOINT_URL": endpoint,
    }  # S3_ENDPOINT_URL: MosaicML Streaming's variable


# -- data -------------------------------------------------------------------------------------------
def prepare(args) -> dict:
    out = Path(args.out)
    raw = out / f"raw-{args.samples}"
    if not (raw / ".complete").exists():
        from data import make_folder

        print(f"generating {args.samples} image+caption pairs in {raw} ...", flush=True)
        shutil.rmtree(raw, ignore_errors=True)
        mean = make_folder(raw, args.samples)
        (raw / ".complete").write_text(f"{mean:.0f}")
    root = out / f"server-{args.samples}"
    bucket = root / BUCKET
    bucket.mkdir(parents=True, exist_ok=True)
    mm = shutil.which("mmloader") or str(ROOT / ".venv/bin/mmloader")
    if not (bucket / "mm" / "index.json").exists():
        subprocess.run(
            [
                mm,
                "convert",
                "pairs",
                str(raw),
                str(bucket / "mm"),
                "--shard-size",
                "1000",
                "--workers",
                "2",
                "--overwrite",
                "-q",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    stems = sorted(p.stem for p in raw.glob("*.jpg"))
    if not (bucket / "mds" / "index.json").exists():
        try:
            from streaming import MDSWriter

            shutil.rmtree(bucket / "mds", ignore_errors=True)
            with MDSWriter(out=str(bucket / "mds"), columns={"jpg": "bytes", "txt": "str"}) as w:
                for stem in stems:
                    w.write({"jpg": (raw / f"{stem}.jpg").read_bytes(), "txt": (raw / f"{stem}.txt").read_text()})
        except ImportError:
            print("mosaicml-streaming not installed: skipped")
    if not (bucket / "litdata" / "index.json").exists():
        shutil.rmtree(bucket / "litdata", ignore_errors=True)
        r = subprocess.run(
            [
                sys.executable,
                str(HERE / "compare.py"),
                "--litdata-optimize",
                str(raw),
                str(bucket / "litdata"),
                "--workers",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if r.returncode:
            print("litdata not installed or failed: skipped")
    return {
        "root": str(root),
        "count": len(stems),
        "mean_jpeg_bytes": float((raw / ".complete").read_text()),
        "shards": sorted(p.name for p in (bucket / "mm").glob("*.tar")),
    }


# -- contenders (built inside the measuring process) ----------------------------------------------
def _decode(b):
    import simplejpeg
    import torch

    return torch.from_numpy(simplejpeg.decode_jpeg(bytes(b))).permute(2, 0, 1)


def _columns(items):
    return tuple(map(list, zip(*items)))


def build(name: str, workload: str, info: dict, endpoint: str, workers: int, batch: int, scratch: str):
    import torch  # noqa: F401  (imported before any worker forks)
    from torch.utils.data import DataLoader

    decode = workload == "decoded"
    if name.startswith("mmloader"):
        import mmloader

        if name == "mmloader-hub":
            store = mmloader.open(f"hf://datasets/{BUCKET}/mm")
        elif name == "mmloader-local":
            store = mmloader.open(os.path.join(info["root"], BUCKET, "mm"))
        else:
            opts = {"readahead": False} if name == "mmloader-ranged" else {}
            if name == "mmloader-cache":
                opts["cache_dir"] = os.path.join(scratch, "mm-cache")
            store = mmloader.open(f"s3://{BUCKET}/mm", **opts)
        ds = mmloader.zip(
            image=mmloader.ImageReader(store, "jpg", output="tensor" if decode else "raw"),
            caption=mmloader.TextReader(store, "txt"),
        )
        return mmloader.loader(mmloader.Stream(ds, batch_size=batch, seed=0), num_workers=workers)
    if name in ("webdataset", "webdataset-hub"):
        import webdataset as wds

        urls = [f"{endpoint}/{BUCKET}/mm/{f}" for f in info["shards"]]
        if name == "webdataset-hub":  # the Hub's documented recipe: curl following the redirect
            urls = [
                f"pipe:curl -s -L -f -H 'Authorization: Bearer {os.environ['HF_TOKEN']}' "
                f"{endpoint}/datasets/{BUCKET}/mm/resolve/main/{f}"
                for f in info["shards"]
            ]
        pipe = wds.WebDataset(
            urls, shardshuffle=len(urls), nodesplitter=wds.single_node_only, workersplitter=wds.split_by_worker
        ).shuffle(1000)
        if decode:
            pipe = pipe.map_dict(jpg=_decode)
        pipe = pipe.to_tuple("jpg", "txt")
        pipe = pipe.batched(batch, partial=True) if decode else pipe.batched(batch, partial=True, collation_fn=_columns)
        return DataLoader(pipe, batch_size=None, num_workers=workers)
    if name == "mosaicml-streaming":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # a previous run's shared memory would be taken for this one's

        class MDS(StreamingDataset):
            def __getitem__(self, i):
                s = super().__getitem__(i)
                return (_decode(s["jpg"]) if decode else s["jpg"]), s["txt"]

        ds = MDS(
            remote=f"s3://{BUCKET}/mds",
            local=os.path.join(scratch, "mds-local"),
            batch_size=batch,
            shuffle=True,
            shuffle_seed=0,
        )
        return DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=None if decode else _columns)
    if name == "litdata":
        import litdata
        from litdata.streaming import downloader

        # LitData builds its obstore client without allow_http: needed for the local http:// endpoint.
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

        def to_item(s):
            jpg = bytes(s["jpg"])
            return (_decode(jpg) if decode else jpg), s["txt"]

        ds = litdata.StreamingDataset(
            f"s3://{BUCKET}/litdata", shuffle=True, transform=to_item, cache_dir=os.path.join(scratch, "litdata-cache")
        )
        return litdata.StreamingDataLoader(
            ds, batch_size=batch, num_workers=workers, collate_fn=None if decode else _columns
        )
    raise ValueError(name)


def _count(batch) -> int:
    if isinstance(batch, dict):
        return len(batch["__key__"])
    first = batch[0]
    return first.shape[0] if hasattr(first, "shape") else len(first)


def measure_one(args) -> dict:
    """Runs in a fresh process: build, two epochs, server bytes per epoch."""
    info = json.loads(args.info)
    endpoint = args.endpoint
    os.environ.update(env_for(endpoint))
    os.environ.update({"HF_ENDPOINT": endpoint, "HF_TOKEN": "hf_bench_token_0000"})
    scratch = tempfile.mkdtemp(prefix="mm-remote-bench-")

    def server_bytes() -> int:
        return json.loads(urllib.request.urlopen(f"{endpoint}/__stats__").read())["bytes"]

    import importlib

    import torch  # noqa: F401  imports are not the loader's time to first batch

    import mmloader  # noqa: F401

    for mod in {
        "webdataset": ["webdataset"],
        "webdataset-hub": ["webdataset"],
        "mosaicml-streaming": ["streaming"],
        "litdata": ["litdata"],
    }.get(args.run, ["mmloader.readers", "mmloader.loading.stream", "mmloader.loading.threaded"]):
        importlib.import_module(mod)
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/__reset__", method="POST")).read()
        t0 = time.perf_counter()
        loader = build(args.run, args.workload, info, endpoint, args.workers, args.batch_size, scratch)
        first = None
        epochs = []
        for e in range(args.epochs):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(e)
            te = time.perf_counter() if e else t0
            n = 0
            for b in loader:
                if first is None:
                    first = time.perf_counter() - t0
                n += _count(b)
            epochs.append({"samples": n, "seconds": time.perf_counter() - te, "bytes": server_bytes()})
        for e in range(len(epochs) - 1, 0, -1):
            epochs[e]["bytes"] -= epochs[e - 1]["bytes"]
        return {"first_batch_s": first, "epochs": epochs}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- the client measurement ------------------------------------------------------------------------
def measure_clients(endpoint: str, latency_ms: float, n: int = 2048, size: int = 25_000) -> list[dict]:
    """CPU and wall time of n ranged GETs of ``size`` bytes, 64 in flight, per client; and how much
    a pure-Python thread gets done meanwhile (the GIL left to training code)."""
    import asyncio
    import random
    import threading

    os.environ.update(env_for(endpoint))
    blob_span = 60 << 20
    rng = random.Random(0)
    starts = [rng.randrange(0, blob_span) for _ in range(n)]

    class Spinner:
        def __init__(self):
            self.n, self.stop = 0, False

        def run(self):
            while not self.stop:
                self.n += 1

    def spin_alone() -> float:
        sp = Spinner()
        t = threading.Thread(target=sp.run)
        t.start()
        time.sleep(1)
        sp.stop = True
        t.join()
        return sp.n

    base = spin_alone()
    results = []

    def measure(name, fn):
        fn(starts[:64])
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn(starts)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert all(len(b) == size for b in out), name
        sp = Spinner()
        t = threading.Thread(target=sp.run)
        t.start()
        w1 = time.perf_counter()
        fn(starts[:1024])
        ws = time.perf_counter() - w1
        sp.stop = True
        t.join()
        results.append(
            {
                "client": name,
                "req_per_s": n / wall,
                "cpu_us_per_req": cpu / n * 1e6,
                "python_thread_share": sp.n / ws / base,
            }
        )

    import obstore
    from obstore.store import from_url

    st = from_url(f"s3://{BUCKET}/clients")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def ob(ss):
        async def go():
            sem = asyncio.Semaphore(64)

            async def one(s):
                async with sem:
                    return await obstore.get_range_async(st, "blob.bin", start=s, end=s + size)

            return await asyncio.gather(*(one(s) for s in ss))

        return asyncio.run_coroutine_threadsafe(go(), loop).result()

    measure("obstore (S3, async, 64 in flight): mmloader's client", ob)
    try:
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="bench", secret="bench")

        def s3(ss):
            out = []
            for i in range(0, len(ss), 64):
                chunk = ss[i : i + 64]
                out += fs.cat_ranges([f"{BUCKET}/clients/blob.bin"] * len(chunk), chunk, [s + size for s in chunk])
            return out

        measure("s3fs (fsspec, cat_ranges of 64)", s3)
    except ImportError:
        pass
    try:
        import fsspec

        hfs = fsspec.filesystem("http")

        def http(ss):
            out = []
            for i in range(0, len(ss), 64):
                chunk = ss[i : i + 64]
                out += hfs.cat_ranges(
                    [f"{endpoint}/{BUCKET}/clients/blob.bin"] * len(chunk), chunk, [s + size for s in chunk]
                )
            return out

        measure("fsspec HTTP (aiohttp, cat_ranges of 64)", http)
    except ImportError:
        pass
    from mmloader.storage.remote import Location

    simple = Location(f"s3://{BUCKET}/clients").client("meta")
    measure(
        "mmloader's stdlib client (16 threads; opening, forked workers)",
        lambda ss: simple.get_ranges([("blob.bin", s, s + size) for s in ss]),
    )
    return results


# -- main -------------------------------------------------------------------------------------------
def run_contender(name, workload, info, server, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--run",
        name,
        "--workload",
        workload,
        "--info",
        json.dumps(info),
        "--endpoint",
        server.url,
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        str(args.epochs),
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.timeout} s"}
    if r.returncode:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail[:300]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", default="loaders", choices=["loaders", "clients", "hub"])
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--latencies", default=None, help="ms added to every request (default 0,20,50; hub: 20)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--workload", default="decoded", choices=["decoded", "raw"])
    p.add_argument("--only", default="")
    p.add_argument("--out", default=str(ROOT / "bench-out" / "remote"))
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--info", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        print(json.dumps(measure_one(args)))
        return 0
    if args.latencies is None:
        args.latencies = "20" if args.mode == "hub" else "0,20,50"
    latencies = [float(x) for x in args.latencies.split(",") if x]
    if args.mode == "clients":
        tmp = Path(tempfile.mkdtemp(prefix="mm-clients-"))
        (tmp / BUCKET / "clients").mkdir(parents=True)
        (tmp / BUCKET / "clients" / "blob.bin").write_bytes(os.urandom(64 << 20))
        rows = []
        for lat in latencies:
            server = Server(tmp, lat)
            try:
                for r in measure_clients(server.url, lat):
                    rows.append({**r, "latency_ms": lat})
                    print(
                        f"{lat:>4.0f} ms  {r['client']:60s} {r['req_per_s']:7,.0f} req/s  "
                        f"{r['cpu_us_per_req']:6,.0f} us CPU/req  python thread beside it: "
                        f"{r['python_thread_share']:4.0%}",
                        flush=True,
                    )
            finally:
                server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "clients.json").write_text(json.dumps(rows, indent=1))
        return 0
    info = prepare(args)
    pool = HUB_CONTENDERS if args.mode == "hub" else CONTENDERS
    names = [n for n in pool if not args.only or n in args.only.split(",")]
    saved = Path(args.out) / f"results-{args.mode}-{args.samples}-{args.workload}.json"
    results: dict = {}
    if saved.exists() and args.only:  # a partial run updates the rows it measured
        results = {(n, float(lat)): runs for n, lat, runs in json.loads(saved.read_text())}
    load = os.getloadavg()[0]
    for lat in latencies:
        server = Server(Path(info["root"]), lat)
        try:
            for rnd in range(args.rounds):
                for name in names:
                    if name == "mmloader-local" and lat != latencies[0]:
                        continue  # local disk does not see the latency
                    r = run_contender(name, args.workload, info, server, args)
                    if rnd == 0:
                        results[(name, lat)] = []
                    results[(name, lat)].append(r)
                    saved.write_text(json.dumps([[n, la, runs] for (n, la), runs in results.items()]))
                    print(
                        f"latency {lat:>3.0f} ms  {name:20s} "
                        + (
                            r["error"]
                            if "error" in r
                            else f"first batch {r['first_batch_s'] * 1000:7.0f} ms  epoch 1 "
                            f"{r['epochs'][0]['samples'] / r['epochs'][0]['seconds']:7,.0f}/s  epoch 2 "
                            f"{r['epochs'][-1]['samples'] / r['epochs'][-1]['seconds']:7,.0f}/s  "
                            f"{r['epochs'][0]['bytes'] / max(r['epochs'][0]['samples'], 1):8,.0f} B/sample"
                        ),
                        flush=True,
                    )
        finally:
            server.stop()
    load = max(load, os.getloadavg()[0])
    latencies = sorted({lat for _n, lat in results})
    names = [n for n in pool if any(k[0] == n for k in results)]
    write_results(args, info, latencies, names, results, load)
    return 0


def _median(runs: list[dict], fn) -> float | None:
    ok = [fn(r) for r in runs if "error" not in r]
    return statistics.median(ok) if ok else None


def write_results(args, info, latencies, names, results, load) -> None:
    def rate(r, e):
        return r["epochs"][e]["samples"] / r["epochs"][e]["seconds"]

    import mmloader

    versions = []
    for mod in ("webdataset", "streaming", "litdata", "obstore"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    hub = args.mode == "hub"
    lines = [
        HUB_SECTION if hub else SECTION,
        "",
        f"Command: `python benchmarks/remote.py {'hub ' if hub else ''}--samples {args.samples} --latencies {args.latencies} "
        f"--workers {args.workers} --batch-size {args.batch_size} --workload {args.workload}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"mmloader {mmloader.__version__}; {time.strftime('%Y-%m-%d %H:%M')}; load average up to {load:.1f} "
        f"during the run{' (the machine was shared: figures taken under load)' if load > 1.5 else ''}  ",
        f"Data: {info['count']} samples, 256-px JPEG (mean {info['mean_jpeg_bytes']:,.0f} bytes) + caption, "
        f"{len(info['shards'])} tar shards of 1,000 samples; one local server (benchmarks/s3lite.py, aiohttp) "
        "for everyone, the latency added to every request; every run a fresh process, two epochs, shuffled, "
        f"{args.workload} images. Versions: {', '.join(versions)}.",
        "",
        "| latency | contender | first batch (ms) | epoch 1 samples/s | epoch 2 samples/s | bytes fetched / sample "
        "(epoch 1) |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for lat in latencies:
        for name in names:
            runs = results.get((name, lat))
            if not runs:
                continue
            if all("error" in r for r in runs):
                lines.append(f"| {lat:.0f} ms | {name} | failed: {runs[0]['error'][:120]} | | | |")
                continue
            first = _median(runs, lambda r: r["first_batch_s"] * 1000)
            e1, e2 = _median(runs, lambda r: rate(r, 0)), _median(runs, lambda r: rate(r, -1))
            bps = _median(runs, lambda r: r["epochs"][0]["bytes"] / max(r["epochs"][0]["samples"], 1))
            lines.append(f"| {lat:.0f} ms | {name} | {first:,.0f} | {e1:,.0f} | {e2:,.0f} | {bps:,.0f} |")
    lines += ["", *(hub_goals if hub else goals)(latencies, names, results, rate), ""]
    out = Path(args.results)
    from data import write_section

    write_section(out, "remote-hub" if hub else "remote", "\n".join(lines))
    print(f"wrote the {HUB_SECTION if hub else SECTION!r} section of {out}")


def hub_goals(latencies, names, results, rate) -> list[str]:
    """mmloader on the Hub against the peers reading the same shards over HTTP (or their own format)."""
    out = []
    for lat in latencies:
        mm = _median(results.get(("mmloader-hub", lat)) or [], lambda r: rate(r, 0))
        first = _median(results.get(("mmloader-hub", lat)) or [], lambda r: r["first_batch_s"])
        for peer in ("webdataset-hub", "webdataset", "litdata"):
            other = _median(results.get((peer, lat)) or [], lambda r: rate(r, 0))
            other_first = _median(results.get((peer, lat)) or [], lambda r: r["first_batch_s"])
            if mm and other:
                out.append(
                    f"- {lat:.0f} ms: mmloader-hub {mm:,.0f} samples/s (first batch {first * 1000:,.0f} ms) vs "
                    f"{peer} {other:,.0f} ({other_first * 1000:,.0f} ms) = {mm / other:.2f}x."
                )
    return out


def goals(latencies, names, results, rate) -> list[str]:
    peers = [n for n in names if not n.startswith("mmloader")]

    def med(name, lat, fn):
        runs = results.get((name, lat)) or []
        return _median(runs, fn)

    out = ["Goals (issue 14):", ""]
    if 50 in latencies:
        fb = med("mmloader", 50, lambda r: r["first_batch_s"])
        peer_fb = [(p, med(p, 50, lambda r: r["first_batch_s"])) for p in peers]
        peer_txt = ", ".join(f"{p} {v * 1000:,.0f} ms" for p, v in peer_fb if v is not None)
        out.append(
            f"- first batch <= 1 s at 50 ms latency: mmloader {fb * 1000:,.0f} ms -> "
            f"**{'met' if fb is not None and fb <= 1 else 'not met'}** (peers: {peer_txt})."
            if fb is not None
            else "- first batch at 50 ms: mmloader did not run."
        )
    if 20 in latencies:
        mm = max(
            (
                v
                for v in (med(n, 20, lambda r: rate(r, 0)) for n in ("mmloader", "mmloader-ranged", "mmloader-cache"))
                if v
            ),
            default=None,
        )
        best = max(
            ((p, med(p, 20, lambda r: rate(r, 0))) for p in peers), key=lambda t: t[1] or 0, default=(None, None)
        )
        if mm and best[1]:
            ratio = mm / best[1]
            out.append(
                f"- first-epoch throughput >= 1.5x the best peer at 20 ms: {mm:,.0f} vs {best[0]} "
                f"{best[1]:,.0f} samples/s = {ratio:.2f}x -> **{'met' if ratio >= 1.5 else 'not met'}**."
            )
    local = med("mmloader-local", latencies[0], lambda r: rate(r, -1))
    cached = [med("mmloader-cache", lat, lambda r: rate(r, -1)) for lat in latencies]
    if local and all(cached):
        worst = min(cached)
        out.append(
            f"- second epoch with cache within 10% of local disk: {worst:,.0f} (worst latency) vs local "
            f"{local:,.0f} samples/s = {worst / local:.2f} -> **{'met' if worst >= 0.9 * local else 'not met'}**."
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
