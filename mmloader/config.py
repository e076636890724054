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
        modalities:
          image: {field: jpg, size: 64}
          caption: {field: txt, path: demo-out/shapes, transform: "mypkg.text:Tokenizer"}
      corpus:
        path: demo-out/corpus.txt    # a raw text file: one sample per line, field txt
        weight: 0.3
        modalities:
          caption: {field: txt}

Relative paths are taken from ``root`` (default: the working directory). Every
error names the config key at fault.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from .errors import AlignmentError, ConfigError, MMLoaderError, UnsafeFieldError
from .mixture import Mix
from .readers import IMAGE_EXTENSIONS, reader_for
from .storage import open_store
from .storage.textlines import TextLinesStore
from .stream import Stream
from .align import Zipped, zip as zip_readers

TOP_KEYS = {"seed", "batch_size", "shuffle", "drop_last", "batch_composition", "mix", "sources", "root",
            "block_size", "window_blocks", "on_error", "align"}
SOURCE_KEYS = {"path", "weight", "modalities", "align"}
MIX_KEYS = {"mode", "epoch_size"}
READER_KEYS = {"field", "path", "reader", "decode", "mode", "size", "max_pixels", "transform", "allow_pickle"}
READERS = {"image", "text", "label", "json", "array", "bytes"}


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML silently keeps the last of two equal keys; a config must not."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}: "
                              "each modality/source name may appear once")
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


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
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
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
    return obj() if isinstance(obj, type) else obj


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


def _open(path: str, root: Path, where: str):
    p = Path(path)
    p = p if p.is_absolute() else root / p
    if not p.exists():
        raise ConfigError(f"{where}: {p} does not exist")
    if p.is_file() and p.suffix != ".json":
        return TextLinesStore(p)
    try:
        return open_store(p)
    except (MMLoaderError, OSError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _reader(store, name: str, opts: dict, where: str, pil_images: bool):
    _unknown(opts, READER_KEYS, where)
    field = opts.pop("field", None) or name
    kind = opts.pop("reader", None)
    if kind is not None and kind not in READERS:
        raise ConfigError(f"{where}.reader: {kind!r} is not one of {sorted(READERS)}")
    if field not in store.metadata.get("field_counts", {}):
        raise ConfigError(f"{where}.field: {field!r} is not a field of {store.path} (fields: {store.fields})")
    if "transform" in opts:
        opts["transform"] = import_object(str(opts["transform"]), f"{where}.transform")
    ext = field.rsplit(".", 1)[-1].lower()
    if pil_images and (kind == "image" or ext in IMAGE_EXTENSIONS):
        opts["decode"] = "pil"
        opts.pop("transform", None)
    import mmloader
    classes = {"image": mmloader.ImageReader, "text": mmloader.TextReader, "label": mmloader.LabelReader,
               "json": mmloader.JSONReader, "array": mmloader.ArrayReader, "bytes": mmloader.Reader}
    try:
        if kind is not None:
            opts.pop("allow_pickle", None)
            return classes[kind](store, field, **opts)
        return reader_for(store, field, **opts)
    except UnsafeFieldError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad reader option: {e}") from None


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

        def store_for(path, key):
            if path not in stores:
                stores[path] = _open(path, root, key)
            return stores[path]
        readers = {}
        for mname, opts in _modalities(src.get("modalities"), f"{where}.modalities"):
            mwhere = f"{where}.modalities.{mname}"
            path = opts.pop("path", None) or src.get("path")
            if not path:
                raise ConfigError(f"{mwhere}: no 'path' (set it on the source or the modality)")
            store = store_for(str(path), f"{mwhere}.path" if "path" in opts else f"{where}.path")
            readers[mname] = _reader(store, mname, opts, mwhere, pil_images)
        try:
            out[sname] = zip_readers(align=src.get("align", cfg.get("align", "strict")), **readers)
        except (AlignmentError, ValueError) as e:
            raise ConfigError(f"{where}: its modalities cannot be aligned: {e}") from None
    return out


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

    >>> stream = mmloader.from_config("samples/configs/mixed.yaml", batch_size=64)   # doctest: +SKIP
    >>> loader = mmloader.loader(stream)                                               # doctest: +SKIP
    """
    cfg = {**load_config(config), **overrides}
    sources = build_sources(cfg)
    weights = _weights(cfg)
    mix_cfg = dict(cfg.get("mix") or {})
    _unknown(mix_cfg, MIX_KEYS, "mix")
    try:
        mixed = Mix(list(sources.values()), weights, mode=mix_cfg.get("mode", "proportion"),
                    epoch_size=mix_cfg.get("epoch_size"), names=list(sources),
                    batch_composition=cfg.get("batch_composition", "sample"))
    except ValueError as e:
        raise ConfigError(f"mix: {e}") from None
    try:
        return Stream(mixed, batch_size=cfg.get("batch_size"), shuffle=cfg.get("shuffle", True),
                      seed=cfg.get("seed", 0), drop_last=cfg.get("drop_last", False),
                      block_size=cfg.get("block_size", 1024), window_blocks=cfg.get("window_blocks", 16),
                      on_error=cfg.get("on_error", "raise"))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config: {e}") from None


def describe_plan(config: str | os.PathLike | Mapping, world: int = 1, workers: int = 1,
                  preview: int = 2) -> str:
    """The resolved plan of a config as text (what ``mmloader plan`` prints)."""
    stream = from_config(config)
    stream.set_world(0, world)
    mix = stream.mix
    unit = stream.batch_size if mix.composition == "source" else 1
    plan = stream.plan(0)
    g = stream.geometry()
    lines = [f"epoch plan: {len(plan)} samples from {len(mix.datasets)} source(s), mode {mix.mode}, "
             f"batch composition {mix.composition}"]
    lines.append(f"  {'source':<16} {'size':>9} {'per epoch':>10} {'share':>7} {'repeats':>8}  modalities")
    for row, ds in zip(mix.summary(unit), mix.datasets):
        lines.append(f"  {row['name']:<16} {row['size']:>9} {row['per_epoch']:>10} {row['proportion']:>7.1%} "
                     f"{row['repeats']:>8.2f}  {', '.join(ds.modalities)}")
    bs = stream.batch_size
    lines.append(f"world {world} x {workers} workers: {g['samples_per_rank']} samples per rank"
                 + (f" = {g['batches_per_rank']} batches of {bs}" if bs else "")
                 + f"; padding {g['padding']}; every rank equal")
    if preview:
        lines.append("preview:")
        for name, ds in zip(mix.names, mix.datasets):
            for i in range(min(preview, len(ds))):
                try:
                    s = ds[i]
                    desc = ", ".join(f"{k}={_short(v)}" for k, v in s.items() if k != "__key__")
                    lines.append(f"  {name}[{s['__key__']}]: {desc}")
                except Exception as e:
                    lines.append(f"  {name}[{i}]: unreadable: {e}")
    return "\n".join(lines)


def _short(v: Any) -> str:
    if hasattr(v, "shape"):
        return f"{type(v).__name__}{tuple(v.shape)}"
    text = repr(v)
    return text if len(text) < 50 else text[:47] + "..."
