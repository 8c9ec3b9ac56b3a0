"""The paper's synthetic experiments as functions: TER vs steps, SER vs steps, and MDM vs AR wall-clock.

Each experiment takes a plain dict (a preset from ``evaluation/configs/*.yaml``), writes ``<name>.json``,
``<name>.md`` and ``<name>.png`` into an output folder, and reuses finished pieces on re-runs: trained models
are kept under ``<out>/models/`` and every measured cell is cached in ``<out>/cache/<name>.json`` (written
atomically), so an interrupted run resumes where it stopped.

- ``ter_vs_steps``: the TER relative increase TER(p)/TER(q) - 1 (the paper's epsilon_total) of the paper's
  sampler (stochastic transfer, random order, linear schedule) against the number of steps N, for n-gram
  languages at several lengths L: with the exact-posterior oracle (no learning error) and with trained MDMs,
  the trained AR model's TER as reference (Theorem 4.2: it depends on N, not on L).
- ``ser_vs_steps``: the sequence error rate against N for a pruned HMM and for the Theorem 4.4 chain language,
  oracle and trained MDM, AR as reference, plus SER against N/L for several L (Theorem 4.4: one curve).
- ``wallclock``: seconds to generate a batch with an MDM at a fixed number of steps and with the same-size AR
  model decoding with its KV cache, as L grows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from .fileio import write_atomic
from .generation import diffusion_generate
from .languages import ChainLanguage, HMMLanguage, NGramLanguage, OracleDenoiser
from .metrics import SequenceErrorRate, TokenErrorRate

LANGUAGE_KINDS = ("ngram", "hmm", "chain")


# ----------------------------------------------------------------------------------------------------------------
# Small utilities


class CellCache:
    """A JSON dict of finished measurements, saved after every new cell."""

    def __init__(self, path: Path):
        self.path = path
        self.cells: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.cells:
            self.cells[key] = compute()
            write_atomic(self.path, json.dumps(self.cells, indent=1))
        return self.cells[key]


def make_language(spec: dict) -> Any:
    """A language from a config entry: ``{"kind": "ngram", "n": 2, "vocab_size": 4, "seed": 0, ...}``.

    ``name`` (for tables), ``train`` (whether to train models on it) and ``training`` (overrides of the preset's
    training settings) are experiment fields, not language parameters.
    """
    params = {k: v for k, v in spec.items() if k not in ("kind", "name", "train", "training")}
    kind = spec.get("kind")
    builders = {
        "ngram": lambda: NGramLanguage.random(params.pop("vocab_size"), params.pop("n"), params.pop("seed", 0), **params),
        "hmm": lambda: HMMLanguage.random(params.pop("num_states"), params.pop("vocab_size"), params.pop("seed", 0), **params),
        "chain": lambda: ChainLanguage(**params),
    }
    if kind not in builders:
        raise ValueError(f"language kind must be one of {list(LANGUAGE_KINDS)}, got {kind!r} in {spec}")
    try:
        return builders[kind]()
    except (KeyError, TypeError) as err:
        raise ValueError(f"bad parameters for a {kind} language in {spec}: {err}") from None


def language_name(spec: dict) -> str:
    if "name" in spec:
        return spec["name"]
    if spec.get("kind") == "ngram":
        return f"{spec['n']}-gram"
    return spec.get("kind", "language")


def machine_description() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


# ----------------------------------------------------------------------------------------------------------------
# Sampling


def sample_mdm(model: Any, num: int, length: int, steps: int, seed: int, batch_size: int = 512) -> torch.Tensor:
    """The paper's sampler: stochastic transfer, random order, linear schedule, tokens drawn at temperature 1."""
    out = []
    for start in range(0, num, batch_size):
        rows = min(batch_size, num - start)
        out.append(
            diffusion_generate(
                model, torch.zeros(rows, 0, dtype=torch.long, device=_device(model)), max_new_tokens=length,
                steps=steps, transfer="stochastic", strategy="random", schedule="linear", temperature=1.0,
                seed=seed + start, stop_at_eos=False,
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
        prompt = torch.full((rows, 1), bos, dtype=torch.long, device=_device(model))
        seq = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=length, min_new_tokens=length,
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=bos, eos_token_id=None,
            suppress_tokens=[bos],  # BOS is not a token of the language (a trained model gives it ~0 mass)
        )
        out.append(seq[:, 1:].cpu())
    return torch.cat(out)


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


# ----------------------------------------------------------------------------------------------------------------
# Training (reused across runs)


def trained_pair(language: Any, length: int, preset: dict, out: Path, tag: str, overrides: Optional[dict] = None) -> dict[str, Any]:
    """Train (or reload) the tiny MDM and AR baseline of a language; returns models and validation NLL vs entropy.

    ``preset["training"]`` holds the settings, updated by ``overrides`` (a language entry's own ``training``)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainingArguments

    from . import MDMForMaskedDiffusion
    from .training import build_trainer, train

    entropy = language.expected_nll(length).value / length
    train_cfg = {**preset["training"], **(overrides or {})}
    generator = torch.Generator().manual_seed(train_cfg.get("seed", 0))
    data = None
    result: dict[str, Any] = {"entropy_per_token": entropy}
    settings = hashlib.sha1(json.dumps([train_cfg, language.to_config()], sort_keys=True, default=str).encode()).hexdigest()[:8]
    for kind in ("mdm", "ar"):
        folder = out / "models" / f"{tag}-L{length}-{settings}-{kind}"  # new settings never reuse stale models
        metrics_path = folder / "final" / "metrics.json"
        if not metrics_path.exists():
            if data is None:
                train_rows = language.sample(train_cfg["num_train"], length, generator=generator)
                val_rows = language.sample(train_cfg["num_validation"], length, generator=generator)
                data = (Dataset.from_dict({"input_ids": train_rows.tolist()}), Dataset.from_dict({"input_ids": val_rows.tolist()}))
            args = TrainingArguments(
                output_dir=str(folder), per_device_train_batch_size=train_cfg["batch_size"],
                per_device_eval_batch_size=train_cfg["batch_size"], max_steps=train_cfg["max_steps"],
                learning_rate=train_cfg["learning_rate"], warmup_steps=train_cfg.get("warmup_steps", 0),
                lr_scheduler_type="cosine", weight_decay=0.0, save_steps=train_cfg["max_steps"], save_total_limit=1,
                eval_strategy="no", logging_steps=max(train_cfg["max_steps"] // 5, 1), report_to=[],
                disable_tqdm=True, seed=train_cfg.get("seed", 0),  # experiments run side by side: loss lines only
                use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
            )
            print(f"training the {kind.upper()} for {tag} at L={length}: {train_cfg['max_steps']} steps", flush=True)
            trainer = build_trainer(kind, data[0], data[1], vocab_size=language.vocab_size, length=length, args=args,
                                    size=train_cfg["size"], entropy_per_token=entropy, seed=train_cfg.get("seed", 0))
            train(trainer)
            metrics = trainer.evaluate()
            trainer.save_model(str(folder / "final"))
            write_atomic(metrics_path, json.dumps({k: float(v) for k, v in metrics.items()}, indent=1))
        metrics = json.loads(metrics_path.read_text())
        loader = MDMForMaskedDiffusion if kind == "mdm" else AutoModelForCausalLM
        model = loader.from_pretrained(str(folder / "final")).eval()
        if kind == "mdm" and not isinstance(model, MDMForMaskedDiffusion):
            raise ValueError(f"{folder} does not hold an MDM checkpoint")
        result[kind] = model
        result[f"{kind}_nll"] = metrics["eval_loss"]
        result[f"{kind}_gap"] = metrics["eval_loss"] / entropy - 1.0
    return result


def lazy_pair(language: Any, length: int, preset: dict, out: Path, tag: str, overrides: Optional[dict]):
    """``trained_pair`` on first call only: re-runs whose cells are all cached neither train nor load models."""
    memo: dict[str, Any] = {}

    def get() -> dict[str, Any]:
        if not memo:
            memo.update(trained_pair(language, length, preset, out, tag, overrides))
        return memo

    return get


def trained_rows(spec: dict, language: Any, name: str, preset: dict, out: Path, cache: CellCache,
                 steps_list: list[int], score: Callable[[torch.Tensor], dict]) -> list[dict[str, Any]]:
    """Rows for the trained AR model, the trained MDM at each step count, and the validation NLLs vs entropy."""
    length, num = preset["train_length"], preset["num_samples"]
    pair = lazy_pair(language, length, preset, out, name, spec.get("training"))
    base = {"language": name, "length": length}
    rows = [{**base, "model": "trained AR", "steps": length,
             **cache.get(f"ar|{name}|{length}", lambda: score(sample_ar(pair()["ar"], num, length, seed=1)))}]
    for steps in tqdm(steps_list, desc=f"trained MDM {name}", leave=False):
        cell = cache.get(f"mdm|{name}|{length}|{steps}",
                         lambda: score(sample_mdm(pair()["mdm"], num, length, steps, seed=steps)))
        rows.append({**base, "model": "trained MDM", "steps": steps, **cell})
    rows.append({**base, "model": "validation", "steps": 0,
                 **cache.get(f"validation|{name}|{length}", lambda: validation_row(pair()))})
    return rows


def validation_row(pair: dict[str, Any]) -> dict[str, float]:
    keys = ("mdm_nll", "ar_nll", "entropy_per_token", "mdm_gap", "ar_gap")
    return {k: float(pair[k]) for k in keys}


# ----------------------------------------------------------------------------------------------------------------
# Experiment a: TER vs steps


def ter_vs_steps(preset: dict, out: Path) -> dict[str, Any]:
    cache = CellCache(out / "cache" / "ter_vs_steps.json")
    metric = TokenErrorRate()
    num, steps_list = preset["num_samples"], preset["steps"]
    rows: list[dict[str, Any]] = []
    for spec in preset["languages"]:
        language, name = make_language(spec), language_name(spec)
        for length in preset["lengths"]:
            oracle = OracleDenoiser(language, mask_token_id=language.vocab_size)
            for steps in tqdm(steps_list, desc=f"TER oracle {name} L={length}", leave=False):
                key = f"oracle|{name}|{length}|{steps}"
                cell = cache.get(key, lambda: _ter_cell(metric, language, sample_mdm(oracle, num, length, steps, seed=steps)))
                rows.append({"language": name, "length": length, "model": "oracle MDM", "steps": steps, **cell})
        if spec.get("train", False):
            rows += trained_rows(spec, language, name, preset, out, cache, steps_list,
                                 lambda samples: _ter_cell(metric, language, samples))
    result = {"experiment": "ter_vs_steps", "machine": machine_description(), "preset": preset, "rows": rows}
    _write_outputs(out, "ter_vs_steps", result, ter_table(rows, steps_list), lambda p: plot_ter(rows, p))
    return result


def _ter_cell(metric: TokenErrorRate, language: Any, samples: torch.Tensor) -> dict[str, float]:
    r = metric.compute(predictions=samples.tolist(), language=language)
    return {"ter": r["ter"], "ter_reference": r["ter_reference"], "relative_increase": r["relative_increase"],
            "num_out_of_support": r["num_out_of_support"]}


def validation_table(rows: list[dict]) -> list[str]:
    """Markdown lines: trained models' validation NLL per token beside the language's exact entropy."""
    validation = [r for r in rows if r["model"] == "validation"]
    if not validation:
        return []
    lines = ["", "| language | L | entropy/token | MDM val NLL (ELBO) | gap | AR val NLL | gap |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in validation:
        lines.append(f"| {r['language']} | {r['length']} | {r['entropy_per_token']:.4f} | {r['mdm_nll']:.4f} | "
                     f"{100 * r['mdm_gap']:+.2f}% | {r['ar_nll']:.4f} | {100 * r['ar_gap']:+.2f}% |")
    return lines


def ter_table(rows: list[dict], steps_list: list[int]) -> str:
    lines = ["| language | L | model | " + " | ".join(f"N={s}" for s in steps_list) + " |",
             "| --- | --- | --- |" + " --- |" * len(steps_list)]
    groups: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r["model"] in ("oracle MDM", "trained MDM"):
            groups.setdefault((r["language"], r["length"], r["model"]), {})[r["steps"]] = r["relative_increase"]
    for (name, length, model), by_steps in groups.items():
        cells = [f"{100 * by_steps[s]:.2f}%" if s in by_steps else "" for s in steps_list]
        lines.append(f"| {name} | {length} | {model} | " + " | ".join(cells) + " |")
    for r in rows:
        if r["model"] == "trained AR":
            lines.append(f"| {r['language']} | {r['length']} | trained AR (L steps) | "
                         + " | ".join([f"{100 * r['relative_increase']:.2f}%"] * len(steps_list)) + " |")
    return "\n".join(lines + validation_table(rows)) + "\n"


def plot_ter(rows: list[dict], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["language"] for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for model, style in (("oracle MDM", "-o"), ("trained MDM", "--s")):
            for length in sorted({r["length"] for r in rows if r["language"] == name and r["model"] == model}):
                pts = sorted((r["steps"], r["relative_increase"]) for r in rows
                             if r["language"] == name and r["model"] == model and r["length"] == length)
                ax.plot([p[0] for p in pts], [max(p[1], 1e-5) for p in pts], style, label=f"{model}, L={length}", ms=4)
        for r in rows:
            if r["language"] == name and r["model"] == "trained AR":
                ax.axhline(max(r["relative_increase"], 1e-5), color="k", ls=":", label=f"trained AR, L={r['length']}")
        ax.set(xscale="log", yscale="log", xlabel="sampling steps N", ylabel="TER(p)/TER(q) - 1", title=name)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("TER relative increase vs steps (Theorem 4.2: depends on N, not L)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# Experiment b: SER vs steps


def ser_vs_steps(preset: dict, out: Path) -> dict[str, Any]:
    cache = CellCache(out / "cache" / "ser_vs_steps.json")
    metric = SequenceErrorRate()
    num = preset["num_samples"]
    rows: list[dict[str, Any]] = []
    for spec in preset["languages"]:
        language, name = make_language(spec), language_name(spec)
        oracle = OracleDenoiser(language, mask_token_id=language.vocab_size)
        for length in preset["lengths"]:
            for ratio in preset["steps_over_length"]:
                steps = max(1, int(round(ratio * length)))
                cell = cache.get(f"oracle|{name}|{length}|{steps}",
                                 lambda: _ser_cell(metric, language, sample_mdm(oracle, num, length, steps, seed=steps)))
                rows.append({"language": name, "length": length, "model": "oracle MDM", "steps": steps, **cell})
        if spec.get("train", False):
            length = preset["train_length"]
            steps_list = [max(1, int(round(ratio * length))) for ratio in preset["steps_over_length"]]
            rows += trained_rows(spec, language, name, preset, out, cache, steps_list,
                                 lambda samples: _ser_cell(metric, language, samples))
    for r in rows:
        if r["model"] != "validation":
            r["steps_over_length"] = r["steps"] / r["length"]
            if r["language"] == "chain" and r["model"] == "oracle MDM":
                r["predicted"] = ChainLanguage.predicted_ser(r["length"], r["steps"])
    result = {"experiment": "ser_vs_steps", "machine": machine_description(), "preset": preset, "rows": rows}
    _write_outputs(out, "ser_vs_steps", result, ser_table(rows), lambda p: plot_ser(rows, p))
    return result


def _ser_cell(metric: SequenceErrorRate, language: Any, samples: torch.Tensor) -> dict[str, float]:
    r = metric.compute(predictions=samples.tolist(), language=language)
    return {"ser": r["ser"], "ser_ci_low": r["ser_ci_low"], "ser_ci_high": r["ser_ci_high"]}


def ser_table(rows: list[dict]) -> str:
    lines = ["| language | L | model | N | N/L | SER | 95% CI | predicted (Thm 4.4) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["model"] == "validation":
            continue
        pred = f"{r['predicted']:.3f}" if "predicted" in r else ""
        lines.append(f"| {r['language']} | {r['length']} | {r['model']} | {r['steps']} | {r['steps_over_length']:.3g} | "
                     f"{r['ser']:.3f} | [{r['ser_ci_low']:.3f}, {r['ser_ci_high']:.3f}] | {pred} |")
    return "\n".join(lines + validation_table(rows)) + "\n"


def plot_ser(rows: list[dict], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["language"] for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(4.4 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for model, style in (("oracle MDM", "-o"), ("trained MDM", "--s")):
            for length in sorted({r["length"] for r in rows if r["language"] == name and r["model"] == model}):
                pts = sorted((r["steps_over_length"], r["ser"]) for r in rows
                             if r["language"] == name and r["model"] == model and r["length"] == length)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{model}, L={length}", ms=4)
        if name == "chain":
            grid = [2 ** (k / 4) for k in range(-12, 21)]
            ax.plot(grid, [1 - math.exp(-0.75 / g) for g in grid], "k-", lw=0.8, alpha=0.5, label="1 - exp(-3L/4N)")
        for r in rows:
            if r["language"] == name and r["model"] == "trained AR":
                ax.axhline(r["ser"], color="k", ls=":", label=f"trained AR, L={r['length']}")
        ax.set(xscale="log", xlabel="steps / length (N/L)", ylabel="SER", ylim=(-0.02, 1.02), title=name)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Sequence error rate vs N/L (Theorem 4.4: needs N growing with L)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# Experiment c: wall-clock


@torch.no_grad()
def wallclock(preset: dict, out: Path) -> dict[str, Any]:
    from transformers import LlamaForCausalLM

    from . import MDMForMaskedDiffusion
    from .training import ar_config_for, mdm_config_for

    cache = CellCache(out / "cache" / "wallclock.json")
    vocab, batch, steps, repeats = preset["vocab_size"], preset["batch_size"], preset["mdm_steps"], preset["repeats"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    longest = max(preset["lengths"])
    torch.manual_seed(0)
    mdm = MDMForMaskedDiffusion(mdm_config_for(vocab, longest, preset["size"])).to(device).eval()
    ar = LlamaForCausalLM(ar_config_for(vocab, longest, preset["size"])).to(device).eval()
    rows = []
    for length in tqdm(preset["lengths"], desc="wall-clock", leave=False):
        prompt = torch.zeros(batch, 0, dtype=torch.long, device=device)
        bos = torch.full((batch, 1), vocab, dtype=torch.long, device=device)

        def run_mdm():
            diffusion_generate(mdm, prompt, max_new_tokens=length, steps=steps, transfer="deterministic",
                               strategy="confidence", stop_at_eos=False)

        def run_ar():
            ar.generate(bos, attention_mask=torch.ones_like(bos), max_new_tokens=length, min_new_tokens=length,
                        do_sample=False, use_cache=True, pad_token_id=vocab, eos_token_id=None)

        cell = cache.get(f"{length}|{batch}|{steps}|{device.type}", lambda: {
            "mdm_s": _median_seconds(run_mdm, repeats, device), "ar_s": _median_seconds(run_ar, repeats, device)})
        rows.append({"length": length, **cell, "ar_over_mdm": cell["ar_s"] / cell["mdm_s"]})
    crossover = next((r["length"] for r in rows if r["ar_s"] > r["mdm_s"]), None)
    result = {"experiment": "wallclock", "machine": machine_description(), "preset": preset, "rows": rows,
              "crossover_length": crossover,
              "parameters": {"mdm": sum(p.numel() for p in mdm.parameters()), "ar": sum(p.numel() for p in ar.parameters())}}
    lines = [f"| L | MDM, {steps} steps (s) | AR with KV cache (s) | AR / MDM |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['length']} | {r['mdm_s']:.3f} | {r['ar_s']:.3f} | {r['ar_over_mdm']:.2f} |" for r in rows]
    lines += ["", f"Batch {batch}, {machine_description()}, {result['parameters']['mdm']:,} / "
              f"{result['parameters']['ar']:,} parameters (MDM / AR); medians of {repeats} runs. "
              + (f"AR is slower from L = {crossover} on." if crossover else "AR is faster at every L measured.")]
    table = "\n".join(lines) + "\n"
    _write_outputs(out, "wallclock", result, table, lambda p: plot_wallclock(rows, steps, p))
    return result


def _median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plot_wallclock(rows: list[dict], steps: int, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    lengths = [r["length"] for r in rows]
    ax.plot(lengths, [r["mdm_s"] for r in rows], "-o", label=f"MDM, {steps} steps")
    ax.plot(lengths, [r["ar_s"] for r in rows], "-s", label="AR, KV cache")
    ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="seconds per batch", title="Wall-clock vs L")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------


def _write_outputs(out: Path, name: str, result: dict, table: str, plot: Callable[[Path], None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", json.dumps(result, indent=1, default=str))
    write_atomic(out / f"{name}.md", table)
    tmp = out / f".{name}.tmp.png"
    plot(tmp)
    os.replace(tmp, out / f"{name}.png")


EXPERIMENTS: dict[str, Callable[[dict, Path], dict]] = {
    "ter_vs_steps": ter_vs_steps,
    "ser_vs_steps": ser_vs_steps,
    "wallclock": wallclock,
}


def run_experiment(name: str, preset: dict, out: Path) -> dict:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}: use one of {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name](preset, Path(out))


def load_preset(config_path: Path, full: bool = False) -> tuple[str, dict]:
    """``(experiment name, preset)`` from a YAML config with ``experiment:``, ``quick:`` and ``full:`` sections."""
    import yaml

    config = yaml.safe_load(Path(config_path).read_text())
    for key in ("experiment", "quick", "full"):
        if key not in config:
            raise ValueError(f"{config_path}: missing the `{key}` field")
    return config["experiment"], config["full" if full else "quick"]

