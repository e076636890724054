"""What every converter shares, re-exported from the modules that hold it: items (the data and
errors of a conversion), options (the command line), sources (paths, walking, labels), reading
(loading items in order, in parallel), writing (the samples, the skip report, the summary),
parts (--part I/N and its fingerprints) and running (a converter's command line, its engine,
its summary or error)."""

from __future__ import annotations

from mmloader.cli.args import int_at_least, positive_size  # noqa: F401  (the one set of option types)
from mmloader.media.imageinfo import IMAGE_EXTENSIONS, canonical_extension  # noqa: F401  (the one list)
from mmloader.storage.sizes import parse_size  # noqa: F401  (the one size parser)

from .items import (
    DEFAULT_MAX_FILE_BYTES,
    ON_ERROR_HELP,
    PROBE_BYTES,
    ConversionError,
    Item,
    ItemError,
    Options,
    Skipped,
    UsageError,
)
from .options import RUN_OPTIONS, add_common_arguments, layout_parser, options_from, parse_part, require_list
from .parts import (
    convert_part,
    fingerprint,
    item_source,
    items_digest,
    options_digest,
    part_bounds,
    select,
    shard_alignment,
)
from .reading import check_field, load_item, media_bytes, media_kind, ordered_map, read_file
from .running import check_engine_options, execute, layout_of, report_errors, run
from .sources import SourceWalker, check_paths, is_dataset_dir, label_kind
from .writing import Summary, check_required_fields, report_path_for, write_samples

__all__ = [
    "int_at_least",
    "positive_size",
    "IMAGE_EXTENSIONS",
    "canonical_extension",
    "parse_size",
    "DEFAULT_MAX_FILE_BYTES",
    "PROBE_BYTES",
    "ON_ERROR_HELP",
    "ConversionError",
    "UsageError",
    "ItemError",
    "Skipped",
    "Item",
    "Options",
    "parse_part",
    "require_list",
    "add_common_arguments",
    "layout_parser",
    "options_from",
    "is_dataset_dir",
    "check_paths",
    "SourceWalker",
    "label_kind",
    "read_file",
    "media_bytes",
    "check_field",
    "media_kind",
    "load_item",
    "ordered_map",
    "Summary",
    "report_path_for",
    "write_samples",
    "check_required_fields",
    "run",
    "item_source",
    "items_digest",
    "shard_alignment",
    "part_bounds",
    "select",
    "RUN_OPTIONS",
    "options_digest",
    "fingerprint",
    "check_engine_options",
    "layout_of",
    "execute",
    "convert_part",
    "report_errors",
]
