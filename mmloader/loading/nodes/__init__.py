"""Nodes: the one contract of a pipeline's stages (:mod:`.base`) and the nodes a user puts
between the loader and the training loop (:class:`~.map.Map`, :class:`~.filter.Filter`, their
own), run and checkpointed by :mod:`.chain`."""

from .base import Node
from .filter import Filter
from .map import Map

__all__ = ["Filter", "Map", "Node"]
