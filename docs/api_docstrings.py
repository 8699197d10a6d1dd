"""A griffe extension (mkdocs.yml) that lets the API reference render samattn's docstrings
whole.

The docstrings follow Google style with two liberties that griffe's parser would drop
with a warning: a `Raises:` section written as a sentence ("ValueError / TypeError for
bad arguments, ...") rather than `Exception: description` items, and a sentence inside
`Args:` that is not an argument ("The other arguments are flash_attn_func's ...").
Before parsing, such a `Raises:` section becomes a paragraph and such a sentence moves
below its section, so that nothing a docstring says is lost.
"""

from __future__ import annotations

import re

import griffe

SECTION = re.compile(r"^(\w[\w ]*):\s*$")
# "name: ...", "a, b: ...", "name (type): ..." at the items' indentation.
ITEM = re.compile(r"^ {4}[A-Za-z_]\w*(?:, [A-Za-z_]\w*)*(?: \([^)]*\))?:(?: |$)")
RAISES_ITEM = re.compile(r"^ {4}[A-Za-z_][\w.]*:(?: |$)")
# Inline code, left alone; outside it "x[b][j]" would read as a Markdown reference link.
CODE = re.compile(r"(``.*?``|`[^`]*`)")


def _blocks(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """The docstring cut into (section title or None, its lines)."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in lines:
        header = SECTION.match(line)
        if header and header[1] in ("Args", "Arguments", "Raises", "Returns"):
            blocks.append((header[1], []))
        elif blocks[-1][0] is not None and line and not line.startswith(" "):
            blocks.append((None, [line]))  # the section ended: prose again
        else:
            blocks[-1][1].append(line)
    return blocks


def _split_args(body: list[str]) -> tuple[list[str], list[str]]:
    """(argument entries, sentences at the entries' indentation that are not entries)."""
    items, prose, in_prose = [], [], False
    for line in body:
        if ITEM.match(line):
            in_prose = False
        elif line.startswith("    ") and not line.startswith("     "):
            in_prose = True
        (prose if in_prose else items).append(line)
    return items, [line.strip() for line in prose]


def _escape_brackets(text: str) -> str:
    parts = CODE.split(text)
    return "".join(p if i % 2 else p.replace("][", "]\\[") for i, p in enumerate(parts))


def normalize(text: str) -> str:
    text = _escape_brackets(text)
    out: list[str] = []
    for title, body in _blocks(text.splitlines()):
        if title is None:
            out += body
        elif title == "Raises" and not all(
            RAISES_ITEM.match(b) for b in body if b[:5] != " " * 5 and b
        ):
            out += ["Raises " + " ".join(b.strip() for b in body if b.strip()), ""]
        elif title in ("Args", "Arguments"):
            items, prose = _split_args(body)
            out += [f"{title}:", *items]
            if prose:
                out += ["", " ".join(prose), ""]
        else:
            out += [f"{title}:", *body]
    return "\n".join(out).strip("\n")


class SamattnDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
