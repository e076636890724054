"""Interleaved image-text documents: texts and images in one order, any number of images.

A document is stored as one sample (what ``mmloader convert documents`` writes, and what
WebDataset reads as it is): a ``json`` field whose ``"document"`` list says the order,
``[{"text": "..."}, {"image": "0.jpg"}, {"text": "..."}, ...]`` and whose ``"meta"`` holds the
source's other fields, and one field per image (``0.jpg``, ``1.png``, ...: the image's number
and its format). :class:`DocumentReader` returns a :class:`Document` that reads and
decodes an image only when it is asked for; a batch loads its documents' images while it is
built (so a corrupt image is reported with the document's key and the image's place, under
the stream's ``on_error``) and collates them as one flat image batch plus per-document counts.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import DecodeError, SampleError
from ..storage import Store
from .base import Reader
from .tokens import OwnsTokenizer, encode_batch


class Document:
    """One document: ``segments()`` in order, each a text (a ``str``, or token ids with a
    tokenizer) or a decoded image; images are read from the store when first asked for.

    Args:
        reader: the :class:`DocumentReader` that read it.
        key: the sample's key.
        layout: the stored ``"document"`` list.
        meta: the json's other keys.
    """

    def __init__(self, reader: "DocumentReader", key: str, layout: list, meta: dict):
        self.reader, self.key, self.layout, self.meta = reader, key, layout, meta
        self.image_fields = [entry["image"] for entry in layout if "image" in entry]
        self._images: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"Document({self.key!r}, {len(self.texts)} texts, {len(self.image_fields)} images)"

    def __len__(self) -> int:
        return len(self.layout)

    @property
    def texts(self) -> list[str]:
        """The text segments, in order."""
        return [entry["text"] for entry in self.layout if "text" in entry]

    def image(self, i: int) -> Any:
        """Image ``i`` of the document (0-based, in document order), decoded by the reader's
        ``images`` reader; read from the store on first use."""
        hit = self._images.get(i)
        if hit is None:
            if not 0 <= i < len(self.image_fields):
                raise IndexError(f"document {self.key!r} has {len(self.image_fields)} images, not {i + 1}")
            hit = self._images[i] = self.reader.load_image(self.key, i, self.image_fields[i], len(self.image_fields))
        return hit

    def load(self) -> "Document":
        """Read and decode every image now (a batch does, so errors come while it is built)."""
        for i in range(len(self.image_fields)):
            self.image(i)
        return self

    def parts(self) -> list[tuple[str, Any]]:
        """``("text", str or int32 token ids)`` and ``("image", decoded image)``, in order."""
        out: list[tuple[str, Any]] = []
        n = 0
        ids = self.reader.encode(self.texts) if self.reader.tokenizer is not None else None
        t = 0
        for entry in self.layout:
            if "image" in entry:
                out.append(("image", self.image(n)))
                n += 1
            else:
                out.append(("text", ids[t] if ids is not None else entry["text"]))
                t += 1
        return out

    def segments(self) -> list[Any]:
        """Texts (``str``, or int32 token ids with a tokenizer) and decoded images, in order."""
        return [value for _kind, value in self.parts()]

    def pieces(self) -> list[tuple[str, Any]]:
        """What a packed row holds of this document: :meth:`parts`, texts as token ids (needs
        the reader's ``tokenizer``)."""
        if self.reader.tokenizer is None:
            raise SampleError(
                "packing a document needs its texts as token ids: DocumentReader(tokenizer=...)", key=self.key
            )
        return self.parts()

    def __reduce__(self):
        # The decoded images travel with it (a batch was built with them); the reader travels
        # without handles, as every reader does.
        return (_rebuilt, (self.reader, self.key, self.layout, self.meta, self._images))


def _rebuilt(reader, key, layout, meta, images) -> Document:
    doc = Document(reader, key, layout, meta)
    doc._images = images
    return doc


class DocumentReader(OwnsTokenizer, Reader):
    """Interleaved documents (see the module docs) -> :class:`Document`.

    Args:
        source: the dataset (path, URL or open store).
        field: the json field with the document's layout (default ``json``).
        images: the reader that decodes each image (default ``ImageReader(None)``: uint8 CHW
            tensors); give one with ``size=`` for batches of one image shape.
        tokenizer: a ``tokenizer.json`` path or ``tokenizers.Tokenizer``: texts become int32
            token ids (packing needs them).
        add_special_tokens: the tokenizer's special tokens around each text.
        kwargs: the options every reader takes (``transform=``, ``max_field_bytes=``).

    >>> docs = DocumentReader("obelics/", images=mmloader.ImageReader(None, size=(224, 224)))  # doctest: +SKIP
    >>> doc = docs[0]; doc.texts[0], doc.image(0).shape                                       # doctest: +SKIP
    """

    default_field = "json"

    def __init__(
        self,
        source: str | os.PathLike | Store | None,
        field: str | None = None,
        *,
        images: Reader | None = None,
        tokenizer: Any = None,
        add_special_tokens: bool = False,
        **kwargs: Any,
    ):
        super().__init__(source, field, **kwargs)
        if images is None:
            from .image import ImageReader

            images = ImageReader(None)
        self.images = images
        self._set_tokenizer(tokenizer, add_special_tokens)

    def encode(self, texts: list[str]) -> list[torch.Tensor]:
        """Token ids of ``texts`` (one ``encode_batch``)."""
        encoded = encode_batch(self._tokenizer(), texts, self.add_special_tokens) if texts else []
        return [torch.tensor(e.ids, dtype=torch.int32) for e in encoded]

    def decode(self, data: bytes, key: str) -> Document:
        if self._decode_fn is not None:
            return self._decode_fn(data)
        layout, meta = parse_layout(data, key)
        return Document(self, key, layout, meta)

    def from_column(
        self, datas: list, keys: list[str], *, share_memory: bool = False, fields: Sequence[str | None] | None = None
    ) -> Any:
        values = super().from_column(datas, keys, share_memory=share_memory, fields=fields)
        for doc in values:  # a batch's images are read now: its errors belong to its build
            if isinstance(doc, Document):
                doc.load()
        return values

    def load_image(self, key: str, i: int, field: str, count: int) -> Any:
        """Image ``i`` (of ``count``) of document ``key``, stored in ``field``, decoded."""
        where = f"image {i} of {count} (field {field!r})"
        record = self.store.get(key, [field])
        data = record.get(field)
        if data is None:
            raise SampleError(f"document {key!r}: {where} is missing", key=key, field=field, where=self.store.path)
        try:
            return self.images.decode(data, key)
        except Exception as e:  # noqa: BLE001 - any decoder failure is this image's, named
            raise DecodeError(
                f"document {key!r}: {where} cannot be decoded: {type(e).__name__}: {e}",
                key=key,
                field=field,
                where=self.store.path,
            ) from e

    def document_counts(self, rows: Sequence[int], tokens: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """``(text tokens, images)`` of each document, from one read of the stored layouts (no
        image is read): what packing plans with. Texts are tokenized (one ``encode_batch`` for
        many documents) only when ``tokens``; without a tokenizer they cannot be.

        Args:
            rows: rows of this reader's store.
            tokens: count the text tokens too (else None in their place).
        """
        if tokens and self.tokenizer is None:
            super().token_counts(rows)  # raises: what to do instead
        rows = list(rows)
        texts_out = np.zeros(len(rows), dtype=np.int64) if tokens else None
        images = np.zeros(len(rows), dtype=np.int64)
        for a in range(0, len(rows), 8192):
            chunk = rows[a : a + 8192]
            owner, texts = [], []
            for j, (row, data) in enumerate(zip(chunk, self.store.field_values(chunk, self.field))):
                layout = parse_layout(data, f"row {row}")[0] if data is not None else []
                images[a + j] = sum("image" in e for e in layout)
                if tokens:
                    owner += [a + j] * sum("text" in e for e in layout)
                    texts += [e["text"] for e in layout if "text" in e]
            if texts_out is not None and texts:
                np.add.at(texts_out, owner, [len(ids) for ids in self.encode(texts)])
        return texts_out, images

    def token_counts(self, rows: Sequence[int]) -> np.ndarray:
        """Text tokens of each document (its texts tokenized; no image is read).

        Args:
            rows: rows of this reader's store.
        """
        counts, _images = self.document_counts(rows)
        assert counts is not None
        return counts


def parse_layout(data: bytes, key: str) -> tuple[list, dict]:
    """``(layout, metadata)`` of a stored document json; a malformed one is a :class:`DecodeError`."""
    try:
        value = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DecodeError(f"document {key!r}: the json is not valid ({e})") from None
    layout = value.get("document") if isinstance(value, dict) else None
    if not isinstance(layout, list) or not all(
        isinstance(e, dict) and len(e) == 1 and (isinstance(e.get("text"), str) or isinstance(e.get("image"), str))
        for e in layout
    ):
        raise DecodeError(
            f"document {key!r}: the json has no 'document' list of {{'text': str}} / {{'image': field}} entries"
        )
    meta = value.get("meta") if isinstance(value.get("meta"), dict) and set(value) == {"document", "meta"} else None
    return layout, meta if meta is not None else {k: v for k, v in value.items() if k != "document"}
