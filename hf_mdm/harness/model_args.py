"""lm-eval model arguments checked where lm-eval would fail obscurely: the checkpoint path and the argument names.

lm-eval's `HFLM` hands every argument it does not know to ``from_pretrained``, which passes those that are not
config fields to the model's ``__init__``: a misspelled argument (``stepz=8``) ends in a ``TypeError`` from the
model class. `explain_model_arguments` turns it into a ValueError that names the argument, the nearest known
names and every argument the model takes; `check_pretrained` says when a local checkpoint path does not exist
(`hf_mdm.checkpoints`) before lm-eval asks the Hub for it.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import re
from typing import Any, Iterable, Iterator

from lm_eval.models.huggingface import HFLM

from ..checkpoints import check_local_path

__all__ = ["hflm_arguments", "check_pretrained", "explain_model_arguments"]

_UNEXPECTED = re.compile(r"got an unexpected keyword argument '(\w+)'")


def hflm_arguments() -> list[str]:
    """The named arguments of lm-eval's `HFLM` (``pretrained``, ``dtype``, ``device``, ``batch_size``, ...)."""
    return [name for name in inspect.signature(HFLM.__init__).parameters if name not in ("self", "kwargs")]


def check_pretrained(pretrained: Any) -> None:
    """A ValueError when ``pretrained`` is a local path that does not exist."""
    check_local_path(pretrained, "pretrained")


def check_near_misses(
    model: str, given: Iterable[str], known: dict[str, Iterable[str]], passed_on: Iterable[str]
) -> None:
    """Before anything loads: a ValueError for a given argument that no one takes (not in ``known``, not an argument
    ``passed_on`` to lm-eval's HFLM) and is one letter or so away from a known one (``stepz`` for ``steps``)."""
    every = {arg for names in known.values() for arg in names}
    for name in given:
        if name not in every and name not in set(passed_on) and difflib.get_close_matches(name, sorted(every), 1, 0.8):
            raise unknown_argument(model, name, known)


def unknown_argument(model: str, name: str, known: dict[str, Iterable[str]]) -> ValueError:
    """The ValueError for an unknown model argument ``name``: the nearest known ones and every accepted one by kind."""
    every = sorted({arg for names in known.values() for arg in names})
    near = difflib.get_close_matches(name, every, n=3, cutoff=0.6)
    lists = "; ".join(f"{kind}: {', '.join(sorted(names))}" for kind, names in known.items())
    return ValueError(
        f"unknown model argument {name!r} for --model {model}"
        + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else "")
        + f". Model arguments are {lists}; other names are passed to from_pretrained and must be fields of the "
        "checkpoint's config"
    )


@contextlib.contextmanager
def explain_model_arguments(model: str, given: Iterable[str], known: dict[str, Iterable[str]]) -> Iterator[None]:
    """Within the block, a TypeError about an unexpected keyword argument that the user gave (``given``) becomes a
    ValueError naming it; ``known`` lists the accepted arguments by kind (e.g. {"sampler": [...], ...})."""
    given = set(given)
    try:
        yield
    except TypeError as err:
        match = _UNEXPECTED.search(str(err))
        if match is None or match.group(1) not in given:
            raise
        raise unknown_argument(model, match.group(1), known) from err
