"""Reaching the clusters the library runs on: Ray (for ``backend="ray"`` and ``convert --engine
ray``), connected within a deadline or refused with the reason and the remedy. Torch-free."""
