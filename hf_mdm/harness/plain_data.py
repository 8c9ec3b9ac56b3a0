"""Plain data on the wire between the trusted side of a test and the sandboxed program it calls
(`hf_mdm.harness.verdict`).

Only these travel: None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset, and an exception
as data (its type's name and message). Values are one line of JSON: None, booleans, finite and non-finite floats,
strings and lists as themselves; everything else as an object tagged with ``"$"``: ``{"$": "tuple", "v": [...]}``,
``"set"``, ``"frozenset"``, ``"dict"`` (a list of key/value pairs: keys need not be strings), ``"bytes"`` (hex),
``"complex"`` (``[real, imag]``), ``"int"`` (hex; every int, so that bool and int stay apart and no digit limit
applies). Nothing is ever unpickled or evaluated: `decode` builds new objects of exactly these built-in types, so a
value that reaches the trusted side compares as plain data does, whatever the program returned.

The same source (`SOURCE`) runs inside the sandboxed worker, where it encodes results and decodes arguments: instances
of subclasses of the built-in types (a ``Counter``, an ``int`` with its own ``__eq__``) are sent as their base type's
value; anything else (a generator, a custom object) is refused with `PlainDataError`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SOURCE", "MAX_DEPTH", "PlainDataError", "encode", "decode", "dumps", "loads"]

MAX_DEPTH = 100

# Self-contained (standard library only): exec'd here and inside the sandboxed worker.
SOURCE = r'''
import json


class PlainDataError(ValueError):
    """A value that is not plain data, or a message that does not decode to plain data."""


_SEQUENCES = ((tuple, "tuple"), (frozenset, "frozenset"), (set, "set"))


def encode(value, depth=0):
    """``value`` as JSON-ready data (see the module docstring); PlainDataError if it is not plain data."""
    if depth > MAX_DEPTH:
        raise PlainDataError("nested too deeply")
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return {"$": "int", "v": hex(int.__index__(value))}
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        return {"$": "complex", "v": [float(value.real), float(value.imag)]}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"$": "bytes", "v": bytes(value).hex()}
    if isinstance(value, list):
        return [encode(item, depth + 1) for item in list.__iter__(value)]
    if isinstance(value, dict):
        return {"$": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]}
    for kind, tag in _SEQUENCES:
        if isinstance(value, kind):
            return {"$": tag, "v": [encode(item, depth + 1) for item in kind.__iter__(value)]}
    raise PlainDataError(f"{type(value).__name__} is not plain data")


def decode(data, depth=0):
    """The plain value of JSON data made by `encode` (new objects of built-in types only)."""
    if depth > MAX_DEPTH:
        raise PlainDataError("nested too deeply")
    if data is None or type(data) in (bool, float, str):
        return data
    if type(data) is list:
        return [decode(item, depth + 1) for item in data]
    if type(data) is not dict or set(data) != {"$", "v"}:
        raise PlainDataError(f"not an encoded value: {type(data).__name__}")
    tag, inner = data["$"], data["v"]
    try:
        if tag == "int" and type(inner) is str:
            return int(inner, 16)
        if tag == "bytes" and type(inner) is str:
            return bytes.fromhex(inner)
        if tag == "complex" and type(inner) is list and len(inner) == 2 and all(type(x) is float for x in inner):
            return complex(inner[0], inner[1])
        if tag == "dict" and type(inner) is list:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in (_pair(p) for p in inner)}
        if tag in ("tuple", "set", "frozenset") and type(inner) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode(x, depth + 1) for x in inner)
    except (TypeError, ValueError) as error:  # an unhashable key or element, a malformed number
        raise PlainDataError(f"malformed {tag}: {error}") from None
    raise PlainDataError(f"unknown tag {tag!r}")


def _pair(item):
    if type(item) is not list or len(item) != 2:
        raise PlainDataError("malformed dict item")
    return item


def dumps(value):
    """One line of JSON for ``value`` (PlainDataError if it is not plain data)."""
    try:
        return json.dumps(encode(value), ensure_ascii=True, separators=(",", ":"))
    except RecursionError:
        raise PlainDataError("nested too deeply") from None


def loads(line):
    """The plain value of one line made by `dumps` (PlainDataError if it is anything else)."""
    try:
        return decode(json.loads(line))
    except (ValueError, RecursionError) as error:
        raise PlainDataError(f"not plain data: {error}"[:300]) from None
'''

_namespace: dict[str, Any] = {"MAX_DEPTH": MAX_DEPTH, "__name__": __name__}
exec(compile(SOURCE, __file__ + ":SOURCE", "exec"), _namespace)
PlainDataError = _namespace["PlainDataError"]
encode = _namespace["encode"]
decode = _namespace["decode"]
dumps = _namespace["dumps"]
loads = _namespace["loads"]
