"""Raw-folder converters built on mmloader's public writer API.

Each module converts one raw layout and runs as ``python -m converters.<layout>``
or ``mmloader convert <layout>``. mmloader itself never imports this package.
"""
