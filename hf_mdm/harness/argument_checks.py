"""lm-eval model arguments checked where lm-eval would fail obscurely: the checkpoint path and the argument names.
The models (`hf_mdm.harness.mdm`, `hf_mdm.harness.timed`) call these checks; `hf_mdm.harness.model_args` lists the
arguments each model takes.

lm-eval's `HFLM` hands every argument it does not know to ``from_pretrained``, which passes those that are not
config fields to the model's ``__init__``: a misspelled argument (``stepz=8``) ends in a ``TypeError`` from the
model class. `explain_model_arguments` turns it into a one-line ValueError that names the argument, the nearest
known names and the command that lists every argument the model takes (``python -m hf_mdm.harness.model_args
MODEL``, `model_arguments`); `check_pretrained` says when a checkpoint is neither a local folder nor
a model the Hub can give (`hf_mdm.checkpoints` for local paths) before lm-eval asks the Hub for it, which without
a network retries for half a minute and ends in a long traceback.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..checkpoints import check_local_path

__all__ = ["hflm_arguments", "check_pretrained", "check_near_misses", "explain_model_arguments", "unknown_argument"]

#: The command that lists every argument a model takes (`hf_mdm.harness.model_args`).
LIST_COMMAND = "python -m hf_mdm.harness.model_args"

_UNEXPECTED = re.compile(r"got an unexpected keyword argument '(\w+)'")
HUB_TIMEOUT_S = 5.0  # one request, no retries: the Hub answers in well under a second
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def hflm_arguments() -> list[str]:
    """The named arguments of lm-eval's `HFLM` (``pretrained``, ``dtype``, ``device``, ``batch_size``, ...)."""
    from lm_eval.models.huggingface import HFLM

    return [name for name in inspect.signature(HFLM.__init__).parameters if name not in ("self", "kwargs")]


def check_pretrained(pretrained: Any) -> None:
    """A ValueError naming ``pretrained`` when it is neither a local folder nor a model the Hub can give.

    A path that exists, a loaded model and a Hub id in the local Hub cache pass without a network request. A local
    path that does not exist is said to be one (`hf_mdm.checkpoints.check_local_path`). Any other name is a Hub id
    (``namespace/name``, or a legacy id without ``/`` such as ``gpt2``): a name that cannot be one (``tiny mdm``,
    ``a--b``) fails at once, so does any name in offline mode (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``), and
    otherwise one request without retries (`HUB_TIMEOUT_S`) asks the Hub whether the model exists. A mistyped
    folder name (``tiny-mdmm``) is thus an error in at most a few seconds, where ``from_pretrained`` would retry
    for half a minute; a Hub that answers with another error (rate limit, server error) is left to the loading.
    """
    if not isinstance(pretrained, (str, os.PathLike)):
        return
    check_local_path(pretrained, "pretrained")
    name = os.fspath(pretrained)
    if Path(name).expanduser().exists():
        return
    problem = _hub_problem(name)
    if problem:
        raise ValueError(
            f"pretrained={name}: neither a local folder nor reachable on the Hub ({problem}): check the name, or "
            "give the path of a local checkpoint"
        )


def _hub_problem(name: str) -> str:
    """Why the Hub cannot give the model ``name`` ("" when it can or when it answered with another error)."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return "not a valid Hub id: letters, digits, '-', '_' and '.', as name or namespace/name"
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return ""
    if constants.HF_HUB_OFFLINE or any(_truthy(os.environ.get(v)) for v in _OFFLINE_VARIABLES):
        return f"the Hub is offline ({' / '.join(_OFFLINE_VARIABLES)}) and the model is not in the Hub cache"
    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return ""
    except RepositoryNotFoundError:
        return "the Hub has no such model; a private one needs `hf auth login` or HF_TOKEN"
    except HfHubHTTPError:
        return ""
    except Exception as err:  # no answer: the HTTP client's connection and timeout errors
        return f"the Hub could not be reached: {type(err).__name__}: {' '.join(str(err).split())}"
    return ""


def _truthy(value: Any) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


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
    """The one-line ValueError for an unknown model argument ``name``: the nearest known ones and the command that
    lists every accepted one (`model_arguments`)."""
    every = sorted({arg for names in known.values() for arg in names})
    near = difflib.get_close_matches(name, every, n=3, cutoff=0.6)
    return ValueError(
        f"unknown model argument {name!r} for --model {model}"
        + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else "")
        + f"; every argument it takes: {LIST_COMMAND} {model}"
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
