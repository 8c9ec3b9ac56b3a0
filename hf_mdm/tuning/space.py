"""The search space of ``hf-mdm tune``: groups of `generate` keyword arguments, each group a grid.

A space is a list of groups; a group maps each `MaskedDiffusionGenerationConfig` field to a list of values (a single
value counts as a one-value list; an empty list is refused, naming the group and the field), and expands to the
product of its lists. Groups keep parameters with the rule that reads them (a ``threshold`` grid in the group whose
``transfer`` is ``threshold``), since `generate` refuses a parameter its transfer rule does not read. Every setting
is checked against the model with `generate`'s own resolution before anything runs, so a misspelt field or an
impossible combination is one error naming the group.
"""

from __future__ import annotations

import difflib
import itertools
import json
from typing import Any, Sequence

from ..generation_config import MaskedDiffusionGenerationConfig
from ..generation_resolve import resolve_config

#: Fields a setting may not choose: the task fixes them (what is generated, at which temperature, how it is read).
FIXED_BY_THE_TASK = ("max_new_tokens", "temperature", "seed", "return_dict_in_generate", "output_history")


def expand(space: Sequence[dict]) -> list[dict]:
    """Every setting of ``space`` (the groups' products, in order; a setting met twice kept once)."""
    if isinstance(space, dict) or not isinstance(space, Sequence) or not space:
        raise ValueError("the search space must be a non-empty list of groups, each a mapping of field -> values")
    settings: dict[str, dict] = {}
    for index, group in enumerate(space):
        if not isinstance(group, dict) or not group:
            raise ValueError(f"space[{index}] must be a non-empty mapping of generate fields to lists of values")
        _check_fields(group, index)
        fields = list(group)
        values = [v if isinstance(v, list) else [v] for v in group.values()]
        for combination in itertools.product(*values):
            setting = dict(zip(fields, combination))
            settings.setdefault(setting_key(setting), setting)
    return list(settings.values())


def _check_fields(group: dict, index: int) -> None:
    fields = set(vars(MaskedDiffusionGenerationConfig())) | set(MaskedDiffusionGenerationConfig.__dict__)
    for name, values in group.items():
        if values == []:
            raise ValueError(
                f"space[{index}]: {name!r} has no values (an empty list): give it at least one or remove it"
            )
        if name in FIXED_BY_THE_TASK:
            raise ValueError(f"space[{index}]: {name!r} is fixed by the task, not searched; remove it from the space")
        if name not in fields:
            close = difflib.get_close_matches(name, [f for f in fields if not f.startswith("_")], n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"space[{index}]: unknown generate field {name!r}{hint}")


def setting_key(setting: dict) -> str:
    """A setting's name in caches, tables and files: its fields as compact sorted JSON."""
    return json.dumps(setting, sort_keys=True, separators=(",", ":"))


def check_settings(model: Any, settings: list[dict], length: int) -> None:
    """Resolve every setting against ``model`` as `generate` would, before anything runs; the first refusal is
    raised naming the setting."""
    for setting in settings:
        try:
            resolve_config(model, None, {**setting, "max_new_tokens": length})
        except ValueError as err:
            raise ValueError(f"setting {setting_key(setting)}: {err}") from None
