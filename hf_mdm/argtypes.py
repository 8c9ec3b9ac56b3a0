"""What every ``hf-mdm`` command reads its arguments with: argparse types (`at_least`, `positive_float`) and
``key=value`` settings (`key_value_pairs`).

Each command module ``hf_mdm/cli_<name>.py`` registers its subcommands with one function, ``add_commands(commands)``
(``commands``: the ``hf-mdm`` parser's subparsers), and takes the types it needs from here; `hf_mdm.cli` calls every
module's ``add_commands`` in turn.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Iterable

__all__ = ["at_least", "key_value_pairs", "positive_float"]


def at_least(minimum: float, kind: type = int) -> Any:
    """An argparse type: a number of ``kind`` >= ``minimum`` (argparse's error names the flag)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    value = at_least(0.0, float)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def key_value_pairs(items: Iterable[str], flag: str) -> dict:
    """``key=value`` items (of the repeatable option ``flag``) as a dict, each value read as JSON where it parses
    (numbers, true/false, null); a ValueError naming ``flag`` for an item without ``=``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: write settings as key=value (for example steps=64)")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
