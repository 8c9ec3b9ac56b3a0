"""lm-eval's ``simple_evaluate`` with hf_mdm's tasks and models, returning accuracy and timing from one run.

`simple_evaluate` takes exactly lm-eval's arguments. It builds the model itself (``lm_eval.api.registry``, as
lm-eval does) so that it can read the model's timing afterwards, runs ``lm_eval.simple_evaluate``, gathers the
per-request timing of every process (``accelerate launch``) and writes it into the results (see
`hf_mdm.harness.timing.attach_timing`). `build_task_manager` indexes hf_mdm's task directory and, only when a
requested task is not one of ours, lm-eval's ~15k built-in task configs (a slow scan). `create_lm` builds a model on
`pick_device`'s device when none is named, for ``hf-mdm-eval run`` and ``hf-mdm compare`` alike.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import torch
import yaml
from lm_eval import evaluator as lm_eval_evaluator
from lm_eval.api.model import LM
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager
from lm_eval.utils import simple_parse_args_string

from . import models as _models  # noqa: F401  (registers hf_mdm, hf_timed, hf_diffusion_gemma, hf_diffusers)
from .resume import cache_prefix, caching
from .sandbox import isolation_report
from .timing import RequestTiming, attach_timing

__all__ = ["TASKS_DIR", "task_names", "build_task_manager", "simple_evaluate", "create_lm", "pick_device"]

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


class _QuietCustomDatasetNote(logging.Filter):
    """Drop lm-eval's note about ``--metadata``, logged for every task with a ``custom_dataset`` (all of ours)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


logging.getLogger("lm_eval.api.task").addFilter(_QuietCustomDatasetNote())


class _TaskConfigLoader(yaml.SafeLoader):
    """YAML of lm-eval task configs, with ``!function module.name`` kept as the string it names."""


_TaskConfigLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


@lru_cache(maxsize=None)
def task_configs() -> dict[str, dict]:
    """hf_mdm's task configs (``include:`` resolved, ``!function`` left unresolved) by task or group name."""
    configs = {}
    for path in sorted(TASKS_DIR.glob("*.yaml")):
        config = _read_task_config(path)
        for key in ("task", "group"):
            if key in config:
                configs[str(config[key])] = config
    return configs


def _read_task_config(path: Path) -> dict:
    config = yaml.load(path.read_text(), Loader=_TaskConfigLoader) or {}
    if "include" in config:
        config = {**_read_task_config(path.parent / config.pop("include")), **config}
    return config


def task_names() -> frozenset[str]:
    """Names of the tasks in hf_mdm's task directory."""
    return frozenset(task_configs())


def _only_ours(tasks: Optional[Iterable[Any]]) -> bool:
    if not tasks:
        return False
    return all(isinstance(t, str) and t in task_names() for t in tasks)


def build_task_manager(
    tasks: Optional[Sequence[Any]] = None,
    include_path: Union[None, str, Path, Sequence[Union[str, Path]]] = None,
    metadata: Optional[dict] = None,
) -> TaskManager:
    """A TaskManager that knows hf_mdm's tasks (and ``include_path``'s); lm-eval's built-in tasks are indexed
    unless every requested task is one of hf_mdm's."""
    paths: list[Union[str, Path]] = [TASKS_DIR]
    if include_path:
        paths += [include_path] if isinstance(include_path, (str, Path)) else list(include_path)
    return TaskManager(include_path=paths, include_defaults=not _only_ours(tasks), metadata=metadata or {})


def pick_device(device: Optional[str] = None) -> str:
    """``device`` if one is named, else ``"cuda"`` when torch sees a GPU and ``"cpu"`` otherwise.

    This is lm-eval HFLM's own choice for a device it does not know, which is how ``hf-mdm-eval run`` (lm-eval's
    CLI passes ``cuda:0`` by default) runs on a machine without a GPU; a caller that names no device (``hf-mdm
    compare`` without ``evaluate: {device: ...}``, the Python API) would otherwise get HFLM's default ``"cuda"``,
    which HFLM takes as given."""
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def create_lm(
    model: str,
    model_args: Union[None, str, dict] = None,
    batch_size: Union[None, int, str] = None,
    max_batch_size: Optional[int] = None,
    device: Optional[str] = None,
) -> LM:
    """Instantiate a registered lm-eval model the way ``lm_eval.simple_evaluate`` does, on `pick_device`'s device
    unless ``model_args`` names one."""
    args = simple_parse_args_string(model_args) if isinstance(model_args, str) else dict(model_args or {})
    if "device" not in args:
        device = pick_device(device)
    extra = {"batch_size": batch_size, "max_batch_size": max_batch_size, "device": device}
    model_class = get_model(model)
    if isinstance(model_args, dict):
        return model_class.create_from_arg_obj(model_args, extra)
    return model_class.create_from_arg_string(model_args or "", extra)


def simple_evaluate(
    model: Union[str, LM],
    model_args: Union[None, str, dict] = None,
    tasks: Optional[Sequence[Any]] = None,
    batch_size: Union[None, int, str] = None,
    max_batch_size: Optional[int] = None,
    device: Optional[str] = None,
    task_manager: Optional[TaskManager] = None,
    metadata: Optional[dict] = None,
    **kwargs: Any,
) -> Optional[dict]:
    """``lm_eval.simple_evaluate`` (same arguments) with hf_mdm's tasks registered and timing in the results.

    With ``use_cache`` (a path prefix) the run is resumable: requests answered before come from lm-eval's request
    cache, with their timing, in ``<use_cache>_<fingerprint of the model and its arguments>_rank<N>.db``
    (`hf_mdm.harness.resume`).

    Returns lm-eval's results dict on the main process (None on the others) with ``results["timing"]`` (totals
    per task and overall), ``<field>,timing`` entries in ``results["results"][task]``, with ``log_samples``
    ``sample["timing"]`` for every logged sample, and, when a task executed generated code, ``results["sandbox"]``
    (the isolation layer it ran under, `hf_mdm.harness.sandbox.isolation_report`, and with ``log_samples`` under
    ``"programs"`` the count of programs per task by layer and by who decided the verdict; each logged outcome says
    both for its program).
    """
    args_dict = simple_parse_args_string(model_args) if isinstance(model_args, str) else dict(model_args or {})
    if task_manager is None:
        task_manager = build_task_manager(tasks, metadata=args_dict | (metadata or {}))
    lm = model if isinstance(model, LM) else create_lm(model, model_args, batch_size, max_batch_size, device)
    _check_gen_kwargs(lm, kwargs.get("gen_kwargs"))
    timing = getattr(lm, "timing", None)
    if timing is not None:
        timing.clear()
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = cache_prefix(kwargs["use_cache"], model, model_args, kwargs.get("gen_kwargs"))
    with caching(lm):
        results = lm_eval_evaluator.simple_evaluate(
            model=lm,
            model_args=model_args,
            tasks=list(tasks or []),
            batch_size=batch_size,
            max_batch_size=max_batch_size,
            device=device,
            task_manager=task_manager,
            metadata=metadata,
            **kwargs,
        )
    records = _gather_records(lm) if timing is not None else None
    if results is None:
        return None
    if isinstance(model, str):
        results["config"]["model"] = model
        tracker = kwargs.get("evaluation_tracker")
        if tracker is not None:
            tracker.general_config_tracker.model_source = model
    if records is not None:
        attach_timing(results, records, kwargs.get("samples"))
    if any(config.get("unsafe_code") for config in (results.get("configs") or {}).values()):
        results["sandbox"] = isolation_report()  # which isolation layer ran the generated code
        results["sandbox"]["programs"] = _program_verdicts(results.get("samples") or {})
    return results


def _check_gen_kwargs(lm: LM, gen_kwargs: Union[None, str, Mapping[str, Any]]) -> None:
    """The run's ``--gen_kwargs``, before any request, by a model that checks them (``hf_mdm``:
    `hf_mdm.harness.mdm.MaskedDiffusionLM.check_gen_kwargs`); a ValueError names a key the model does not take."""
    check = getattr(lm, "check_gen_kwargs", None)
    if check is not None and gen_kwargs:
        check(simple_parse_args_string(gen_kwargs) if isinstance(gen_kwargs, str) else dict(gen_kwargs))


def _program_verdicts(samples: dict) -> dict[str, dict[str, int]]:
    """Per task, how many programs ran under each layer with their verdict decided on the trusted side or by the
    program (``"bubblewrap/trusted"``, ...; from the logged samples' outcomes, `hf_mdm.harness.code_eval.outcome`)."""
    counts: dict[str, dict[str, int]] = {}
    for task, rows in samples.items():
        stack = [row.get("filtered_resps") for row in rows]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict) and "verdict" in item and "layer" in item:
                key = f"{item['layer']}/{item['verdict']}"
                counts.setdefault(task, {})[key] = counts.setdefault(task, {}).get(key, 0) + 1
    return counts


def _gather_records(lm: LM) -> Optional[list[RequestTiming]]:
    """Every process's timing records on the main process (a collective: all processes must call it)."""
    gathered = lm.gather_object(list(lm.timing.records), dst=0)
    if gathered is None:
        return None
    return [record for part in gathered for record in (part or [])]
