"""docs/config.md, generated from the sweep config dataclasses: every key with its type, default and meaning.

The meaning of a field is its source comment: the comment at the end of its line, after any comment lines
directly above it. A field without one is an error naming it, so a new key cannot go undocumented.

    python -m sweeps.config_reference            # print the reference
    python -m sweeps.config_reference --write    # regenerate docs/config.md
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Iterator

from sweeps.config import SweepConfig

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "config.md"
COMMAND = "python -m sweeps.config_reference --write"


@dataclasses.dataclass(frozen=True)
class Key:
    """One row of the reference."""

    name: str  # the field's name in its section
    type: str  # the annotation as written in the source
    default: str  # the default in YAML spelling as Markdown code, or a pointer to its section
    meaning: str  # the field's source comment


@dataclasses.dataclass(frozen=True)
class Section:
    """One config dataclass, at its dotted place in the sweep YAML."""

    path: str  # dotted YAML path ('' for the top level)
    cls: type  # the dataclass
    keys: tuple[Key, ...]


def field_comments(cls: type) -> dict[str, str]:
    """Each field of dataclass ``cls`` -> its source comment (comment lines just above it, then its own line's)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    lines = source.splitlines()
    (class_def,) = ast.parse(source).body
    found = {}
    for node in class_def.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        found[node.target.id] = "; ".join(above + ([comments[node.end_lineno]] if node.end_lineno in comments else []))
    return found


def yaml_value(value: Any) -> str:
    """``value`` as a YAML flow value: null, true, [a, b], {k: v}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {yaml_value(item)}" for key, item in value.items()) + "}"
    return str(value)


def summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, on one line."""
    return " ".join(line.strip() for line in (cls.__doc__ or "").strip().split("\n\n")[0].splitlines())


def _nested(annotation: Any) -> tuple[type | None, bool]:
    """The dataclass a field holds (directly, optionally, or as the values of a mapping) and whether it is a
    mapping of them; (None, False) for a plain field."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if dataclasses.is_dataclass(arg)]
        return (inner[0], False) if inner else (None, False)
    if origin is dict and typing.get_args(annotation) and dataclasses.is_dataclass(typing.get_args(annotation)[1]):
        return typing.get_args(annotation)[1], True
    return (annotation, False) if dataclasses.is_dataclass(annotation) else (None, False)


def sections(cls: type = SweepConfig, path: str = "") -> Iterator[Section]:
    """``cls``'s section, then each nested dataclass's (depth first, in field order).

    Raises ValueError naming the first field that has no source comment."""
    comments, hints, keys, below = field_comments(cls), typing.get_type_hints(cls), [], []
    for field in dataclasses.fields(cls):
        where = f"{path}.{field.name}" if path else field.name
        inner, mapping = _nested(hints[field.name])
        if inner is not None and not comments.get(field.name):
            comments[field.name] = summary(inner)  # a section is described by its docstring
        if not comments.get(field.name):
            raise ValueError(f"{cls.__module__}.{cls.__name__}.{field.name} has no source comment; expected "
                             f"'{field.name}: ... = ...  # what it means' so that docs/config.md can say it")
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if inner is not None:
            child = f"{where}.<name>" if mapping else where
            below.append((inner, child))
        text = f"see `{child}`" if dataclasses.is_dataclass(default) else f"`{yaml_value(default)}`"
        annotation = field.type if isinstance(field.type, str) else inspect.formatannotation(field.type)
        keys.append(Key(field.name, annotation, text, comments[field.name]))
    yield Section(path, cls, tuple(keys))
    for inner, child in below:
        yield from sections(inner, child)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole reference as Markdown: one table per section."""
    out = ["# Sweep config reference", "",
           f"Generated from the config dataclasses by `{COMMAND}`; do not edit by hand.",
           "A sweep YAML sets any of these keys (sections as nested mappings); an unset key keeps the default shown;",
           "unknown keys and bad values are rejected at load, one line each. `sweeps/launch.py KEY.SUB=VALUE` sets",
           "the same keys from the command line.", ""]
    for section in sections():
        title = f"`{section.path}`" if section.path else "Top level"
        out += [f"## {title}", "", f"{summary(section.cls)} (`{section.cls.__module__}.{section.cls.__name__}`)", "",
                "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{key.name}` | `{_cell(key.type)}` | {_cell(key.default)} | {_cell(key.meaning)} |"
                for key in section.keys]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sweeps.config_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE.relative_to(REFERENCE.parents[1])}"
                                                             " instead of printing it")
    args = parser.parse_args(argv)
    if args.write:
        REFERENCE.write_text(render())
    else:
        print(render(), end="")


if __name__ == "__main__":
    main()
