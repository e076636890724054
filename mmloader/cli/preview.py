"""``mmloader preview``: a contact sheet of samples, each image with its caption/label/key."""

from __future__ import annotations

import os
import textwrap
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from ..media.imageinfo import IMAGE_EXTENSIONS
from ..media.mediainfo import field_kind
from ..storage import open_store
from ..storage.remote.redaction import redact

THUMB = 160


def dataset_for_preview(path: str | os.PathLike):
    """A zipped dataset of every readable field of a store (images as PIL)."""
    from ..align.zip import Zipped  # (torch: only when a sheet is made)
    from ..readers import reader_for

    store = open_store(path)
    readers = {}
    for f in store.fields:
        ext = f.rsplit(".", 1)[-1].lower()
        options: dict[str, Any] = {"output": "pil"} if ext in IMAGE_EXTENSIONS else {}
        if field_kind(f) == "video":  # a strip of 4 frames across the middle of the video
            options = {"frames": 4, "fps": None, "clip": "center", "size": THUMB // 2}
        elif field_kind(f) == "audio":
            options = {"sample_rate": 16000, "max_seconds": 10.0}
        try:
            readers[f.replace(".", "_")] = reader_for(store, f, **options)
        except Exception:
            continue  # e.g. pickle fields: never previewed
    # Zipped directly: through zip_readers(**readers) a field named align, transforms or cache
    # would land in that parameter
    return Zipped(readers)


def frame_strip(frames, size: int = THUMB) -> Image.Image:
    """Up to 4 frames of a ``(T, C, H, W)`` clip, evenly picked, as a 2 x 2 sheet."""
    import numpy as np

    t = frames.shape[0]
    picks = sorted({round(i * (t - 1) / 3) for i in range(4)}) if t > 1 else [0]
    sheet = Image.new("RGB", (size, size), "black")
    half = size // 2
    for n, i in enumerate(picks[:4]):
        im = Image.fromarray(np.ascontiguousarray(frames[i].permute(1, 2, 0).numpy()))
        im.thumbnail((half - 2, half - 2))
        x, y = (n % 2) * half, (n // 2) * half
        sheet.paste(im, (x + (half - im.width) // 2, y + (half - im.height) // 2))
    return sheet


def waveform(audio, rate: int | None, size: tuple[int, int] = (THUMB, THUMB)) -> Image.Image:
    """A ``(C, N)`` signal as a waveform (min/max per column, top) over a log spectrogram (bottom)."""
    import numpy as np

    w, h = size
    x = audio.float().mean(0).numpy() if audio.dim() == 2 else audio.float().numpy()
    im = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(im)
    top = h // 2
    if len(x):
        cols = np.array_split(x, w)
        peak = max(float(np.abs(x).max()), 1e-6)
        for i, c in enumerate(cols):
            if len(c):
                lo, hi = float(c.min()) / peak, float(c.max()) / peak
                draw.line(
                    [(i, top // 2 - hi * (top // 2 - 2)), (i, top // 2 - lo * (top // 2 - 2))], fill=(30, 90, 200)
                )
        n_fft = 256
        if len(x) >= n_fft:
            hop = max(1, (len(x) - n_fft) // w)
            idx = np.arange(n_fft)[None, :] + hop * np.arange(min(w, (len(x) - n_fft) // hop + 1))[:, None]
            spec = np.abs(np.fft.rfft(x[idx] * np.hanning(n_fft), axis=1))[:, : n_fft // 4]  # 0 .. rate / 4
            db = 20 * np.log10(spec + 1e-6)
            db = np.clip((db - (db.max() - 80)) / 80, 0, 1)
            img = Image.fromarray((255 * db[:, ::-1].T).astype(np.uint8)).resize((w, h - top))
            im.paste(Image.merge("RGB", (img, img.point(lambda v: v // 2), img.point(lambda v: 255 - v))), (0, top))
    seconds = f"{len(x) / rate:.1f} s" if rate else f"{len(x)} samples"
    draw.text((2, 2), seconds, fill="black")
    return im


def _picture(dataset, sample: dict[str, Any]) -> Image.Image | None:
    """What to draw for a sample: its image, else its video's frames and/or its audio's waveform."""
    from ..readers import AudioReader, VideoReader

    image = next((v for v in sample.values() if isinstance(v, Image.Image)), None)
    if image is not None:
        return image
    readers = getattr(dataset, "readers", {})
    video = next((sample[n] for n, r in readers.items() if isinstance(r, VideoReader) and n in sample), None)
    audio = next(
        ((sample[n], r.sample_rate) for n, r in readers.items() if isinstance(r, AudioReader) and n in sample), None
    )
    if video is not None and audio is not None:
        both = Image.new("RGB", (THUMB, THUMB), "white")
        both.paste(frame_strip(video, THUMB // 2 + THUMB // 4).resize((THUMB // 2, THUMB // 2)), (THUMB // 4, 0))
        both.paste(waveform(audio[0], audio[1], (THUMB, THUMB // 2)), (0, THUMB // 2))
        return both
    if video is not None:
        return frame_strip(video)
    if audio is not None:
        return waveform(*audio)
    return None


def _text_of(sample: dict[str, Any]) -> list[str]:
    parts = [f"{sample['__key__']}"]
    for name, value in sample.items():
        if name.startswith("__") or isinstance(value, Image.Image):
            continue
        if hasattr(value, "shape"):
            value = f"tensor{tuple(value.shape)}"
        parts.append(f"{name}: {value}")
    return parts


def contact_sheet(dataset, indices: list[int], columns: int = 4) -> tuple[Image.Image, list[str]]:
    """Render samples of a zipped dataset into one image; also returns them as text lines."""
    font = ImageFont.load_default()
    rows = -(-len(indices) // columns)
    cell_w, text_h = THUMB + 16, 64
    sheet = Image.new("RGB", (columns * cell_w, max(rows, 1) * (THUMB + text_h + 8)), "white")
    draw = ImageDraw.Draw(sheet)
    text_lines = []
    for n, i in enumerate(indices):
        x, y = (n % columns) * cell_w + 8, (n // columns) * (THUMB + text_h + 8) + 4
        try:
            sample = dataset[i]
        except Exception as e:
            why = redact(str(e))  # drawn and printed: no credential of a URL or the environment
            draw.text((x, y), f"[{i}] unreadable:\n{why}"[:200], fill="red", font=font)
            text_lines.append(f"[{i}] unreadable: {why}")
            continue
        image = _picture(dataset, sample)
        if image is not None:
            thumb = image.convert("RGB")
            scale = THUMB / max(thumb.size)  # small images are enlarged too, so they can be seen
            thumb = thumb.resize(
                (max(1, round(thumb.width * scale)), max(1, round(thumb.height * scale))),
                Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BILINEAR,
            )
            sheet.paste(thumb, (x + (THUMB - thumb.width) // 2, y + (THUMB - thumb.height) // 2))
        words = _text_of(sample)
        text_lines.append(f"[{i}] " + " | ".join(words))
        caption = "\n".join(textwrap.wrap(" | ".join(words), 26)[:4])
        draw.text((x, y + THUMB + 4), caption, fill="black", font=font)
    return sheet, text_lines


# -- the subcommand ------------------------------------------------------------------------------
HELP = "contact sheet of samples (image + caption/label/key)"
EXAMPLES = ["mmloader preview out.lmdb -o grid.png -n 16", "mmloader preview samples/configs/mixed.yaml"]


def add_arguments(s) -> None:
    """The options of ``mmloader preview``."""
    from .args import int_at_least

    s.add_argument("path", help="a dataset or an experiment config")
    s.add_argument("-o", "--output", default="preview.png", help="the image to write (default preview.png)")
    s.add_argument("-n", type=int_at_least(1), default=16, help="samples to show (default 16)")
    s.add_argument("--columns", type=int_at_least(1), default=4, help="columns of the sheet (default 4)")


def run(args) -> int:
    """Write the contact sheet (one block per source of a config) and print its captions."""
    from ..loading.config import build_sources, is_config_path, load_config

    if is_config_path(args.path):
        sources = build_sources(load_config(args.path), pil_images=True)
        indices_by = [(name, ds) for name, ds in sources.items()]
    else:
        indices_by = [("", dataset_for_preview(args.path))]
    sheets, all_lines = [], []
    per = max(1, args.n // len(indices_by))
    for name, ds in indices_by:
        idx = list(range(min(per, len(ds))))
        sheet, lines = contact_sheet(ds, idx, columns=args.columns)
        sheets.append(sheet)
        all_lines += [f"{name}: {line}" if name else line for line in lines]
    width = max(s.width for s in sheets)
    out = Image.new("RGB", (width, sum(s.height for s in sheets)), "white")
    y = 0
    for s in sheets:
        out.paste(s, (0, y))
        y += s.height
    out.save(args.output)
    print("\n".join(all_lines))
    print(f"wrote {args.output}")
    return 0
