"""A griffe extension for the API pages (mkdocs.yml): doctest lines in docstrings become
``pycon`` code blocks, so Markdown shows them as code instead of reading ``x[0]["key"]`` as a
link. mmloader's docstrings put ``>>>`` examples in their prose, outside ``Examples:`` sections."""
from __future__ import annotations

import re

import griffe

_PROMPT = re.compile(r"^(\s*)>>> ")


def fence_doctests(text: str) -> str:
    """Each run of doctest lines (prompts, continuations, output up to a blank line) fenced."""
    out: list[str] = []
    lines = text.splitlines()
    i, fence = 0, False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else _PROMPT.match(line)
        if m is None:
            out.append(line)
            i += 1
            continue
        indent = m.group(1)
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class FenceDoctests(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and ">>> " in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
