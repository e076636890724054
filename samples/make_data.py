"""Generate a raw image+caption folder the demo model can really learn from.

Each sample is a coloured shape on a coloured background, with a caption that
describes it ("a small red circle on a blue background") and a class label
(the shape). Layout: ``OUT/NNNNNN.jpg``, ``.txt``, ``.cls`` (the ``pairs`` layout).

    python samples/make_data.py demo-out/raw --count 2000

With ``--clips DIR`` it also writes short video clips (``NNNNNN.mp4``: a shape moving across
a background, H.264 with an AAC track of a tone, + a ``.txt`` caption that says which shape,
colour and direction, and the tone's pitch), and with ``--sounds DIR`` audio clips
(``NNNNNN.flac``: a tone or a chirp, + a caption). Both need PyAV (``pip install 'mmloader[av]'``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

from PIL import Image, ImageDraw

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (150, 60, 190),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "orange": (240, 140, 30),
}
SHAPES = ["circle", "square", "triangle"]
SIZES = {"small": 0.3, "large": 0.7}


def render(rng: random.Random, px: int) -> tuple[Image.Image, str, int]:
    shape = rng.randrange(len(SHAPES))
    fg, bg = rng.sample(sorted(COLOURS), 2)
    size_name = rng.choice(sorted(SIZES))
    im = Image.new("RGB", (px, px), COLOURS[bg])
    draw = ImageDraw.Draw(im)
    r = SIZES[size_name] * px / 2
    cx = rng.uniform(r, px - r)
    cy = rng.uniform(r, px - r)
    if SHAPES[shape] == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLOURS[fg])
    elif SHAPES[shape] == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=COLOURS[fg])
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=COLOURS[fg])
    caption = f"a {size_name} {fg} {SHAPES[shape]} on a {bg} background"
    return im, caption, shape


DIRECTIONS = {"left to right": (1, 0), "right to left": (-1, 0), "top to bottom": (0, 1), "bottom to top": (0, -1)}
PITCHES = {"low": 220.0, "middle": 440.0, "high": 880.0}


def _tone(kind: str, pitch: float, seconds: float, rate: int) -> "np.ndarray":  # noqa: F821 (numpy lazily)
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    if kind == "chirp":
        phase = 2 * np.pi * (pitch * t + pitch * t * t / seconds)  # up to twice the pitch
    else:
        phase = 2 * np.pi * pitch * t
    return (0.3 * np.sin(phase) * np.minimum(1, 20 * t) * np.minimum(1, 20 * (seconds - t))).astype(np.float32)


def _encode_audio(container, stream, x, rate: int) -> None:
    from fractions import Fraction

    import av
    import numpy as np

    for i in range(0, len(x), 1024):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None, i : i + 1024]), format="fltp", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, i, Fraction(1, rate)
        for p in stream.encode(frame):
            container.mux(p)
    for p in stream.encode(None):
        container.mux(p)


def write_clips(out: str, count: int, seed: int, seconds: float = 2.0, fps: int = 12, size=(96, 64)) -> None:
    """Video clips of a shape moving across a background, with a tone track and a caption."""
    from fractions import Fraction

    import av

    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    w, h = size
    for i in range(count):
        shape, (fg, bg) = rng.choice(SHAPES), rng.sample(sorted(COLOURS), 2)
        direction = rng.choice(sorted(DIRECTIONS))
        pitch = rng.choice(sorted(PITCHES))
        stem = os.path.join(out, f"{i:06d}")
        c = av.open(stem + ".mp4", "w")
        v = c.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=fps)
        v.width, v.height, v.pix_fmt = w, h, "yuv420p"
        v.codec_context.gop_size = fps  # a keyframe a second: clips seek cheaply
        a = c.add_stream("aac", rate=16000)
        a.layout = "mono"
        dx, dy = DIRECTIONS[direction]
        for n in range(int(seconds * fps)):
            im = Image.new("RGB", (w, h), COLOURS[bg])
            draw = ImageDraw.Draw(im)
            f = n / (seconds * fps - 1)
            cx = w / 2 + dx * (f - 0.5) * (w - 24)
            cy = h / 2 + dy * (f - 0.5) * (h - 24)
            r = 10
            box = [cx - r, cy - r, cx + r, cy + r]
            if shape == "circle":
                draw.ellipse(box, fill=COLOURS[fg])
            elif shape == "square":
                draw.rectangle(box, fill=COLOURS[fg])
            else:
                draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=COLOURS[fg])
            frame = av.VideoFrame.from_image(im)
            frame.pts, frame.time_base = n, Fraction(1, fps)
            for p in v.encode(frame):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
        _encode_audio(c, a, _tone("tone", PITCHES[pitch], seconds, 16000), 16000)
        c.close()
        with open(stem + ".txt", "w") as fh:
            fh.write(f"a {fg} {shape} moving {direction} on a {bg} background, with a {pitch} tone")


def write_sounds(out: str, count: int, seed: int, seconds: float = 1.5, rate: int = 22050) -> None:
    """FLAC clips of a tone or a rising chirp, with a caption."""
    import av

    rng = random.Random(seed + 1)
    os.makedirs(out, exist_ok=True)
    for i in range(count):
        kind, pitch = rng.choice(["tone", "chirp"]), rng.choice(sorted(PITCHES))
        stem = os.path.join(out, f"{i:06d}")
        c = av.open(stem + ".flac", "w")
        a = c.add_stream("flac", rate=rate)
        a.layout = "mono"
        _encode_audio(c, a, _tone(kind, PITCHES[pitch], seconds * rng.uniform(0.8, 1.2), rate), rate)
        c.close()
        with open(stem + ".txt", "w") as fh:
            fh.write(f"a {pitch} {'rising chirp' if kind == 'chirp' else 'steady tone'}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--size", type=int, default=64, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--corpus",
        default=None,
        help="also write captions to this text file, one per line (a text-only source for mixing experiments)",
    )
    p.add_argument("--corpus-lines", type=int, default=5000)
    p.add_argument("--clips", default=None, help="also write video clips (mp4 + txt) to this folder")
    p.add_argument("--sounds", default=None, help="also write audio clips (flac + txt) to this folder")
    p.add_argument("--media-count", type=int, default=24, help="clips and sounds to write (default 24)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    for i in range(args.count):
        im, caption, label = render(rng, args.size)
        stem = os.path.join(args.out, f"{i:06d}")
        im.save(stem + ".jpg", quality=90)
        with open(stem + ".txt", "w") as f:
            f.write(caption)
        with open(stem + ".cls", "w") as f:
            f.write(str(label))
    print(f"wrote {args.count} image+caption pairs to {args.out}")
    if args.corpus:
        with open(args.corpus, "w") as f:
            for _ in range(args.corpus_lines):
                f.write(render(rng, 8)[1] + "\n")
        print(f"wrote {args.corpus_lines} captions, one per line, to {args.corpus}")
    if args.clips:
        write_clips(args.clips, args.media_count, args.seed)
        print(f"wrote {args.media_count} video clips (mp4 with an audio track + txt) to {args.clips}")
    if args.sounds:
        write_sounds(args.sounds, args.media_count, args.seed)
        print(f"wrote {args.media_count} audio clips (flac + txt) to {args.sounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
