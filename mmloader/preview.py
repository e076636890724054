"""``mmloader preview``: a contact sheet of samples, each image with its caption/label/key."""
from __future__ import annotations

import os
import textwrap
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from .readers import IMAGE_EXTENSIONS, reader_for
from .storage import open_store
from .align import zip_readers

THUMB = 160


def dataset_for_preview(path: str | os.PathLike):
    """A zipped dataset of every readable field of a store (images as PIL)."""
    store = open_store(path)
    readers = {}
    for f in store.fields:
        ext = f.rsplit(".", 1)[-1].lower()
        try:
            readers[f.replace(".", "_")] = reader_for(store, f, **({"output": "pil"} if ext in IMAGE_EXTENSIONS else {}))
        except Exception:
            continue  # e.g. pickle fields: never previewed
    return zip_readers(**readers)


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
            draw.text((x, y), f"[{i}] unreadable:\n{e}"[:200], fill="red", font=font)
            text_lines.append(f"[{i}] unreadable: {e}")
            continue
        image = next((v for v in sample.values() if isinstance(v, Image.Image)), None)
        if image is not None:
            thumb = image.convert("RGB")
            scale = THUMB / max(thumb.size)  # small images are enlarged too, so they can be seen
            thumb = thumb.resize((max(1, round(thumb.width * scale)), max(1, round(thumb.height * scale))),
                                 Image.NEAREST if scale > 1 else Image.BILINEAR)
            sheet.paste(thumb, (x + (THUMB - thumb.width) // 2, y + (THUMB - thumb.height) // 2))
        words = _text_of(sample)
        text_lines.append(f"[{i}] " + " | ".join(words))
        caption = "\n".join(textwrap.wrap(" | ".join(words), 26)[:4])
        draw.text((x, y + THUMB + 4), caption, fill="black", font=font)
    return sheet, text_lines
