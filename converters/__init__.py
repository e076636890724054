"""Raw-folder converters built on mmloader's public writer API.

Each module converts one raw layout and runs as ``python -m converters.<layout>``,
``mmloader convert <layout>`` or :func:`convert` (``mmloader.converters.convert``: the same
conversion from Python, options as keywords). mmloader's library modules never import this package; only
the CLI's ``convert`` subcommand does, by module name (``importlib.import_module``), so
``import mmloader`` does not load it. Converters import no torch.
"""

from .api import LAYOUTS, convert

__all__ = ["LAYOUTS", "convert"]
