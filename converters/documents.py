"""Interleaved image-text documents (web pages with images between paragraphs) -> one sample each.

A document is written as a ``json`` field whose ``"document"`` list gives the order, ``[{"text":
"..."}, {"image": "0.jpg"}, {"text": "..."}]``, its other keys the source's metadata, and one
field per image, ``0.jpg``, ``1.png``, ... (numbered in document order, the format from the
image's header): WebDataset reads the shards as they are, ``mmloader.DocumentReader`` reads them
lazily. SRC is one or more files or folders, in one of three layouts (``--layout``, else by the
files' extension):

* ``obelics``: Parquet tables with aligned list columns, ``texts: list<string|null>`` and
  ``images: list<binary|struct{bytes, path}|string|null>`` (``--texts-column``,
  ``--images-column``): at each place one of the two is set (OBELICS); an image is bytes, an HF
  ``Image`` struct or a path (relative to the table, or to ``--images``). The other columns are
  kept as metadata (binary ones left out).
* ``mmc4``: JSONL, a document a line: ``text_list`` and ``image_info`` (each with ``image_name``
  under ``--images`` and ``matched_text_index``, the sentence it belongs to: it is placed before
  that sentence, in ``image_info`` order); the other keys are kept as metadata.
* ``wds``: WebDataset tar shards, a document per key: ``KEY.json`` with ``texts`` (null entries
  are image places, in order) and ``KEY.0.jpg``, ``KEY.1.jpg``, ... (or a json with a
  ``document`` list in this converter's own layout, copied as it is).

Keys are ``--key-column`` (obelics), the tar keys (wds), or the document's number over all files.
An image URL is not downloaded (``img2dataset`` does that): the document is a bad sample, like a
missing or corrupt image, a place with both a text and an image, or image numbers that do not
match the json's places; ``--on-error skip`` lists them, ``--missing-images drop`` leaves missing
image files out of their documents instead (counted in the summary). Documents are read one
record batch, line or tar member at a time: memory does not grow with the input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from .common import (
    ConversionError,
    Item,
    ItemError,
    Summary,
    UsageError,
    execute,
    layout_parser,
    load_item,
    options_from,
    ordered_map,
    part_bounds,
    shard_alignment,
    write_samples,
)
from .provenance import describe_input

EXAMPLES = (
    "mmloader convert documents obelics/ docs/ --layout obelics --workers 2",
    "mmloader convert documents mmc4.jsonl docs.lmdb --layout mmc4 --images mmc4_images/",
    "mmloader convert documents shards/ docs/ --layout wds --part 1/4",
)
LAYOUTS = {"obelics": (".parquet", ".pq"), "mmc4": (".jsonl", ".ndjson"), "wds": (".tar",)}
BATCH_ROWS = 64


def _files(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(layout, input files in order) from SRC and ``--layout``."""
    files: list[str] = []
    for src in args.src:
        root = Path(src)
        if root.is_dir():
            files += sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif root.is_file():
            files.append(str(root))
        else:
            raise UsageError(f"{src}: no such file or folder")
    layout = args.layout
    if layout is None:
        found = {name for name, suffixes in LAYOUTS.items() for f in files if f.lower().endswith(suffixes)}
        if len(found) != 1:
            raise UsageError(
                f"--layout: say which layout SRC holds (obelics, mmc4 or wds); found {sorted(found) or 'no known files'}"
            )
        layout = found.pop()
    chosen = [f for f in files if f.lower().endswith(LAYOUTS[layout])]
    if not chosen:
        raise ConversionError(f"no {layout} files ({', '.join(LAYOUTS[layout])}) in {', '.join(args.src)}")
    return layout, chosen


def _image_cell(item: Item, n: int, cell: Any, base: str, where: str) -> None:
    """Image ``n`` of a document from bytes, an HF Image struct, or a path (never a URL)."""
    if isinstance(cell, dict):
        cell = cell.get("bytes") or cell.get("path")
    if isinstance(cell, (bytes, bytearray, memoryview)):
        item.data[f"{n}."], item.origin[f"{n}."] = bytes(cell), f"image {n}"
        return
    if not isinstance(cell, str) or not cell:
        raise ItemError(f"image {n}: neither bytes nor a path ({type(cell).__name__})", where)
    if cell.startswith(("http://", "https://")):
        raise ItemError(f"image {n} is a URL ({cell[:80]}): download the images first (img2dataset)", where)
    item.files[f"{n}."] = cell if os.path.isabs(cell) else os.path.join(base, cell)


class Documents:
    """The documents of the input, counted once, then listed a range at a time."""

    def __init__(self, args: argparse.Namespace, notes: list[str]):
        self.args, self.notes = args, notes
        self.dropped = 0  # --missing-images drop: images left out
        self.layout, self.files = _files(args)
        self.counts = [self._count(f) for f in self.files]
        self.total = sum(self.counts)
        self.width = max(len(str(self.total)), 9)

    def digest(self) -> str:
        h = hashlib.sha256(self.layout.encode())
        for f, n in zip(self.files, self.counts):
            h.update(f"{os.path.basename(f)}\t{os.path.getsize(f)}\t{n}\n".encode())
        return h.hexdigest()

    def _count(self, path: str) -> int:
        if self.layout == "obelics":
            import pyarrow.parquet as pq

            try:
                return pq.ParquetFile(path).metadata.num_rows
            except Exception as e:  # noqa: BLE001 - any reader failure names the file
                raise ConversionError(f"{path}: not a readable Parquet file ({e})") from None
        if self.layout == "mmc4":
            with open(path, "rb") as f:
                return sum(1 for line in f if line.strip())
        return len(self._tar_keys(path))

    def _tar_keys(self, path: str) -> list[str]:
        try:
            with tarfile.open(path) as tar:
                return list(dict.fromkeys(_split(m.name)[0] for m in tar if m.isfile()))
        except (tarfile.TarError, OSError) as e:
            raise ConversionError(f"{path}: not a readable tar file ({e})") from None

    def items(self, start: int, stop: int) -> Iterator[Item]:
        """The documents ``[start, stop)`` of the input, in order."""
        base = 0
        for path, count in zip(self.files, self.counts):
            if base + count > start and base < stop:
                lister = {"obelics": self._obelics, "mmc4": self._mmc4, "wds": self._wds}[self.layout]
                for j, item in enumerate(lister(path, base)):
                    if start <= base + j < stop:
                        yield item
            base += count

    def _key(self, n: int) -> str:
        return f"{n:0{self.width}d}"

    def _obelics(self, path: str, base: int) -> Iterator[Item]:
        import pyarrow.parquet as pq

        a = self.args
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        for column in (a.texts_column, a.images_column, a.key_column):
            if column and column not in names:
                raise ConversionError(f"{path}: no column {column!r} (its columns: {', '.join(names)})")
        folder = a.images or os.path.dirname(path)
        n = base
        for batch in table.iter_batches(batch_size=BATCH_ROWS):
            rows = batch.to_pylist()
            for r, row in enumerate(rows):
                where = f"{path}:row {n - base}"
                key = str(row[a.key_column]) if a.key_column else self._key(n)
                item = Item(key=key, where=where)
                n += 1
                try:
                    texts, images = row.get(a.texts_column) or [], row.get(a.images_column) or []
                    if len(texts) != len(images):
                        raise ItemError(f"{len(texts)} texts but {len(images)} images: the lists must align", where)
                    document: list[dict] = []
                    number = 0
                    for j, (text, image) in enumerate(zip(texts, images)):
                        if text is not None and image is not None:
                            raise ItemError(f"place {j} holds both a text and an image", where)
                        if image is not None:
                            _image_cell(item, number, image, folder, where)
                            document.append({"image": number})
                            number += 1
                        elif text is not None:
                            document.append({"text": str(text)})
                    meta = {
                        k: v
                        for k, v in row.items()
                        if k not in (a.texts_column, a.images_column) and not isinstance(v, (bytes, bytearray))
                    }
                    item.values["json"] = {"document": document, **meta}
                except ItemError as e:
                    item.error = e.reason
                yield item

    def _mmc4(self, path: str, base: int) -> Iterator[Item]:
        folder = self.args.images or os.path.dirname(path)
        n = base
        with open(path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{line_no}"
                item = Item(key=self._key(n), where=where)
                n += 1
                try:
                    row = json.loads(raw)
                    if not isinstance(row, dict) or not isinstance(row.get("text_list"), list):
                        raise ItemError("an mmc4 line is a JSON object with a 'text_list'", where)
                    texts, infos = row["text_list"], row.get("image_info") or []
                    before: dict[int, list[dict]] = {}
                    for info in infos:
                        k = info.get("matched_text_index")
                        if not isinstance(k, int) or not 0 <= k < len(texts):
                            raise ItemError(
                                f"image {info.get('image_name')!r}: matched_text_index {k!r} is not a sentence", where
                            )
                        before.setdefault(k, []).append(info)
                    document: list[dict] = []
                    number = 0
                    for k, text in enumerate(texts):
                        for info in before.get(k, []):
                            file = os.path.join(folder, str(info.get("image_name", "")))
                            if not os.path.isfile(file):
                                if self.args.missing_images == "drop":
                                    self.dropped += 1
                                    continue
                                raise ItemError(f"image {info.get('image_name')!r} is not in {folder}", where)
                            item.files[f"{number}."] = file
                            document.append({"image": number})
                            number += 1
                        document.append({"text": str(text)})
                    meta = {k: v for k, v in row.items() if k != "text_list"}
                    item.values["json"] = {"document": document, **meta}
                except ValueError as e:
                    item.error = f"not valid JSON: {e}"
                except ItemError as e:
                    item.error = e.reason
                yield item

    def _wds(self, path: str, base: int) -> Iterator[Item]:
        n = base
        with tarfile.open(path) as tar:
            group: list[tuple[str, bytes]] = []
            current = None
            for member in tar:
                if not member.isfile():
                    continue
                key, field = _split(member.name)
                if current is not None and key != current:
                    yield self._wds_item(current, group, f"{path}:{current}", n)
                    n += 1
                    group = []
                current = key
                data = tar.extractfile(member)
                group.append((field, data.read() if data is not None else b""))
            if current is not None:
                yield self._wds_item(current, group, f"{path}:{current}", n)

    def _wds_item(self, key: str, fields: list[tuple[str, bytes]], where: str, n: int) -> Item:
        item = Item(key=key.replace("/", "_"), where=where)
        try:
            values = dict(fields)
            if "json" not in values:
                raise ItemError("no json field (the document's texts)", where)
            meta = json.loads(values["json"])
            images = sorted((int(f.partition(".")[0]), f) for f in values if f.partition(".")[0].isdigit())
            if [i for i, _f in images] != list(range(len(images))):
                raise ItemError(f"images are not numbered 0..{len(images) - 1}: {[f for _i, f in images]}", where)
            if isinstance(meta.get("document"), list):  # already this converter's layout
                layout = meta.pop("document")
                order = [int(str(e["image"]).partition(".")[0]) for e in layout if "image" in e]
                document = [{"image": i} if "image" in e else e for e, i in _with_numbers(layout, order)]
            else:
                texts = meta.pop("texts", None)
                if not isinstance(texts, list):
                    raise ItemError("the json has no 'texts' list", where)
                slots = sum(t is None for t in texts)
                if slots != len(images):
                    raise ItemError(
                        f"the json's texts have {slots} image places (null) for {len(images)} images", where
                    )
                numbers = iter(range(len(images)))
                document = [{"text": str(t)} if t is not None else {"image": next(numbers)} for t in texts]
            for i, f in images:
                item.data[f"{i}."], item.origin[f"{i}."] = values[f], f"image {i} ({f})"
            item.values["json"] = {"document": document, **meta}
        except ValueError as e:
            item.error = f"the json is not valid: {e}"
        except (ItemError, KeyError, TypeError) as e:
            item.error = e.reason if isinstance(e, ItemError) else f"the document layout is not valid ({e})"
        return item


def _with_numbers(layout: list, order: list[int]) -> Iterator[tuple[dict, int]]:
    numbers = iter(order)
    for entry in layout:
        yield entry, (next(numbers) if "image" in entry else -1)


def _split(name: str) -> tuple[str, str]:
    """A tar member's (key, field), as WebDataset splits it: at the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, field = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), field


def _load(job) -> tuple[Item, dict | None, ItemError | None]:
    """Load one document; its json names each image by the field its header gave it."""
    item, opts = job
    try:
        sample = load_item(item, opts)
    except ItemError as e:
        return item, None, e
    fields = {f.partition(".")[0]: f for f in sample if f.partition(".")[0].isdigit()}
    doc = dict(sample["json"])
    doc["document"] = [{"image": fields[str(e["image"])]} if "image" in e else e for e in doc["document"]]
    sample["json"] = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)
    return item, sample, None


def prepare(args: argparse.Namespace, notes: list[str]):
    if args.shuffle_seed is not None:
        raise UsageError(
            "--shuffle-seed: documents are converted in input order, streamed (constant memory); "
            "shuffle when reading (mmloader.Stream shuffles every epoch)"
        )
    docs = Documents(args, notes)
    metadata = describe_input(
        {"layout": "documents", "documents": docs.layout}, args, docs.digest(), {"samples": docs.total}
    )

    def convert(part: tuple[int, int] | None, dst: str) -> Summary:
        start, stop = part_bounds(docs.total, part, shard_alignment(args)) if part else (0, docs.total)
        opts = options_from(args)
        loaded = ordered_map(_load, ((it, opts) for it in docs.items(start, stop)), args.workers)
        summary = write_samples(loaded, dst, args, metadata, total=stop - start, notes=notes)
        if docs.dropped:
            summary.notes.append(f"--missing-images drop: {docs.dropped} missing image(s) left out of their documents")
        return summary

    return docs.digest(), convert


def parser() -> argparse.ArgumentParser:
    p = layout_parser("documents", __doc__, EXAMPLES)
    for action in p._actions:  # SRC: one or more files or folders
        if action.dest == "src":
            action.nargs, action.metavar = "+", "SRC"
            action.help = "Parquet tables (obelics), JSONL files (mmc4) or tar shards (wds), or folders of them"
    p.add_argument("--layout", choices=sorted(LAYOUTS), help="the input's layout (default: from the files' extension)")
    p.add_argument("--images", help="the folder image paths and names are relative to (default: beside each file)")
    p.add_argument("--texts-column", default="texts", help="obelics: the list of texts (default: texts)")
    p.add_argument("--images-column", default="images", help="obelics: the list of images (default: images)")
    p.add_argument("--key-column", help="obelics: the column used as the key (default: the document's number)")
    p.add_argument(
        "--missing-images",
        choices=("error", "drop"),
        default="error",
        help="mmc4: an image file that is not there makes the document a bad sample (error), or is left out (drop)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parser(), argv, prepare)


if __name__ == "__main__":
    sys.exit(main())
