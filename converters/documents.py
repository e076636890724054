"""Interleaved image-text documents (web pages with images between paragraphs) -> one sample each.

A document is written as a ``json`` field whose ``"document"`` list gives the order, ``[{"text":
"..."}, {"image": "0.jpg"}, {"text": "..."}]``, and whose ``"meta"`` holds the source's other
fields, and one field per image, ``0.jpg``, ``1.png``, ... (numbered in document order, the format from the
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
  ``document`` list in this converter's own layout, checked and copied). The sample's other
  fields (``KEY.txt``...) are kept beside the document.

Keys are ``--key-column`` (obelics), the tar keys (wds), or the document's number over all files.
An image URL is not downloaded (``img2dataset`` does that): the document is a bad sample, like a
missing or corrupt image, a place with both a text and an image, or image numbers that do not
match the json's places, tar members of one key that are not next to each other, more than
``--max-images`` images; ``--on-error skip`` lists them, ``--missing-images drop`` leaves missing
image files out of their documents instead (counted in the summary). Documents are read one
row group, line or tar member at a time: memory does not grow with the input.
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
    int_at_least,
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


def _files(args: argparse.Namespace, notes: list[str]) -> tuple[str, list[str]]:
    """(layout, input files in order) from SRC and ``--layout``; other files are noted."""
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
        if not found:  # nothing to convert: a failure naming what was looked for
            looked = ", ".join(f"{n} ({', '.join(x)})" for n, x in LAYOUTS.items())
            raise ConversionError(f"no documents found in {', '.join(args.src)}: looked for {looked}")
        if len(found) > 1:
            raise UsageError(f"--layout: say which layout SRC holds; it has files of {', '.join(sorted(found))}")
        layout = found.pop()
    chosen = [f for f in files if f.lower().endswith(LAYOUTS[layout])]
    other = [f for f in files if f not in chosen]
    if other:
        notes.append(
            f"not input: {len(other)} file(s) that are not {layout} files ({', '.join(LAYOUTS[layout])}), "
            f"e.g. {other[0]} (compressed .jsonl.gz / .tgz: decompress them first)"
        )
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
    item.origin[f"{n}."] = f"image {n}"


def _plain_meta(value: Any) -> Any:
    """Metadata as JSON holds it: bytes left out (they are data, not metadata), NaN as null."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _plain_meta(v) for k, v in value.items() if not isinstance(v, (bytes, bytearray))}
    if isinstance(value, list):
        return [_plain_meta(v) for v in value if not isinstance(v, (bytes, bytearray))]
    return value


def _text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise ItemError(f"{what} is a {type(value).__name__}, not a text", where)
    return value


class Documents:
    """The documents of the input, counted once, then listed a range at a time."""

    def __init__(self, args: argparse.Namespace, notes: list[str]):
        self.args, self.notes = args, notes
        self.dropped = 0  # --missing-images drop: images left out
        self.layout, self.files = _files(args, notes)
        self.counts = [self._count(f) for f in self.files]
        self.total = sum(self.counts)
        self.width = max(len(str(self.total)), 9)

    def digest(self) -> str:
        """The input listing: each file's name, size, modification time and document count."""
        h = hashlib.sha256(self.layout.encode())
        for f, n in zip(self.files, self.counts):
            st = os.stat(f)
            h.update(f"{os.path.basename(f)}\t{st.st_size}\t{st.st_mtime_ns}\t{n}\n".encode())
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
        return sum(1 for _key, _members in self._tar_groups(path, read=False))

    def _tar_groups(self, path: str, read: bool = True) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
        """Each run of consecutive members of one key, as WebDataset groups them: ``(key,
        [(field, bytes or an ItemError)])``; members are read only when ``read``."""
        limit = self.args.max_file_bytes
        try:
            with tarfile.open(path) as tar:
                current, group = None, []
                for member in tar:
                    if not member.isfile():
                        continue
                    key, field = _split(member.name)
                    if current is not None and key != current:
                        yield current, group
                        group = []
                    current = key
                    if not read:
                        continue
                    if member.size > limit:
                        group.append(
                            (field, ItemError(f"member {member.name!r} is {member.size} bytes, over --max-file-bytes"))
                        )
                        continue
                    data = tar.extractfile(member)
                    group.append((field, data.read() if data is not None else b""))
                    tar.members = []  # what tarfile keeps of every member read: memory would grow with the shard
                if current is not None:
                    yield current, group
        except (tarfile.TarError, OSError) as e:
            raise ConversionError(f"{path}: not a readable tar file ({e})") from None

    def items(self, start: int, stop: int) -> Iterator[Item]:
        """The documents ``[start, stop)`` of the input, in order (documents before ``start``
        are skipped without being built; a file past ``stop`` is not opened)."""
        base = 0
        lister = {"obelics": self._obelics, "mmc4": self._mmc4, "wds": self._wds}[self.layout]
        for path, count in zip(self.files, self.counts):
            if base + count > start and base < stop:
                yield from lister(path, base, max(start - base, 0), min(stop - base, count))
            base += count

    def _key(self, n: int) -> str:
        return f"{n:0{self.width}d}"

    def _obelics(self, path: str, base: int, first: int, last: int) -> Iterator[Item]:
        import pyarrow.parquet as pq

        a = self.args
        table = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
        names = table.schema_arrow.names
        for column in (a.texts_column, a.images_column, a.key_column):
            if column and column not in names:
                raise ConversionError(f"{path}: no column {column!r} (its columns: {', '.join(names)})")
        folder = a.images or os.path.dirname(path)
        r = 0
        for g in range(table.metadata.num_row_groups):  # a row group at a time: memory stays flat
            size = table.metadata.row_group(g).num_rows
            if r + size <= first:
                r += size
                continue
            if r >= last:
                return
            for batch in table.read_row_group(g).to_batches(BATCH_ROWS):
                for row in batch.to_pylist():
                    if first <= r < last:
                        yield self._obelics_item(row, f"{path}:row {r}", base + r, folder)
                    r += 1

    def _obelics_item(self, row: dict, where: str, n: int, folder: str) -> Item:
        a = self.args
        item = Item(key=str(row[a.key_column]) if a.key_column else self._key(n), where=where)
        try:
            texts, images = row.get(a.texts_column), row.get(a.images_column)
            texts, images = [] if texts is None else texts, [] if images is None else images
            if not isinstance(texts, list) or not isinstance(images, list):
                raise ItemError(f"{a.texts_column!r} and {a.images_column!r} must be lists", where)
            if len(texts) != len(images):
                raise ItemError(f"{len(texts)} texts but {len(images)} images: the lists must align", where)
            document: list[dict] = []
            for j, (text, image) in enumerate(zip(texts, images)):
                if text is not None and image is not None:
                    raise ItemError(f"place {j} holds both a text and an image", where)
                if image is not None:
                    _image_cell(item, len(item.files) + len(item.data), image, folder, where)
                    document.append({"image": len(item.files) + len(item.data) - 1})
                elif text is not None:
                    document.append({"text": _text(text, f"text {j}", where)})
            meta = {k: v for k, v in row.items() if k not in (a.texts_column, a.images_column)}
            item.values["json"] = {"document": document, "meta": _plain_meta(meta)}
            _check_images(item, len(item.files) + len(item.data), a, where)
        except ItemError as e:
            item.error = e.reason
        return item

    def _mmc4(self, path: str, base: int, first: int, last: int) -> Iterator[Item]:
        folder = self.args.images or os.path.dirname(path)
        n = 0
        with open(path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                if n >= last:
                    return
                if n >= first:
                    yield self._mmc4_item(raw, f"{path}:{line_no}", base + n, folder)
                n += 1

    def _mmc4_item(self, raw: bytes, where: str, n: int, folder: str) -> Item:
        item = Item(key=self._key(n), where=where)
        try:
            try:
                row = json.loads(raw)
            except ValueError as e:
                raise ItemError(f"not valid JSON: {e}", where) from None
            if not isinstance(row, dict) or not isinstance(row.get("text_list"), list):
                raise ItemError("an mmc4 line is a JSON object with a 'text_list' list", where)
            texts, infos = row["text_list"], row.get("image_info") or []
            if not isinstance(infos, list) or not all(isinstance(i, dict) for i in infos):
                raise ItemError("'image_info' must be a list of objects", where)
            before: dict[int, list[dict]] = {}
            for info in infos:
                k = info.get("matched_text_index")
                if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(texts):
                    raise ItemError(
                        f"image {info.get('image_name')!r}: matched_text_index {k!r} is not a sentence", where
                    )
                if not isinstance(info.get("image_name"), str) or not info["image_name"]:
                    raise ItemError(f"an image_info entry has no image_name: {json.dumps(info)[:80]}", where)
                before.setdefault(k, []).append(info)
            document: list[dict] = []
            number = 0
            for k, text in enumerate(texts):
                for info in before.get(k, []):
                    file = os.path.join(folder, info["image_name"])
                    if not os.path.isfile(file):
                        if self.args.missing_images == "drop":
                            self.dropped += 1
                            continue
                        raise ItemError(f"image {info['image_name']!r} is not in {folder}", where)
                    item.files[f"{number}."], item.origin[f"{number}."] = file, f"image {info['image_name']!r}"
                    document.append({"image": number})
                    number += 1
                document.append({"text": _text(text, f"sentence {k}", where)})
            meta = {k: v for k, v in row.items() if k != "text_list"}
            item.values["json"] = {"document": document, "meta": _plain_meta(meta)}
            _check_images(item, number, self.args, where)
        except ItemError as e:
            item.error = e.reason
        return item

    def _wds(self, path: str, base: int, first: int, last: int) -> Iterator[Item]:
        seen: set[str] = set()
        for n, (key, fields) in enumerate(self._tar_groups(path)):
            if n >= last:
                return
            if n >= first:
                item = self._wds_item(key, fields, f"{path}:{key}")
                if key in seen:  # WebDataset would read it as two samples: say so, lose nothing
                    item.error = f"the members of key {key!r} are not next to each other in the tar"
                yield item
            seen.add(key)

    def _wds_item(self, key: str, fields: list[tuple[str, Any]], where: str) -> Item:
        item = Item(key=key, where=where)
        try:
            values: dict[str, Any] = {}
            for f, v in fields:
                if isinstance(v, ItemError):
                    raise ItemError(v.reason, where)
                if f in values:
                    raise ItemError(f"two members for field {f!r}", where)
                values[f] = v
            if "json" not in values:
                raise ItemError("no json field (the document's texts)", where)
            try:
                meta = json.loads(values.pop("json"))
            except ValueError as e:
                raise ItemError(f"the json is not valid: {e}", where) from None
            if not isinstance(meta, dict):
                raise ItemError(f"the json is a {type(meta).__name__}, not an object", where)
            images = {int(f.partition(".")[0]): f for f in values if f.partition(".")[0].isdigit()}
            if sorted(images) != list(range(len(images))):
                raise ItemError(f"images are not numbered 0..{len(images) - 1}: {sorted(images.values())}", where)
            if isinstance(meta.get("document"), list):  # this converter's own layout: checked, kept
                document = _own_layout(meta.pop("document"), images, where)
                meta = meta.get("meta", meta) if set(meta) <= {"meta"} else meta
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
                document = [
                    {"text": _text(t, f"text {j}", where)} if t is not None else {"image": next(numbers)}
                    for j, t in enumerate(texts)
                ]
            for i, f in images.items():
                item.data[f"{i}."], item.origin[f"{i}."] = values.pop(f), f"image {i} ({f})"
            for f, v in values.items():  # the sample's other fields (txt, cls...) go with it
                item.data[f], item.origin[f] = v, f"field {f!r}"
            item.values["json"] = {"document": document, "meta": _plain_meta(meta)}
            _check_images(item, len(images), self.args, where)
        except ItemError as e:
            item.error = e.reason
        return item


def _own_layout(layout: list, images: dict[int, str], where: str) -> list[dict]:
    """A stored layout, checked: each entry a text or an image field the sample has, every image used once."""
    document, used = [], []
    for j, entry in enumerate(layout):
        if isinstance(entry, dict) and set(entry) == {"text"} and isinstance(entry["text"], str):
            document.append(entry)
        elif isinstance(entry, dict) and set(entry) == {"image"} and str(entry["image"]).partition(".")[0].isdigit():
            number = int(str(entry["image"]).partition(".")[0])
            if number not in images:
                raise ItemError(f"entry {j} names image {entry['image']!r}, which the sample does not have", where)
            document.append({"image": number})
            used.append(number)
        else:
            raise ItemError(f"entry {j} of 'document' is neither {{'text': str}} nor {{'image': field}}", where)
    if sorted(used) != sorted(images):
        raise ItemError(f"the layout uses images {sorted(used)}, the sample has {sorted(images)}", where)
    return document


def _check_images(item: Item, count: int, args: argparse.Namespace, where: str) -> None:
    if count > args.max_images:
        raise ItemError(f"{count} images, over --max-images {args.max_images}", where)


def _split(name: str) -> tuple[str, str]:
    """A tar member's (key, field), as WebDataset splits it: at the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, field = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), field


def _load(job) -> tuple[Item, dict | None, ItemError | None]:
    """Load one document; its json names each image by the field its header gave it, and an
    error names the document (its file and row), and the image where it is one."""
    item, opts = job
    try:
        sample = load_item(item, opts)
    except ItemError as e:
        if e.path and item.where and e.path != item.where:  # a file named by the document
            return item, None, ItemError(f"{e.reason} ({e.path})", item.where)
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
        "--max-images",
        type=int_at_least(1),
        default=256,
        help="a document with more images is a bad sample (default 256; LMDB holds about 1,000 distinct fields)",
    )
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
