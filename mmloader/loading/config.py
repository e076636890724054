"""Experiment configs: which stores, which modalities under which names, mixed with which weights.

A config is a YAML file or the equivalent dict::

    seed: 0
    batch_size: 32
    batch_composition: sample        # or "source": each batch from one source
    mix: {mode: proportion, epoch_size: 10000}   # proportion | repeat | count
    sources:
      shapes:
        path: demo-out/shapes.lmdb
        weight: 0.7
        filter: "meta.score >= 0.5 and image.width >= 32"   # optional: mmloader.select
        modalities:
          image: {field: jpg, size: 64}
          caption: {field: txt, path: demo-out/shapes, transform: "mypkg.text:Tokenizer"}
          meta: {field: json}
      corpus:
        path: demo-out/corpus.txt    # a raw text file: one sample per line, field txt
        weight: 0.3
        modalities:
          caption: {field: txt}

Relative paths are taken from ``root`` (default: the working directory). A
``path`` is an mmloader dataset (an LMDB directory, a shard directory or its
``index.json``, local or a URL such as ``s3://bucket/shards/``) or a text file (``.txt``: one sample per line, field ``txt``;
``index_path`` says where its line index goes, default beside the file). One
source without ``mix`` is streamed as it is (no mix around it). A source's
``filter`` / ``keys`` / ``fraction`` / ``limit`` select its samples
(:func:`mmloader.select`); ``mix.schedule`` changes the weights over the run
(:class:`mmloader.Mix`). ``pack_tokens`` with ``length_by`` (a modality name, or
``{text, images, per_image, image_token_id, pad_id, overlong}`` as for :func:`mmloader.tokens`)
packs rows of whole samples (:class:`mmloader.Stream`). Every error
names the config key at fault, and every option is checked when the config is
read, not at the first batch.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..align.mix import Mix
from ..align.zip import Zipped
from ..errors import AlignmentError, ConfigError, MMLoaderError, UnsafeFieldError
from ..planning.packing import PACK_WINDOW
from ..readers import IMAGE_EXTENSIONS, VideoReader, reader_for
from ..readers.registry import KINDS
from ..storage import is_url, open_store, recognise
from ..storage.formats import TEXT_SUFFIXES
from ..storage.remote.redaction import redact_url
from .stages import Batching, Bucketing, Errors, Order, Packing
from .stream import Stream

TOP_KEYS = {
    "seed",
    "batch_size",
    "shuffle",
    "drop_last",
    "batch_composition",
    "mix",
    "sources",
    "root",
    "block_size",
    "window_blocks",
    "on_error",
    "align",
    "bucket_by",
    "bucket_window",
    "on_change",
    "padding",
    "pack_tokens",
    "length_by",
    "pack_window",
}
#: ``length_by`` as a mapping: the arguments of :func:`mmloader.tokens`.
LENGTH_KEYS = {"text", "images", "per_image", "image_token_id", "pad_id", "overlong"}
SOURCE_KEYS = {"path", "index_path", "split", "weight", "modalities", "align", "filter", "keys", "fraction", "limit"}
#: A source's selection (mmloader.select): config key -> select() option.
SELECT_KEYS = {"filter": "where", "keys": "keys", "fraction": "fraction", "limit": "limit"}
MIX_KEYS = {"mode", "epoch_size", "schedule"}
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


def _length_by(value: Any) -> Any:
    """A config's ``length_by``: a modality name, or the arguments of :func:`mmloader.tokens`."""
    from ..align.packing import tokens

    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"length_by: {value!r} is neither a modality name nor a mapping of {sorted(LENGTH_KEYS)}")
    unknown = sorted(set(value) - LENGTH_KEYS)
    if unknown:
        raise ConfigError(f"length_by: unknown key(s) {unknown} (known: {sorted(LENGTH_KEYS)})")
    try:
        return tokens(**value)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"length_by: {e}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML silently keeps the last of two equal keys; a config must not."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"duplicate key {key!r} at line {key_node.start_mark.line + 1}: "
                "each modality/source name may appear once"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def is_config_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an experiment config rather than a dataset: the one rule every
    command uses. YAML files are configs; a JSON file is one when it holds a ``sources`` mapping
    (a shard manifest such as ``index.json`` does not).

    >>> is_config_path("samples/configs/mixed.yaml"), is_config_path("data/shapes.lmdb")
    (True, False)
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return True
    if suffix != ".json" or not p.is_file() or p.stat().st_size > 16 << 20:
        return False
    try:
        import json

        doc = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "sources" in doc


def load_config(path_or_dict: str | os.PathLike | Mapping) -> dict:
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    path = Path(path_or_dict)
    if path.is_dir():
        raise ConfigError(
            f"{path} is a folder; an experiment config is a file (YAML, or JSON with a 'sources' mapping)"
        )
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"{path} is not a regular file; an experiment config is a YAML or JSON file")
    try:
        cfg = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: the config must be a mapping with a 'sources' key")
    return cfg


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


def _unknown(keys, allowed, where: str) -> None:
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
    _unknown(opts, READER_KEYS, where)
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
    """Each source's modalities zipped into one dataset, by source name."""
    _unknown(cfg, TOP_KEYS, "config")
    root = Path(cfg.get("root") or os.getcwd())
    sources = cfg.get("sources")
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError("sources: the config needs at least one source (a mapping of names to sources)")
    out = {}
    for sname, src in sources.items():
        where = f"sources.{sname}"
        if not isinstance(src, Mapping):
            raise ConfigError(f"{where}: expected a mapping with 'path' and 'modalities'")
        _unknown(src, SOURCE_KEYS, where)
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


def _weights(cfg: Mapping) -> list[float]:
    weights = []
    for sname, src in cfg["sources"].items():
        w = src.get("weight", 1.0)
        if not isinstance(w, (int, float)) or isinstance(w, bool):
            raise ConfigError(f"sources.{sname}.weight: {w!r} is not a number")
        if w < 0:
            raise ConfigError(f"sources.{sname}.weight: {w} is negative")
        weights.append(float(w))
    if sum(weights) <= 0:
        raise ConfigError("sources.*.weight: all weights are zero; at least one source must have weight > 0")
    return weights


def from_config(config: str | os.PathLike | Mapping, **overrides: Any) -> Stream:
    """A ready :class:`Stream` from a config file or dict; ``overrides`` replace top-level keys.

    One source without ``mix`` is streamed directly (the same batches, layout and speed as the
    Python API); several sources, or a ``mix`` section, are mixed (:func:`mmloader.mix`).

    >>> stream = mmloader.from_config("samples/configs/mixed.yaml", batch_size=64)   # doctest: +SKIP
    >>> loader = mmloader.loader(stream)                                               # doctest: +SKIP
    """
    cfg = {**load_config(config), **overrides}
    sources = build_sources(cfg)
    weights: list[float] | None = _weights(cfg)
    if isinstance(cfg.get("mix"), Mapping) and cfg["mix"].get("schedule") is not None:
        weighted = [name for name, src in cfg["sources"].items() if "weight" in src]
        if weighted:
            raise ConfigError(
                f"sources.{weighted[0]}.weight: with mix.schedule the weights are the schedule's points; "
                "remove the sources' weight keys"
            )
        weights = None
    mix_cfg = cfg.get("mix")
    if mix_cfg is not None and not isinstance(mix_cfg, Mapping):
        raise ConfigError(f"mix: expected a mapping such as {{mode: proportion, epoch_size: 1000}}, got {mix_cfg!r}")
    mix_cfg = dict(mix_cfg or {})
    _unknown(mix_cfg, MIX_KEYS, "mix")
    composition = cfg.get("batch_composition", "sample")
    if composition not in ("sample", "source"):
        raise ConfigError(f"batch_composition: {composition!r} is not one of 'sample', 'source'")
    if len(sources) == 1 and not mix_cfg:
        dataset: Any = next(iter(sources.values()))
    else:
        try:
            dataset = Mix(
                list(sources.values()),
                weights,
                mode=mix_cfg.get("mode", "proportion"),
                epoch_size=mix_cfg.get("epoch_size"),
                names=list(sources),
                batch_composition=composition,
                schedule=mix_cfg.get("schedule"),
            )
        except ValueError as e:
            raise ConfigError(f"mix: {e}") from None
    try:
        return Stream(dataset, **_stream_options(cfg))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config: {e}") from None


def _stream_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A config's flat keys as the stream's stages (a config file keeps one level of keys)."""
    given = {k: cfg[k] for k in TOP_KEYS if k in cfg}
    if any(k in given for k in ("bucket_by", "bucket_window")) and any(
        k in given for k in ("pack_tokens", "length_by", "pack_window")
    ):
        raise ConfigError("bucket_by and pack_tokens: packing already groups samples by length; choose one")
    if "bucket_window" in given and "bucket_by" not in given:
        raise ConfigError("bucket_window: give bucket_by too (the modality whose lengths batches group by)")
    if ("length_by" in given or "pack_window" in given) and "pack_tokens" not in given:
        raise ConfigError("length_by: is for packing: give pack_tokens too (bucketing by length is bucket_by)")
    options: dict[str, Any] = {k: given[k] for k in ("on_change",) if k in given}
    try:
        options["order"] = Order(
            **{k: given[k] for k in ("shuffle", "seed", "block_size", "window_blocks") if k in given}
        )
        options["batching"] = Batching(
            given.get("batch_size"), given.get("drop_last", False), given.get("padding", "repeat")
        )
        options["errors"] = Errors(given.get("on_error", "raise"))
        if "bucket_by" in given:
            options["lengths"] = Bucketing(given["bucket_by"], given.get("bucket_window", 64))
        elif "pack_tokens" in given:
            length_by = _length_by(given["length_by"]) if "length_by" in given else None
            options["lengths"] = Packing(given["pack_tokens"], length_by, given.get("pack_window", PACK_WINDOW))
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None
    return options
