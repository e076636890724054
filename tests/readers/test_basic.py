"""The basic readers (mmloader/readers/basic.py): text, labels, JSON and arrays."""

from __future__ import annotations

import torch

import mmloader


def test_basic_readers(any_ds):
    assert mmloader.TextReader(any_ds)[4] == "caption number 4 é"
    assert mmloader.LabelReader(any_ds)[9] == 2
    assert mmloader.JSONReader(any_ds)[5] == {"i": 5, "tags": ["a", "b"]}
    arr = mmloader.ArrayReader(any_ds)[3]
    assert torch.equal(arr, torch.arange(3, dtype=torch.float32))
    upper = mmloader.TextReader(any_ds, transform=str.upper)
    assert upper.get("s00002") == "CAPTION NUMBER 2 É"
    assert len(upper) == 23 and upper.keys[1] == "s00001"
