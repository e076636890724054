"""A config's ``sources``: each source's stores opened and its modalities' readers built, zipped.

Every path is taken from the config's ``root``; every error names the config key at fault
(``sources.<name>.modalities.<modality>.<option>``) and is raised when the config is read.
The format of a path is the storage registry's to recognise (:mod:`mmloader.storage.formats`).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Mapping

from ..align.zip import Zipped
from ..errors import AlignmentError, ConfigError, MMLoaderError, UnsafeFieldError
from ..readers import IMAGE_EXTENSIONS, VideoReader, reader_for
from ..readers.registry import KINDS
from ..storage import is_url, open_store, recognise
from ..storage.formats import TEXT_SUFFIXES
from ..storage.remote.redaction import redact_url

SOURCE_KEYS = {"path", "index_path", "split", "weight", "modalities", "align", "filter", "keys", "fraction", "limit"}


#: A source's selection (mmloader.select): config key -> select() option.
SELECT_KEYS = {"filter": "where", "keys": "keys", "fraction": "fraction", "limit": "limit"}


READER_KEYS = {
    "field",
    "path",
    "split",
    "index_path",
    "reader",
    "output",
    "mode",
    "size",
    "max_pixels",
    "transform",
    # fused image augmentation (ImageReader): crop: {random: 224} or {center: 224}, flip: 0.5,
    # normalize: imagenet | [mean, std], dtype: float32
    "crop",
    "flip",
    "normalize",
    "dtype",
    "allow_pickle",
    "tokenizer",
    "add_special_tokens",
    # video and audio (VideoReader, AudioReader); an audio modality's ``clip`` may name a video
    # modality of the same source: the audio track over that modality's clip
    "frames",
    "fps",
    "clip",
    "max_seconds",
    "max_duration",
    "threads",
    "sample_rate",
    "mono",
    "decoder",
    "max_sample_rate",
    "max_channels",
}


#: What ``reader:`` may name: the registry's kinds, and a video modality's timestamps companion.
READERS = {*KINDS, "timestamps"}


def import_object(spec: str, where: str) -> Any:
    """``"package.module:Name"`` or ``"package.module.Name"``; classes are instantiated."""
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{where}: cannot import {spec!r}: {e}") from None
    obj = obj() if isinstance(obj, type) else obj
    if not callable(obj):
        raise ConfigError(
            f"{where}: {spec!r} is a {type(obj).__name__}, not a callable (a function, or a "
            "class whose instances are called on each value)"
        )
    return obj


def unknown_keys(keys, allowed, where: str) -> None:
    extra = set(keys) - allowed
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {sorted(extra)} (allowed: {sorted(allowed)})")


def _modalities(spec: Any, where: str) -> list[tuple[str, dict]]:
    """Modalities as (name, options); accepts a mapping or a list of {name: ..., ...}."""
    if isinstance(spec, Mapping):
        items = [(name, dict(opts or {})) for name, opts in spec.items()]
    elif isinstance(spec, list):
        items = []
        for n, entry in enumerate(spec):
            if not isinstance(entry, Mapping) or "name" not in entry:
                raise ConfigError(f"{where}[{n}]: each modality needs a 'name'")
            entry = dict(entry)
            items.append((entry.pop("name"), entry))
    else:
        raise ConfigError(f"{where}: expected a mapping of modality names to reader options")
    if not items:
        raise ConfigError(f"{where}: a source needs at least one modality")
    names = [n for n, _ in items]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{where}: duplicate modality name(s) {dup}")
    for name, _ in items:
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise ConfigError(f"{where}: modality name {name!r} must be a non-empty str not starting with '__'")
    return items


def _is_energon_path(path: str, root: Path) -> bool:
    from ..storage.foreign.energon import is_energon

    p = Path(path)
    return not is_url(path) and is_energon(p if p.is_absolute() else root / p)


def _open(path: str, root: Path, where: str, index_path: str | None = None, split: str | None = None):
    options = {} if split is None else {"split": str(split)}  # an Energon dataset's split
    if is_url(path):  # a dataset on object storage: credentials and cache from the environment
        if path.rstrip("/").lower().endswith(TEXT_SUFFIXES):
            raise ConfigError(
                f"{where}: {redact_url(path)}: text-file sources are read from local files; copy it first"
            )
        if index_path is not None:
            raise ConfigError(f"{where}: index_path applies to text files, not to {redact_url(path)}")
        try:
            return open_store(path, **options)
        except (MMLoaderError, OSError, ValueError, TypeError) as e:
            raise ConfigError(f"{where}: {e}") from None
    p = Path(path)
    p = p if p.is_absolute() else root / p
    if not p.exists():
        raise ConfigError(f"{where}: {p} does not exist")
    fmt = recognise(p)
    if fmt is not None and fmt.name == "text":
        index_file: Path | None = None
        if index_path is not None:
            index_file = Path(index_path) if Path(index_path).is_absolute() else root / index_path
            if not index_file.parent.is_dir():
                raise ConfigError(f"{where}: index_path {index_file}: its folder {index_file.parent} does not exist")
        try:
            store = open_store(p, **({} if index_file is None else {"index_path": index_file}))
        except (MMLoaderError, OSError) as e:
            raise ConfigError(f"{where}: {e}") from None
        if len(store) == 0:
            raise ConfigError(f"{where}: {p} holds no line: an empty source")
        return store
    if index_path is not None:
        raise ConfigError(f"{where}: index_path applies to text files ({', '.join(TEXT_SUFFIXES)}), not to {p}")
    if p.is_file() and fmt is None:
        kind = "a tar shard" if p.name.endswith((".tar", ".tgz", ".tar.gz")) else "a file"
        raise ConfigError(
            f"{where}: {p} is {kind}, not a dataset: give the dataset directory (LMDB, shards with "
            f"index.json, an Energon or img2dataset folder, an Arrow folder), a Parquet file or a text file "
            f"({', '.join(TEXT_SUFFIXES)}, one sample per line)"
        )
    try:
        return open_store(p, **options)
    except (MMLoaderError, OSError, TypeError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _reader(store, name: str, opts: dict, where: str, pil_images: bool, siblings: Mapping | None = None):
    if "decode" in opts:
        raise ConfigError(
            f"{where}.decode: the key is now 'output' (output: {opts['decode']}); "
            "decode is a Python callable, not a config value"
        )
    unknown_keys(opts, READER_KEYS, where)
    kind = opts.pop("reader", None)
    video = None
    if kind == "timestamps" or isinstance(opts.get("clip"), str) and opts["clip"] not in ("random", "start", "center"):
        # a companion of a video modality listed before it: its frames' times, or (audio) its audio track
        target = opts.pop("clip", None)
        video = (siblings or {}).get(target)
        if not isinstance(video, VideoReader):
            videos = [n for n, r in (siblings or {}).items() if isinstance(r, VideoReader)]
            raise ConfigError(
                f"{where}.clip: {target!r} is not a video modality listed before it in this source "
                f"(video modalities: {videos}); a {kind or 'companion'} modality names one with clip:"
            )
        opts.setdefault("field", video.field)
    field = opts.pop("field", None) or name
    if kind is not None and kind not in READERS:
        raise ConfigError(f"{where}.reader: {kind!r} is not one of {sorted(READERS)}")
    counts = store.metadata.get("field_counts", {})
    if not any(f in counts for f in field.split(";")):
        raise ConfigError(f"{where}.field: {field!r} is not a field of {store.path} (fields: {store.fields})")
    if "transform" in opts:
        opts["transform"] = import_object(str(opts["transform"]), f"{where}.transform")
    ext = field.split(";")[0].rsplit(".", 1)[-1].lower()
    if "output" in opts and not (kind == "image" or ext in IMAGE_EXTENSIONS):
        raise ConfigError(f"{where}.output: applies to image modalities; {field!r} is not an image field")
    if pil_images and (kind == "image" or ext in IMAGE_EXTENSIONS):
        opts["output"] = "pil"
        for key in ("transform", "crop", "flip", "normalize", "dtype"):  # previews show the images as stored
            opts.pop(key, None)
    if video is not None:
        if kind == "timestamps":
            if opts:
                raise ConfigError(f"{where}: a timestamps modality takes only field and clip, got {sorted(opts)}")
            return video.timestamps
        kind = "audio"
        opts["clip"] = video
    if not isinstance(opts.get("allow_pickle", False), bool):
        raise ConfigError(f"{where}.allow_pickle: {opts['allow_pickle']!r}: expected true or false")
    try:
        if kind is not None:
            opts.pop("allow_pickle", None)
            return KINDS[kind].cls(store, field, **opts)
        return reader_for(store, field, **opts)
    except UnsafeFieldError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad reader option: {e}") from None
    except (OSError, ImportError) as e:  # e.g. a tokenizer file that is not there
        raise ConfigError(f"{where}: {e}") from None


def build_sources(cfg: Mapping, pil_images: bool = False) -> dict[str, Zipped]:
    """Each source's modalities zipped into one dataset, by source name (``cfg``: a config whose
    top-level keys are already checked)."""
    root = Path(cfg.get("root") or os.getcwd())
    sources = cfg.get("sources")
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError("sources: the config needs at least one source (a mapping of names to sources)")
    out = {}
    for sname, src in sources.items():
        where = f"sources.{sname}"
        if not isinstance(src, Mapping):
            raise ConfigError(f"{where}: expected a mapping with 'path' and 'modalities'")
        unknown_keys(src, SOURCE_KEYS, where)
        stores: dict[str, Any] = {}

        readers: dict[str, Any] = {}
        for mname, opts in _modalities(src.get("modalities"), f"{where}.modalities"):
            mwhere = f"{where}.modalities.{mname}"
            own = opts.pop("path", None)
            index_path = opts.pop("index_path", None) if own else src.get("index_path")
            path = own or src.get("path")
            # an Energon dataset's split: the modality's own, or the source's where the path it
            # reads is an Energon folder (a modality's own path may be any dataset)
            split = opts.pop("split", None)
            if split is None and src.get("split") is not None and (not own or _is_energon_path(str(own), root)):
                split = src.get("split")
            if not path:
                raise ConfigError(f"{mwhere}: no 'path' (set it on the source or the modality)")
            at = f"{path}|{split or ''}"  # two splits of one folder are two stores
            if at not in stores:
                stores[at] = _open(str(path), root, f"{mwhere if own else where}.path", index_path, split)
            if isinstance(opts.get("tokenizer"), (str, os.PathLike)) and not Path(opts["tokenizer"]).is_absolute():
                opts["tokenizer"] = str(root / opts["tokenizer"])  # relative to root, as paths are
            readers[mname] = _reader(stores[at], mname, opts, mwhere, pil_images, readers)
        try:
            # Zipped directly: through zip_readers(**readers) a modality named align, transforms
            # or cache would land in that parameter
            out[sname] = Zipped(readers, align=src.get("align", cfg.get("align", "strict")))
        except (AlignmentError, ValueError) as e:
            raise ConfigError(f"{where}: its modalities cannot be aligned: {e}") from None
        out[sname] = _selection(out[sname], src, root, where)
    return out


def _selection(dataset: Zipped, src: Mapping, root: Path, where: str) -> Zipped:
    """The source's ``filter`` / ``keys`` / ``fraction`` / ``limit`` (:func:`mmloader.select`)."""
    options = {SELECT_KEYS[k]: src[k] for k in SELECT_KEYS if src.get(k) is not None}
    if not options:
        return dataset
    keys = options.get("keys")
    if isinstance(keys, str) and not Path(keys).is_absolute():
        options["keys"] = str(root / keys)  # a key file, relative to root as paths are
    elif keys is not None and not isinstance(keys, (list, str)):
        raise ConfigError(f"{where}.keys: expected a list of keys or a text file of keys, got {keys!r}")
    try:
        return dataset.select(**options)
    except (ValueError, TypeError, MMLoaderError) as e:
        raise ConfigError(f"{where}: {e}") from None
