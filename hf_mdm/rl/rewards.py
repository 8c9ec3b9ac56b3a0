"""Rewards built in for GRPO, in TRL's convention: a callable ``reward(prompts, completions, completion_ids,
**columns) -> list[float]`` that TRL calls with the batch's dataset columns as keyword arguments (lists).

- `language_membership`: 1.0 when the completion's tokens are a sequence of a synthetic language (q(x) > 0);
- `gsm8k_correct`: 1.0 when the answer lm-eval's gsm8k task extracts (the strict ``#### n`` pattern, else the
  flexible last number) matches the ``answer`` column, as the harness scores it;
- `code_passes`: 1.0 when the completion passes the problem's tests in the sandbox (MBPP rows: ``test_list``;
  HumanEval rows: ``test`` and ``entry_point``), the same split jobs the harness runs, so a completion cannot forge
  its verdict.

`reward_by_name` resolves the command line's ``--reward`` (one of these, or ``module:function`` for any Python
callable).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = [
    "language_membership",
    "gsm8k_correct",
    "code_passes",
    "reward_by_name",
    "completion_text",
    "checked_reward",
]

Reward = Callable[..., list[float]]


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes plain strings, or for chat data a list of messages (the last one's
    content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"a completion must be text or a list of chat messages, got {type(completion).__name__}")


def language_membership(language: Any) -> Reward:
    """A reward of 1.0 for a completion whose token ids are a sequence of ``language`` (a
    `hf_mdm.languages.SyntheticLanguage`; the model's ids are the language's tokens), else 0.0."""

    def in_language(completion_ids: Sequence[Sequence[int]], **_: Any) -> list[float]:
        out = []
        for ids in completion_ids:
            tokens = torch.tensor([list(ids)], dtype=torch.long)
            inside = bool(tokens.numel()) and int(tokens.max()) < language.vocab_size and int(tokens.min()) >= 0
            out.append(float(inside and bool(language.in_support(tokens)[0])))
        return out

    in_language.__name__ = "in_language"
    return in_language


def gsm8k_correct(completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """1.0 where the extracted answer matches the ``answer`` column (the harness's gsm8k scoring), else 0.0."""
    from ..harness.tasks.utils import GSM8K_FLEXIBLE, GSM8K_STRICT, exact_match, extract_answer

    out = []
    for completion, target in zip(completions, answer):
        text = completion_text(completion)
        strict = extract_answer(GSM8K_STRICT, text)
        guess = strict if strict != GSM8K_STRICT.fallback else extract_answer(GSM8K_FLEXIBLE, text)
        out.append(exact_match(guess, target))
    return out


def code_passes(completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 where the completion passes its problem's tests in the sandbox, else 0.0 (see the module docstring)."""
    from ..harness.code_eval import execute, humaneval_job, mbpp_job
    from ..harness.sandbox import require_code_execution

    require_code_execution()
    jobs = []
    for i, completion in enumerate(completions):
        doc = {name: values[i] for name, values in columns.items() if isinstance(values, (list, tuple))}
        if "test_list" in doc:
            jobs.append([mbpp_job(completion_text(completion), doc)])
        elif "test" in doc and "entry_point" in doc:
            jobs.append([humaneval_job(completion_text(completion), doc)])
        else:
            raise ValueError("code_passes needs MBPP rows (test_list) or HumanEval rows (test, entry_point)")
    return [float(group[0]["passed"]) for group in execute(jobs)]


def checked_reward(reward: Reward) -> Reward:
    """``reward`` with its answers checked: a list of one number (or None, TRL's "not applicable") per completion;
    anything else is a ValueError naming the reward and what it returned, not a traceback deep in TRL."""
    name = getattr(reward, "__name__", type(reward).__name__)

    @functools.wraps(reward)
    def checked(*args: Any, **kwargs: Any) -> list:
        values = reward(*args, **kwargs)
        count = len(kwargs.get("completions") or kwargs.get("completion_ids") or [])
        if not isinstance(values, (list, tuple)) or (count and len(values) != count):
            shown = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(f"reward {name!r} returned {shown} for {count} completions: return one number each")
        bad = [v for v in values if v is not None and not isinstance(v, (int, float))]
        if bad:
            raise ValueError(f"reward {name!r} returned {bad[0]!r}: return a number (or None) per completion")
        return list(values)

    return checked


def reward_by_name(name: str, language: Optional[Any] = None) -> Reward:
    """``language`` (membership in ``language``), ``gsm8k``, ``code`` or ``module:function``."""
    if name == "language":
        if language is None:
            raise ValueError("--reward language needs --language (a saved synthetic language)")
        return language_membership(language)
    if name in ("gsm8k", "code"):
        return gsm8k_correct if name == "gsm8k" else code_passes
    module, _, function = name.partition(":")
    if not function:
        raise ValueError(f"unknown reward {name!r}: one of language, gsm8k, code, or module:function")
    try:
        reward = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--reward {name}: cannot import {function!r} from {module!r} ({err})") from None
    if not callable(reward):
        raise ValueError(f"--reward {name}: {function!r} is not callable")
    return reward
