"""A UTF-8 text file, one sample per line -> field ``txt`` (keys are 0-based line numbers).

Constant memory for files of any size. With ``--workers N`` the file is cut into
byte ranges; a line belongs to the range where it starts, so a line crossing a
boundary is read exactly once, and ranges are written in file order. CRLF line
ends and a last line without a newline are handled. ``--blank-lines`` says what
a blank line is: skipped and reported (default; a skipped blank line is not an
error), kept, or an error (a bad sample, like a line that is not UTF-8).

``--tokenizer tokenizer.json`` tokenizes once, here, instead of in every epoch: each sample also
gets field ``ids.npy``, its token ids as an int32 ``.npy`` array (read with
``mmloader.ArrayReader(dst, "ids.npy")``; batches pad to their longest with a mask). The file is
a tokenizer saved by Hugging Face ``tokenizers`` (``Tokenizer.save``, or the ``tokenizer.json`` of
a model folder); it is read from disk, never downloaded. Lines are tokenized a chunk at a time
with ``encode_batch`` (Rust, without the GIL), with the tokenizer's special tokens unless
``--no-special-tokens``.
"""

from __future__ import annotations

import argparse
import codecs
import io
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from mmloader.media.tokenizer import encode_batch
from mmloader.media.tokenizer import load_tokenizer as tokenizer_from
from mmloader.storage.text.store import TextLinesStore, line_key

from .common import (
    ConversionError,
    Item,
    ItemError,
    Skipped,
    Summary,
    UsageError,
    check_required_fields,
    execute,
    layout_parser,
    ordered_map,
    part_bounds,
    shard_alignment,
    write_samples,
)
from .provenance import describe_input

EXAMPLES = (
    "mmloader convert textlines corpus.txt corpus.lmdb --workers 2",
    "mmloader convert textlines corpus.txt tokens.lmdb --tokenizer tokenizer.json",
    "mmloader convert textlines corpus.txt shards/ --format tar --shard-size 100000 --blank-lines keep",
)

CHUNK_BYTES = 4 << 20


def line_start_at_or_after(f, pos: int) -> int:
    """The first line start >= pos (a line starts at 0 or right after a newline)."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    while True:
        block = f.read(1 << 16)
        if not block:
            return f.tell()
        nl = block.find(b"\n")
        if nl >= 0:
            return pos - 1 + nl + 1
        pos += len(block)


def chunk_ranges(path: Path, start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """Cut [start, end) (both line starts) into line-aligned ranges of about ``chunk`` bytes."""
    bounds = [start]
    with open(path, "rb") as f:
        pos = start + chunk
        while pos < end:
            b = line_start_at_or_after(f, pos)
            if b >= end:
                break
            if b > bounds[-1]:
                bounds.append(b)
            pos = b + chunk
    bounds.append(end)
    return list(zip(bounds[:-1], bounds[1:]))


def count_newlines(path: Path, end: int) -> int:
    n = 0
    with open(path, "rb") as f:
        left = end
        while left > 0:
            block = f.read(min(1 << 22, left))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n


def _split(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the range ended with a newline: no extra line
    return [l[:-1] if l.endswith(b"\r") else l for l in lines]


def _check(line: bytes, blank: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"text is not UTF-8 ({e.reason} at byte {e.start})"
    if not text.strip() and blank != "keep":
        return None, "blank line"
    return text, None


def load_tokenizer(path: str):
    """The tokenizer in ``path``; what is wrong with it (not installed, not a file, not a
    tokenizer) is a usage error."""
    try:
        return tokenizer_from(path)
    except (ImportError, OSError, ValueError) as e:
        raise UsageError(f"--tokenizer: {e}") from None


def _with_ids(checked: list[tuple[str | None, str | None]], tokenize) -> list[tuple]:
    """Add each good line's token ids (an int32 array); one ``encode_batch`` per chunk."""
    if tokenize is None:
        return [(text, reason, None) for text, reason in checked]
    tokenizer, special = tokenize
    good = [text for text, reason in checked if reason is None]
    encoded = iter(encode_batch(tokenizer, good, special))
    return [
        (text, reason, np.asarray(next(encoded).ids, dtype=np.int32) if reason is None else None)
        for text, reason in checked
    ]


def _load_range(job) -> list[tuple]:
    path, start, end, blank, tokenize = job
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if start == 0:
        data = data.removeprefix(codecs.BOM_UTF8)  # a byte-order mark starts the file, not line 0's text
    return _with_ids([_check(l, blank) for l in _split(data)], tokenize)


def _load_lines(job) -> list[tuple]:
    path, index_path, numbers, blank, tokenize = job
    store = TextLinesStore(path, index_path=index_path, progress=False)
    checked = _with_ids([_check(store.read(n)["txt"], blank) for n in numbers], tokenize)
    return [(n, *row) for n, row in zip(numbers, checked)]


def _npy(ids: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, ids, allow_pickle=False)
    return out.getvalue()


def _samples(items_with_results, path: str, blank: str) -> Iterator[tuple[Item, dict | None, ItemError | None]]:
    for n, text, reason, ids in items_with_results:
        item = Item(key=line_key(n), where=f"{path}:{n + 1}")
        if reason is not None:
            policy = Skipped if reason == "blank line" and blank == "skip" else ItemError
            yield item, None, policy(reason, item.where)
        elif ids is None:
            yield item, {"__key__": item.key, "txt": text}, None
        else:
            yield item, {"__key__": item.key, "txt": text, "ids.npy": _npy(ids)}, None


def file_digest(path: Path) -> str:
    """Name, size and the first and last MiB: enough to tell one input file from another without
    reading all of it (a file rewritten in place with the same size and ends is not noticed)."""
    import hashlib

    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}\0{size}".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()


def prepare(args: argparse.Namespace, notes: list[str]):
    path = Path(args.src)
    if not path.is_file():
        raise ConversionError(f"{path} is a folder; textlines converts one text file, one sample a line")
    if args.resize_max or args.check_decode:
        raise UsageError("--resize-max and --check-decode apply to images; a text file has none")
    check_required_fields(args.require, [], layout_fields=["txt", "ids.npy"] if args.tokenizer else ["txt"])
    if args.no_special_tokens and not args.tokenizer:
        raise UsageError("--no-special-tokens applies with --tokenizer")
    tokenize = (load_tokenizer(args.tokenizer), not args.no_special_tokens) if args.tokenizer else None
    size = path.stat().st_size
    if size == 0 or (size == 3 and path.read_bytes() == codecs.BOM_UTF8):  # (a byte-order mark is no text)
        raise ConversionError(f"no samples found in {path}: the file is empty (looked for lines of text)")

    source_digest = file_digest(path)
    meta: dict = {"layout": "textlines"}
    digest = source_digest
    if tokenize is not None:  # other token ids are another output: parts must not mix them
        tokenizer_digest = file_digest(Path(args.tokenizer))
        digest += f"+tokenizer:{tokenizer_digest}:special={tokenize[1]}"
        meta["tokenizer"] = {
            "fingerprint": tokenizer_digest,  # the file itself only with --record-source
            **({"file": str(Path(args.tokenizer).resolve())} if args.record_source else {}),
            "vocab_size": tokenize[0].get_vocab_size(),
            "special_tokens": tokenize[1],
            "field": "ids.npy",
            "dtype": "int32",
        }
    meta = describe_input(meta, args, source_digest, {"files": 1, "bytes": size})

    def convert(part: tuple[int, int] | None, dst: str) -> Summary:
        return _convert(args, notes, path, size, part, dst, meta, tokenize)

    return digest, convert


def _convert(
    args: argparse.Namespace, notes: list[str], path: Path, size: int, part, dst: str, meta: dict, tokenize=None
) -> Summary:
    if args.shuffle_seed is not None:
        with tempfile.TemporaryDirectory() as tmp:
            index_path = os.path.join(tmp, "lines.npy")
            store = TextLinesStore(path, index_path=index_path, progress=not args.quiet)
            order = np.random.default_rng(args.shuffle_seed).permutation(len(store))
            if part:
                a, b = part_bounds(len(order), part, shard_alignment(args))
                order = order[a:b]
            jobs = (
                (str(path), index_path, order[a : a + 4096].tolist(), args.blank_lines, tokenize)
                for a in range(0, len(order), 4096)
            )
            results = (r for batch in ordered_map(_load_lines, jobs, args.workers, chunksize=1) for r in batch)
            summary = write_samples(
                _samples(results, str(path), args.blank_lines), dst, args, meta, total=len(order), notes=notes
            )
    else:
        # Parts are byte ranges of the file (a line belongs to the range where it starts): no
        # line count is needed, and merge cuts the shards as one process would.
        with open(path, "rb") as f:
            start, end = 0, size
            if part:
                i, n = part
                start = line_start_at_or_after(f, i * size // n)
                end = line_start_at_or_after(f, (i + 1) * size // n) if i + 1 < n else size
        first_line = count_newlines(path, start) if start else 0
        ranges = chunk_ranges(path, start, end, CHUNK_BYTES) if end > start else []
        jobs = ((str(path), a, b, args.blank_lines, tokenize) for a, b in ranges)

        def numbered():
            n = first_line
            for batch in ordered_map(_load_range, jobs, args.workers, chunksize=1):
                for row in batch:
                    yield (n, *row)
                    n += 1

        summary = write_samples(
            _samples(numbered(), str(path), args.blank_lines), dst, args, meta, total=None, notes=notes
        )
    return summary


def parser() -> argparse.ArgumentParser:
    p = layout_parser("textlines", __doc__, EXAMPLES)
    p.add_argument(
        "--blank-lines",
        choices=("skip", "keep", "error"),
        default="skip",
        help="blank lines: skip (default: listed in the report, not an error), keep as samples, "
        "or error (a bad sample: stops the conversion under --on-error raise)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="TOKENIZER_JSON",
        help="also store each line's token ids (field "
        "ids.npy, int32), tokenized once here with this Hugging Face tokenizers file",
    )
    p.add_argument(
        "--no-special-tokens",
        action="store_true",
        help="with --tokenizer: leave out the tokenizer's special tokens (e.g. BOS/EOS)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parser(), argv, prepare)


if __name__ == "__main__":
    sys.exit(main())
