"""The write side every format shares: atomic publish, conversions in parts, merging parts."""
