"""What the three experiments share: the cell cache, languages from scale entries, sampling, trained models, rows.

- ``CellCache``: the finished measurements of one experiment, ``<out>/cache/<name>.json``, saved after every cell.
- ``make_language`` / ``language_name``: a language (through ``hf_mdm.languages.build_language``) and its table
  name from a scale's language entry.
- ``sample_mdm`` (the paper's sampler) and ``sample_ar`` (ancestral sampling from the AR baseline).
- ``trained_pair`` / ``lazy_pair``: the tiny MDM and AR baseline of a language, trained once and kept under
  ``<out>/models/``.
- ``oracle_rows`` and ``trained_rows``: the measured rows of the oracle and of the trained models, gathered per
  language entry by ``language_rows`` and per experiment by ``measure_languages``.
- ``experiment_result``, ``write_outputs`` and ``validation_table``: the JSON, Markdown and PNG outputs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ..fileio import write_atomic
from ..generation import diffusion_generate
from ..generation_denoiser import model_device
from ..languages import OracleDenoiser, SyntheticLanguage, build_language

#: Fields of a scale's language entry that belong to the experiment, not to the language: ``name`` (for tables),
#: ``train`` (whether to train models on it) and ``training`` (overrides of the scale's training settings).
EXPERIMENT_FIELDS = ("name", "train", "training")
#: What ``validation_row`` keeps of a trained pair.
VALIDATION_KEYS = ("mdm_nll", "ar_nll", "entropy_per_token", "mdm_gap", "ar_gap")

Score = Callable[[torch.Tensor], dict]  # samples -> a cell's values
Cell = Callable[[SyntheticLanguage, torch.Tensor], dict]  # (language, samples) -> a cell's values


# ----------------------------------------------------------------------------------------------------------------
# Cache, languages, machine


class CellCache:
    """A JSON dict of finished measurements, saved after every new cell.

    A file that does not read as a JSON dict (cut short by a full disk or a copy) is kept as ``<name>.corrupt``
    beside it, with a warning naming both paths, and the cache starts empty: its cells are measured again.
    """

    def __init__(self, path: Path):
        self.path = path
        self.cells: dict[str, Any] = self._read() if path.exists() else {}

    def _read(self) -> dict[str, Any]:
        try:
            cells = json.loads(self.path.read_text())
            if not isinstance(cells, dict):
                raise ValueError(f"a JSON {type(cells).__name__}, not a dict of cells")
            return cells
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            import warnings

            kept = self.path.with_name(self.path.name + ".corrupt")
            os.replace(self.path, kept)
            warnings.warn(
                f"the cell cache {self.path} does not read ({err}): kept it as {kept} and starting an empty cache, "
                "so its cells are measured again (delete the .corrupt file once you no longer need it)",
                stacklevel=2,
            )
            return {}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.cells:
            self.cells[key] = compute()
            write_atomic(self.path, json.dumps(self.cells, indent=1))
        return self.cells[key]


def make_language(spec: dict) -> SyntheticLanguage:
    """A language from a config entry: ``{"kind": "ngram", "n": 2, "vocab_size": 4, "seed": 0, ...}``.

    Every field but ``EXPERIMENT_FIELDS`` goes to ``hf_mdm.languages.build_language``; its ValueErrors (an unknown
    kind, a missing or unexpected parameter) come back naming the entry.
    """
    params = {k: v for k, v in spec.items() if k not in EXPERIMENT_FIELDS}
    try:
        return build_language(params.pop("kind", None), **params)
    except ValueError as err:
        raise ValueError(f"{str(err).rstrip('.')} in {spec}") from None


def language_name(spec: dict) -> str:
    if "name" in spec:
        return spec["name"]
    if spec.get("kind") == "ngram":
        return f"{spec['n']}-gram"
    return spec.get("kind", "language")


def machine_description() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


# ----------------------------------------------------------------------------------------------------------------
# Sampling


PAPER_SAMPLER = {"transfer": "stochastic", "strategy": "random", "temperature": 1.0}  # the paper's sampler


def sample_mdm(model: Any, num: int, length: int, steps: int, seed: int, batch_size: int = 512) -> torch.Tensor:
    """The paper's sampler (`PAPER_SAMPLER`: stochastic transfer, random order, tokens drawn at temperature 1)
    with the linear schedule."""
    out = []
    for start in range(0, num, batch_size):
        rows = min(batch_size, num - start)
        out.append(
            diffusion_generate(
                model,
                torch.zeros(rows, 0, dtype=torch.long, device=model_device(model)),
                max_new_tokens=length,
                steps=steps,
                schedule="linear",
                seed=seed + start,
                stop_at_eos=False,
                **PAPER_SAMPLER,
            ).cpu()
        )
    return torch.cat(out)


@torch.no_grad()
def sample_ar(model: Any, num: int, length: int, seed: int, batch_size: int = 512) -> torch.Tensor:
    """Ancestral sampling from the AR baseline (BOS first, full distribution: no top-k / top-p, BOS suppressed)."""
    torch.manual_seed(seed)
    bos = model.config.bos_token_id
    out = []
    for start in range(0, num, batch_size):
        rows = min(batch_size, num - start)
        prompt = torch.full((rows, 1), bos, dtype=torch.long, device=model_device(model))
        seq = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=bos,
            eos_token_id=None,
            suppress_tokens=[bos],  # BOS is not a token of the language (a trained model gives it ~0 mass)
        )
        out.append(seq[:, 1:].cpu())
    return torch.cat(out)


# ----------------------------------------------------------------------------------------------------------------
# Trained models (reused across runs)


def trained_pair(
    language: Any, length: int, scale: dict, out: Path, tag: str, overrides: Optional[dict] = None
) -> dict[str, Any]:
    """Train (or reload) the tiny MDM and AR baseline of a language; returns models and validation NLL vs entropy
    (`trained_model` of each kind)."""
    result: dict[str, Any] = {"entropy_per_token": language.expected_nll(length).value / length}
    for kind in ("mdm", "ar"):
        result.update(trained_model(kind, language, length, scale, out, tag, overrides))
    return result


def trained_model(
    kind: str,
    language: Any,
    length: int,
    scale: dict,
    out: Path,
    tag: str,
    overrides: Optional[dict] = None,
    initial: Optional[Callable[[], Any]] = None,
) -> dict[str, Any]:
    """Train (or reload) one model of ``kind`` ("mdm" or "ar"): ``{kind: model, kind_nll, kind_gap}``.

    ``scale["training"]`` holds the settings, updated by ``overrides`` (a language entry's own ``training``; a
    ``block_size`` there trains a block diffusion MDM); ``training_steps`` gives the steps. Every model is trained on
    the same seeded sample of the language. Models live in
    ``<out>/models/<tag>-L<length>-<hash of the settings and the language>-<kind>/final``. ``initial`` builds the
    model training starts from (default: a new one); name what it is in ``overrides`` (e.g. ``{"init": ...}``), so
    that the folder's hash tells the starting points apart."""
    entropy = language.expected_nll(length).value / length
    train_cfg = {**scale["training"], **(overrides or {})}
    folder = out / "models" / f"{tag}-L{length}-{_settings_hash(train_cfg, language)}-{kind}"  # never stale
    if not (folder / "final" / "metrics.json").exists():
        kind_cfg = {**train_cfg, "max_steps": training_steps(train_cfg, kind)}
        what = (
            kind.upper() if train_cfg.get("block_size") is None else f"block diffusion (b = {train_cfg['block_size']})"
        )
        print(f"training the {what} for {tag} at L={length}: {kind_cfg['max_steps']} steps", flush=True)
        datasets = _datasets(language, length, train_cfg)
        model = initial() if initial is not None else None
        _train_model(kind, folder, datasets, language.vocab_size, length, kind_cfg, entropy, model)
    return _load_trained(kind, folder, entropy)


def training_steps(train_cfg: dict, kind: str) -> int:
    """The optimiser steps of one model: ``max_steps``, or for the AR model ``ar_max_steps`` where given (AR learns
    a language faster than an MDM, which must learn every masked conditional)."""
    return train_cfg.get("ar_max_steps", train_cfg["max_steps"]) if kind == "ar" else train_cfg["max_steps"]


def _settings_hash(train_cfg: dict, language: Any) -> str:
    """8 hex digits of the training settings and the language: part of a model's folder name."""
    key = json.dumps([train_cfg, language.to_config()], sort_keys=True, default=str)
    return hashlib.sha1(key.encode()).hexdigest()[:8]


def _datasets(language: Any, length: int, train_cfg: dict) -> tuple:
    """``(train, validation)`` Datasets sampled from the language with the training seed (the same for every model)."""
    from datasets import Dataset

    generator = torch.Generator().manual_seed(train_cfg.get("seed", 0))
    train_rows = language.sample(train_cfg["num_train"], length, generator=generator)
    val_rows = language.sample(train_cfg["num_validation"], length, generator=generator)
    return tuple(Dataset.from_dict({"input_ids": rows.tolist()}) for rows in (train_rows, val_rows))


def _train_model(
    kind: str,
    folder: Path,
    datasets: tuple,
    vocab_size: int,
    length: int,
    train_cfg: dict,
    entropy: float,
    model: Any = None,
) -> None:
    """Train one model, save it to ``folder/final`` and its validation metrics to ``folder/final/metrics.json``."""
    from ..training import build_trainer, train

    trainer = build_trainer(
        kind,
        datasets[0],
        datasets[1],
        vocab_size=vocab_size,
        length=length,
        args=_training_arguments(folder, train_cfg),
        size=train_cfg["size"],
        entropy_per_token=entropy,
        seed=train_cfg.get("seed", 0),
        block_size=train_cfg.get("block_size"),
        model=model,
    )
    train(trainer)
    metrics = trainer.evaluate()
    trainer.save_model(str(folder / "final"))
    write_atomic(folder / "final" / "metrics.json", json.dumps({k: float(v) for k, v in metrics.items()}, indent=1))


def _training_arguments(folder: Path, train_cfg: dict) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(folder),
        per_device_train_batch_size=train_cfg["batch_size"],
        per_device_eval_batch_size=train_cfg["batch_size"],
        max_steps=train_cfg["max_steps"],
        learning_rate=train_cfg["learning_rate"],
        warmup_steps=train_cfg.get("warmup_steps", 0),
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        save_steps=train_cfg["max_steps"],
        save_total_limit=1,
        eval_strategy="no",
        logging_steps=max(train_cfg["max_steps"] // 5, 1),
        report_to=[],
        disable_tqdm=True,
        seed=train_cfg.get("seed", 0),  # experiments run side by side: loss lines only
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
    )


def _load_trained(kind: str, folder: Path, entropy: float) -> dict[str, Any]:
    """``{kind: model, kind_nll: validation NLL per token, kind_gap: NLL / entropy - 1}`` from ``folder/final``."""
    from transformers import AutoModelForCausalLM

    from .. import MDMForMaskedDiffusion

    metrics = json.loads((folder / "final" / "metrics.json").read_text())
    loader = MDMForMaskedDiffusion if kind == "mdm" else AutoModelForCausalLM
    model = loader.from_pretrained(str(folder / "final")).eval()
    if kind == "mdm" and not isinstance(model, MDMForMaskedDiffusion):
        raise ValueError(f"{folder} does not hold an MDM checkpoint")
    return {kind: model, f"{kind}_nll": metrics["eval_loss"], f"{kind}_gap": metrics["eval_loss"] / entropy - 1.0}


def lazy_pair(language: Any, length: int, scale: dict, out: Path, tag: str, overrides: Optional[dict]):
    """``trained_pair`` on first call only: re-runs whose cells are all cached neither train nor load models."""
    return functools.cache(lambda: trained_pair(language, length, scale, out, tag, overrides))


# ----------------------------------------------------------------------------------------------------------------
# Rows: one measured cell each


def oracle_rows(
    oracle: Any, name: str, length: int, steps_list: list[int], num: int, cache: CellCache, score: Score, desc: str
) -> list[dict[str, Any]]:
    """Rows for the exact-posterior oracle at one length and each step count."""
    rows = []
    for steps in tqdm(steps_list, desc=desc, leave=False):
        cell = cache.get(
            f"oracle|{name}|{length}|{steps}", lambda: score(sample_mdm(oracle, num, length, steps, seed=steps))
        )
        rows.append({"language": name, "length": length, "model": "oracle MDM", "steps": steps, **cell})
    return rows


def trained_rows(
    spec: dict, language: Any, name: str, scale: dict, out: Path, cache: CellCache, steps_list: list[int], score: Score
) -> list[dict[str, Any]]:
    """Rows for the trained AR model, the trained MDM at each step count, and the validation NLLs vs entropy."""
    length, num = scale["train_length"], scale["num_samples"]
    pair = lazy_pair(language, length, scale, out, name, spec.get("training"))
    base = {"language": name, "length": length}
    rows = [
        {
            **base,
            "model": "trained AR",
            "steps": length,
            **cache.get(f"ar|{name}|{length}", lambda: score(sample_ar(pair()["ar"], num, length, seed=1))),
        }
    ]
    for steps in tqdm(steps_list, desc=f"trained MDM {name}", leave=False):
        cell = cache.get(
            f"mdm|{name}|{length}|{steps}", lambda: score(sample_mdm(pair()["mdm"], num, length, steps, seed=steps))
        )
        rows.append({**base, "model": "trained MDM", "steps": steps, **cell})
    rows.append(
        {
            **base,
            "model": "validation",
            "steps": 0,
            **cache.get(f"validation|{name}|{length}", lambda: validation_row(pair())),
        }
    )
    return rows


def validation_row(pair: dict[str, Any]) -> dict[str, float]:
    return {k: float(pair[k]) for k in VALIDATION_KEYS}


def measure_languages(
    name: str, scale: dict, out: Path, *, cell: Cell, steps_for: Callable[[int], list[int]], label: str
) -> list[dict[str, Any]]:
    """The rows of every entry of ``scale["languages"]`` (``language_rows``), cells cached in
    ``<out>/cache/<name>.json``. ``steps_for(length)`` gives the step counts at a length; ``cell(language,
    samples)`` gives a cell's values; ``label`` names the experiment in progress bars."""
    cache = CellCache(out / "cache" / f"{name}.json")
    rows: list[dict[str, Any]] = []
    for spec in scale["languages"]:
        rows += language_rows(spec, scale, out, cache, cell=cell, steps_for=steps_for, label=label)
    return rows


def language_rows(
    spec: dict,
    scale: dict,
    out: Path,
    cache: CellCache,
    *,
    cell: Cell,
    steps_for: Callable[[int], list[int]],
    label: str,
) -> list[dict[str, Any]]:
    """All rows of one language entry: the oracle at each length of ``scale["lengths"]``, then (with ``train``)
    the trained models at ``scale["train_length"]`` (arguments as in ``measure_languages``)."""
    language, name = make_language(spec), language_name(spec)
    score = functools.partial(cell, language)
    oracle = OracleDenoiser(language, mask_token_id=language.vocab_size)
    rows: list[dict[str, Any]] = []
    for length in scale["lengths"]:
        rows += oracle_rows(
            oracle,
            name,
            length,
            steps_for(length),
            scale["num_samples"],
            cache,
            score,
            desc=f"{label} oracle {name} L={length}",
        )
    if spec.get("train", False):
        rows += trained_rows(spec, language, name, scale, out, cache, steps_for(scale["train_length"]), score)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Outputs


def scale_of(result: dict[str, Any]) -> dict:
    """The scale an experiment's JSON was run at (its ``"scale"``; ``"preset"`` in results written before that
    name)."""
    return result["scale"] if "scale" in result else result["preset"]


def experiment_result(name: str, scale: dict, rows: list[dict], **extra: Any) -> dict[str, Any]:
    """What ``<name>.json`` holds: the experiment, the machine, the scale, the rows and ``extra`` fields."""
    return {"experiment": name, "machine": machine_description(), "scale": scale, "rows": rows, **extra}


def validation_table(rows: list[dict]) -> list[str]:
    """Markdown lines: trained models' validation NLL per token beside the language's exact entropy, and the gap
    (NLL minus entropy, in nats per token and relative)."""
    validation = [r for r in rows if r["model"] == "validation"]
    if not validation:
        return []
    lines = [
        "",
        "| language | L | entropy/token | MDM val NLL (ELBO) | MDM gap (nats) | gap | AR val NLL "
        "| AR gap (nats) | gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in validation:
        entropy = r["entropy_per_token"]
        lines.append(
            f"| {r['language']} | {r['length']} | {entropy:.4f} | {r['mdm_nll']:.4f} | "
            f"{r['mdm_nll'] - entropy:.4f} | {100 * r['mdm_gap']:+.2f}% | {r['ar_nll']:.4f} | "
            f"{r['ar_nll'] - entropy:.4f} | {100 * r['ar_gap']:+.2f}% |"
        )
    return lines


def setup_lines(scale: dict) -> list[str]:
    """Markdown lines stating a table's set-up: each language's parameters, the sampler, the sample count, and
    each trained language's model size and training budget (the scale's ``training`` updated by the entry's own)."""
    languages = "; ".join(
        f"{language_name(spec)} ({spec['kind']}: {language_parameters(spec)})" for spec in scale["languages"]
    )
    lines = [
        "",
        f"Languages: {languages}.",
        "",
        "Sampler: the paper's (stochastic transfer, random order, linear schedule, temperature 1) for the MDMs, "
        f"ancestral sampling at temperature 1 for AR; {scale['num_samples']} samples per cell. Trained models "
        f"(the MDM and the same-size AR model, each trained at L = {scale['train_length']}):",
    ]
    for spec in scale["languages"]:
        if spec.get("train", False):
            budget = training_sentence({**scale["training"], **spec.get("training", {})})
            lines.append(f"- {language_name(spec)}: {budget}")
    return lines + [""]


def language_parameters(spec: dict) -> str:
    """A language entry's parameters in words, defaults included: ``num_states 16, vocab_size 16, ...``."""
    return ", ".join(f"{k} {v}" for k, v in make_language(spec).hyperparameters().items())


def training_sentence(cfg: dict) -> str:
    """A training budget in words: size, steps, batch, learning rate, training sequences."""
    from ..training import model_dims

    dims = model_dims(cfg["size"])
    size = cfg["size"] if isinstance(cfg["size"], str) else "custom"
    steps = (
        f"{cfg['max_steps']:,} steps (AR {training_steps(cfg, 'ar'):,})"
        if "ar_max_steps" in cfg
        else f"{cfg['max_steps']:,} steps"
    )
    return (
        f"`{size}` ({dims['hidden_size']} wide, {dims['num_hidden_layers']} layers), {steps} of "
        f"batch {cfg['batch_size']} at learning rate {cfg['learning_rate']:g} (cosine, "
        f"{cfg.get('warmup_steps', 0)} warm-up) on {cfg['num_train']:,} sampled sequences, "
        f"{cfg['num_validation']:,} for validation"
    )


def write_outputs(out: Path, name: str, result: dict, table: str, plot: Callable[[Path], None]) -> None:
    """``<name>.json``, ``<name>.md`` and ``<name>.png`` in ``out``, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", json.dumps(result, indent=1, default=str))
    write_atomic(out / f"{name}.md", table)
    tmp = out / f".{name}.tmp.png"
    plot(tmp)
    os.replace(tmp, out / f"{name}.png")
