"""The config builder: frozen dataclasses from plain dicts (YAML), validated all at once.

``build(cls, data, where)`` turns a mapping into ``cls``, recursing into nested dataclass fields and mappings of
dataclasses (``dict[str, SomeConfig]``); every problem (unknown key, bad value, and what the built instance's own
``problems()`` method returns) is collected and reported together as one ``ConfigError``. Defaults are the
dataclasses' field defaults, nowhere else.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """One or more invalid config entries: ``problems`` lists each as 'where.key: expected X, got Y'; the message
    joins them with '; '."""

    def __init__(self, *problems: str):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def as_number(value: Any, integral: bool = False) -> int | float | None:
    """``value`` as a number, or None if it is not one: ints and floats as they are, a string that spells a
    number ('5e-5', which YAML 1.1 reads as a string) parsed; with ``integral`` only whole numbers, as ``int``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, (int, float)):
        return None
    if integral:
        return int(value) if isinstance(value, int) or (math.isfinite(value) and value == int(value)) else None
    return value


def _type_ok(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits a (simple) type annotation; numbers are accepted as ``as_number`` reads them."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation in (int, float):
        return as_number(value, integral=annotation is int) is not None
    if origin is tuple:
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, (dict, annotation))
    return isinstance(value, annotation)


def _convert(value: Any, annotation: Any, where: str, errors: list[str]) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None) and value is not None and _type_ok(value, arg):
                return _convert(value, arg, where, errors)
        return value
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        return build(annotation, value, where, errors)
    if origin is dict:  # a mapping of dataclasses (custom_models) builds each entry; other mappings stay as given
        kind = typing.get_args(annotation)[1] if typing.get_args(annotation) else Any
        if not dataclasses.is_dataclass(kind):
            return value
        return {key: item if isinstance(item, kind) else build(kind, item, f"{where}.{key}", errors)
                for key, item in value.items()}
    if origin is tuple:  # numeric elements become numbers; others stay as given, for the field's own check to name
        args = typing.get_args(annotation)
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        return tuple(_convert(item, kind, where, errors) if _type_ok(item, kind) else item
                     for item, kind in zip(value, kinds + [Any] * (len(value) - len(kinds))))
    if annotation in (int, float):
        number = as_number(value, integral=annotation is int)
        return float(number) if annotation is float else number
    return value


def build(cls: type, data: dict[str, Any] | None, where: str, errors: list[str] | None = None) -> Any:
    """Build dataclass ``cls`` from ``data``; collect problems into ``errors`` (raise if we own the list).

    An unknown key is named with the closest valid one; a number may be given as a string that spells it. The
    instance's ``problems()`` (if the class has one: 'key: expected X, got Y' items) are added under ``where``."""
    own = errors is None
    errors = [] if errors is None else errors
    data = data or {}
    if not isinstance(data, dict):
        errors.append(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
        data = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            errors.append(f"{where}.{key}: unknown key{suggest(str(key), names)}; expected one of {sorted(names)}")
            continue
        if not _type_ok(value, hints[key]):
            errors.append(f"{where}.{key}: expected {_describe(hints[key])}, got {value!r}")
            continue
        kwargs[key] = _convert(value, hints[key], f"{where}.{key}", errors)
    instance = cls(**kwargs)
    if hasattr(instance, "problems"):
        errors.extend(f"{where}.{p}" for p in instance.problems())
    if own and errors:
        raise ConfigError(*errors)
    return instance


def suggest(word: str, valid: typing.Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of ``valid`` to a mistyped ``word``, or '' if none is close."""
    close = difflib.get_close_matches(word, sorted(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", text) if "[" not in text and "|" not in text else text
