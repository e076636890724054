"""Clip reads, one process, no loader: mmloader's ``VideoReader`` against torchcodec's
``VideoDecoder`` and PyAV, each at its documented best, on the same stored clips.

CPU time per clip (``process_time``: every thread counted; one decoding thread each), medians of
alternating rounds, the bytes already in memory (as a loader holds a sample), the output a
uint8 ``(T, C, H, W)`` tensor.

Clips: ``benchmarks/av.py``'s 10-s 854x480 H.264 files (30 fps, a keyframe every 2 s). Workloads:

* ``fps``: the loader's clip of ``benchmarks/av.py``: 8 frames at 4 fps from a random start,
  224x224. mmloader: ``VideoReader(frames=8, fps=4, size=(224, 224))``. torchcodec:
  ``VideoDecoder(data, seek_mode=..., num_ffmpeg_threads=1, transforms=[Resize((224, 224))])``,
  ``get_frames_played_at(times)``. PyAV: seek to the keyframe before the first time, decode on,
  keep the frame shown at each time, ``to_ndarray("rgb24")``, torchvision's antialiased resize.
* ``consecutive``: 8 consecutive frames from a random start at the stored size. mmloader:
  ``VideoReader(frames=8)``. torchcodec: ``get_frames_in_range(i, i + 8)`` from the frame at t0.
  PyAV: as above, 8 frames from the one shown at t0.

Each is timed twice: reading alone, and reading then collating batches of 8 clips, each with
its loader's collate: mmloader's (``mmloader.collate``, a batch in the frames' channels-last
layout), the peers' PyTorch default (``torch.stack``). Both torchcodec and mmloader hand out
channels-last views of ``(T, H, W, C)`` memory, as FFmpeg writes frames.

torchcodec needs FFmpeg's shared libraries under their usual names (``libavutil.so.60``...).
Where the system has none, ``--ffmpeg-from-pyav`` runs it on the FFmpeg that PyAV's wheel bundles:
a folder of symlinks with those names, and this script re-executed with ``LD_LIBRARY_PATH``
pointing there (the libraries are identical, only the file names differ).

    python benchmarks/clip_reads.py [--clips 16 --rounds 5 --ffmpeg-from-pyav]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/av.py would shadow PyAV: this folder must not be on the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

FRAMES, FPS, SIZE = 8, 4, 224
ENV_FLAG = "MMLOADER_BENCH_FFMPEG_FROM_PYAV"


def _module(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ffmpeg_from_pyav() -> str:
    """A folder where PyAV's bundled FFmpeg libraries have the names torchcodec loads, and the
    ``LD_LIBRARY_PATH`` to give a process: that folder, then PyAV's own (their dependencies)."""
    import av

    libs = Path(av.__file__).resolve().parent.parent / "av.libs"
    folder = Path(tempfile.gettempdir()) / "mmloader-bench-ffmpeg"
    folder.mkdir(exist_ok=True)
    for lib in libs.glob("lib*.so*"):
        m = re.match(r"(lib(?:av|sw)[a-z]+)-[0-9a-f]{8}(\.so\.\d+)", lib.name)
        if m:
            link = folder / (m.group(1) + m.group(2))
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(lib)
    return f"{folder}:{libs}"


def mmloader_video_reader(workload: str):
    import mmloader

    if workload == "fps":
        return mmloader.VideoReader(None, "mp4", frames=FRAMES, fps=FPS, size=(SIZE, SIZE))
    return mmloader.VideoReader(None, "mp4", frames=FRAMES)


def clip_starts(workload: str, clips: list) -> dict:
    """Each clip's start (seconds), as mmloader's ``clip="random"`` draws it (outside a batch:
    seed 0): every contender reads the same frames."""
    from mmloader.media.mediainfo import probe

    reader = mmloader_video_reader(workload)
    return {key: float(reader.targets(probe(data), key)[0][0]) for key, data in clips}


# -- the contenders -------------------------------------------------------------------------------
def mmloader_reader(workload: str, starts: dict):
    reader = mmloader_video_reader(workload)
    return lambda key, data: reader.decode(data, key)  # (starts: its own draw)


def torchcodec_reader(workload: str, starts: dict, seek_mode: str):
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import Resize

    def read(key: str, data: bytes):
        if workload == "fps":
            d = VideoDecoder(data, seek_mode=seek_mode, num_ffmpeg_threads=1, transforms=[Resize((SIZE, SIZE))])
            frames = d.get_frames_played_at((starts[key] + np.arange(FRAMES) / FPS).tolist()).data
        else:
            d = VideoDecoder(data, seek_mode=seek_mode, num_ffmpeg_threads=1)
            first = int(np.floor(starts[key] * d.metadata.average_fps + 1e-6))  # constant-rate clips
            frames = d.get_frames_in_range(first, first + FRAMES).data
        return frames

    return read


def pyav_reader(workload: str, starts: dict):
    import av
    import torch
    from torchvision.transforms.v2.functional import resize

    def read(key: str, data: bytes):
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            s.thread_count = 1
            tb, rate = float(s.time_base), float(s.average_rate)
            times = starts[key] + (np.arange(FRAMES) / FPS if workload == "fps" else np.zeros(FRAMES))
            c.seek(int(times[0] / tb), stream=s, backward=True, any_frame=False)
            chosen, last = [], None
            for frame in c.decode(s):
                t = frame.pts * tb
                if workload == "fps":
                    while len(chosen) < FRAMES and t > times[len(chosen)] + 1e-6:
                        chosen.append(last)
                elif t + 1 / rate > times[0] + 1e-6:  # from the frame shown at t0 on
                    chosen.append(frame)
                if len(chosen) >= FRAMES:
                    break
                last = frame
            chosen += [last] * (FRAMES - len(chosen))
            hwc = np.stack([f.to_ndarray(format="rgb24") for f in chosen])
        tchw = torch.from_numpy(hwc).permute(0, 3, 1, 2)  # a channels-last view, as the others give
        return resize(tchw, [SIZE, SIZE], antialias=True) if workload == "fps" else tchw

    return read


def contenders(workload: str, clips: list, with_torchcodec: bool) -> dict:
    starts = clip_starts(workload, clips)
    out = {"mmloader VideoReader": mmloader_reader(workload, starts), "PyAV": pyav_reader(workload, starts)}
    if with_torchcodec:
        out["torchcodec, seek_mode=exact"] = torchcodec_reader(workload, starts, "exact")
        out["torchcodec, seek_mode=approximate"] = torchcodec_reader(workload, starts, "approximate")
    return out


def torchcodec_usable(clip: bytes) -> str:
    """'' when torchcodec decodes here, else why not."""
    try:
        from torchcodec.decoders import VideoDecoder

        VideoDecoder(clip)
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def collate_of(name: str):
    """Each contender's loader's collate: mmloader's (a batch in the frames' channels-last
    layout), the peers' PyTorch default (``torch.stack``)."""
    import torch

    import mmloader

    if name.startswith("mmloader"):
        return lambda frames: mmloader.collate([{"video": f} for f in frames])["video"]
    return torch.stack


def measure(readers: dict, clips: list, rounds: int, batch: int = 8) -> dict:
    """Median CPU ms per clip of each reader, rounds alternating, after one warm-up pass: read
    only, and read then collated into batches of ``batch`` clips."""

    times: dict = {(name, stacked): [] for name in readers for stacked in (False, True)}
    for name, read in readers.items():  # warm-up: each reader and each collate once
        collate_of(name)([read(key, data) for key, data in clips[:2]])
    for _ in range(rounds):
        for (name, stacked), spent in times.items():
            t = time.process_time()
            for at in range(0, len(clips), batch):
                frames = [readers[name](key, data) for key, data in clips[at : at + batch]]
                if stacked:
                    collated = collate_of(name)(frames)
                    assert collated.shape[1:] == (FRAMES, 3, *frames[0].shape[2:]), name
            spent.append((time.process_time() - t) / len(clips) * 1000)
    return {key: statistics.median(v) for key, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clips", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="bench-out/av")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    p.add_argument("--only", choices=("fps", "consecutive"), default=None)
    p.add_argument("--ffmpeg-from-pyav", action="store_true", help="run torchcodec on PyAV's bundled FFmpeg")
    args = p.parse_args(argv)
    if args.ffmpeg_from_pyav and not os.environ.get(ENV_FLAG):
        env = dict(os.environ, LD_LIBRARY_PATH=ffmpeg_from_pyav(), **{ENV_FLAG: "1"})
        os.execve(sys.executable, [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], env)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    bench_av = _module("mmloader_bench_av", "av.py")
    paths = [out / "raw" / "video" / f"{i:04d}.mp4" for i in range(args.clips)]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(paths):
        if not path.exists():
            bench_av.make_clip(i, path)
    clips = [(path.stem, path.read_bytes()) for path in paths]
    why_not = torchcodec_usable(clips[0][1])
    results = {}
    for workload in [args.only] if args.only else ["fps", "consecutive"]:
        readers = contenders(workload, clips, not why_not)
        if workload == "consecutive":  # unresized: every contender must hand out the very same pixels
            first = {name: read(*clips[0]) for name, read in readers.items()}
            mm = first["mmloader VideoReader"]
            assert all(torch.equal(mm, frames) for frames in first.values()), "the contenders read different frames"
        results[workload] = measure(readers, clips, args.rounds)
        for (name, stacked), ms in results[workload].items():
            print(f"{workload}: {name}{' + stack' if stacked else ''}: {ms:.1f} ms CPU per clip", flush=True)
    report(results, why_not, args, Path(args.results))
    return 0


NOTE = (
    "What differs: mmloader's reader decodes from the keyframe before the clip, skips GOPs and "
    "non-reference frames that show nothing asked for, converts only the chosen frames (resizing in the "
    "same swscale pass) and hands out the (T, H, W, C) memory swscale wrote, seen as (T, C, H, W); "
    "torchcodec decodes and converts in C++, its resize a decoder transform; PyAV's documented loop decodes "
    "on from the seek and converts each chosen frame at full size before torchvision resizes. Every "
    'contender reads the same frames: the starts are mmloader\'s clip="random" draws.'
)


def versions() -> str:
    import av
    import torch

    found = [f"torch {torch.__version__}", f"PyAV {av.__version__} (FFmpeg {getattr(av, 'ffmpeg_version_info', '?')})"]
    try:
        import torchcodec

        found.append(f"torchcodec {torchcodec.__version__}")
    except Exception:
        pass
    return "Versions: " + ", ".join(found) + "."


def report(results: dict, why_not: str, args, path: Path) -> None:
    lines = [
        "## Clip reads (`benchmarks/clip_reads.py`)",
        "",
        f"CPU ms per clip in one process (one decoding thread each), medians of {args.rounds} alternating "
        f"rounds over {args.clips} 10-s 854x480 H.264 clips; output uint8 (T, C, H, W). "
        "fps: 8 frames at 4 fps from a random start, 224x224; consecutive: 8 frames from a random start "
        "at the stored size."
        + (" torchcodec on PyAV's bundled FFmpeg (`--ffmpeg-from-pyav`)." if args.ffmpeg_from_pyav else ""),
        "",
        "| workload | contender | read, CPU ms / clip | read + collated in batches of 8 | mmloader's speed-up (collated) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    verdicts = []
    for workload, rows in results.items():
        names = list(dict.fromkeys(name for name, _ in rows))
        mm = rows[("mmloader VideoReader", True)]
        for name in names:
            read, stacked = rows[(name, False)], rows[(name, True)]
            lines.append(f"| {workload} | {name} | {read:.1f} | {stacked:.1f} | {stacked / mm:.2f}x |")
        peers = {n: rows[(n, True)] for n in names if not n.startswith("mmloader")}
        best = min(peers, key=peers.get)
        if why_not:
            verdicts.append(f"- {workload}: goal (the default >= the faster of torchcodec and PyAV) not judged")
            continue
        verdicts.append(
            f"- {workload}: goal: the default at least as fast as the faster of torchcodec and PyAV ({best}), "
            "batches collated: " + ("**met**" if mm <= peers[best] else "**not met**") + f" ({peers[best] / mm:.2f}x)"
        )
    if why_not:
        lines.append(f"\ntorchcodec not measured: it does not load here ({why_not}); try `--ffmpeg-from-pyav`.")
    lines += ["", versions(), "", *verdicts, "", NOTE]
    _module("mmloader_bench_data", "data.py").write_section(path, "clip-reads", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
