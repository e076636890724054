"""WebDataset-style tar shards: the store, the writer, mmloader's index (manifest, offsets, keys), the layout rules, sequential stages."""
