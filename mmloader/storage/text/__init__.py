"""A raw UTF-8 text file as a store: one sample per line."""
