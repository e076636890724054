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

import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..align.mix import Mix
from ..align.zip import Zipped
from ..errors import ConfigError
from ..planning.packing import PACK_WINDOW
from . import config_sources
from .config_sources import unknown_keys
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
MIX_KEYS = {"mode", "epoch_size", "schedule", "weights_by"}


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


def build_sources(cfg: Mapping, pil_images: bool = False) -> dict[str, Zipped]:
    """Each source's modalities zipped into one dataset, by source name
    (:mod:`mmloader.loading.config_sources`), once the config's own keys are checked."""
    unknown_keys(cfg, TOP_KEYS, "config")
    return config_sources.build_sources(cfg, pil_images)


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
    unknown_keys(mix_cfg, MIX_KEYS, "mix")
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
                weights_by=mix_cfg.get("weights_by", "samples"),
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
