"""One meaning of a size everywhere (mmloader.storage.sizes): the CLI's --shard-bytes, converters'
--max-file-bytes, cache_limit= in Python and in configs."""

from __future__ import annotations

import argparse

import pytest

from mmloader.cli.args import positive_size
from mmloader.storage.remote.shard_cache import parse_limit
from mmloader.storage.sizes import parse_size


@pytest.mark.parametrize(
    "text,want",
    [
        ("2G", 2 << 30),
        ("2GiB", 2 << 30),
        ("2GB", 2 * 10**9),
        ("64K", 64 << 10),
        ("500MB", 500 * 10**6),
        ("1e9", 10**9),
        ("123", 123),
        ("1.5K", 1536),
    ],
)
def test_a_size_means_the_same_on_every_path(text, want):
    assert parse_size(text) == positive_size(text) == parse_limit(text) == want


@pytest.mark.parametrize("bad", ["", "G", "1Q", "0.5", "1e-3", "-1", "1iB", "2 GBB"])
def test_bad_sizes_are_refused_everywhere(bad):
    with pytest.raises(ValueError):
        parse_size(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        positive_size(bad)
    with pytest.raises(ValueError, match="cache_limit="):
        parse_limit(bad)


def test_the_convert_cli_reads_shard_bytes_with_these_units():
    from mmloader.converters.common import add_common_arguments

    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    args = parser.parse_args(["src", "dst", "--shard-bytes", "2GB"])
    assert args.shard_bytes == 2 * 10**9
