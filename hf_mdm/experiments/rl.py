"""Experiment: what few-step correctness costs a policy trained for it (GRPO, `hf_mdm.rl`; Theorem 4.4).

Theorem 4.4: for the language's own distribution, a low sequence error rate needs the steps N to grow with the
length L. A policy trained with reinforcement learning for correctness at few steps can escape that only by moving
away from the language's distribution. ``rl_vs_steps`` measures how far: the trained MDM of a language at
``length`` (the models ``ser_vs_steps`` trains at L = 16 are reused), fine-tuned with GRPO (reward 1 when the sample
is in the language) on rollouts of the paper's sampler at each N of ``rollout_steps`` (L/4 and L), one run per seed
of ``seeds``; before and after, at every N of ``rollout_steps``:

- the SER of ``num_samples`` samples (95% Wilson interval), and the share of distinct samples;
- the paper's TER at the rollout N: sequences of the language scored by the policy's sampler law (`ter_cells`):
  how much of the language the policy still covers;

and the trained AR model beside it (SER, distinct share, exact TER). After-RL values are the means over the seeds
with a 95% t-interval. Writes ``rl.{json,md,png}``; cells are cached in ``<out>/cache/rl.json``.
"""

from __future__ import annotations

import copy
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..likelihood_law import RevealLaw
from .common import (
    CellCache,
    experiment_result,
    language_name,
    lazy_pair,
    make_language,
    sample_ar,
    sample_mdm,
    scale_of,
    write_outputs,
)
from .ser import ser_cell
from .ter_cells import ar_ter_cell, sampler_ter_cell

#: The rollouts' sampler: the paper's (stochastic transfer, random order, linear schedule), temperature 1.
PAPER_ROLLOUT = {"transfer": "stochastic", "strategy": "random", "schedule": "linear"}
TER_SEED = 7


def rl_vs_steps(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``scale`` and write its outputs into ``out``; returns the JSON dict."""
    cache = CellCache(out / "cache" / "rl.json")
    rows = []
    for spec in scale["languages"]:
        rows += language_rows(spec, scale, out, cache)
    result = experiment_result("rl", scale, rows)
    write_outputs(out, "rl", result, rl_table(rows, scale), lambda path: plot_rl(rows, scale, path))
    return result


def language_rows(spec: dict, scale: dict, out: Path, cache: CellCache) -> list[dict]:
    """The AR row, the trained MDM before RL, and one row per (rollout N, seed) after RL, for one language."""
    language, name, length = make_language(spec), language_name(spec), scale["length"]
    pair = lazy_pair(language, length, scale, out, name, spec.get("training"))
    grpo = scale["grpo"]
    base = {"language": name, "length": length}
    rows = [
        {
            **base,
            "model": "trained AR",
            **cache.get(f"ar|{name}|{length}", lambda: ar_cell(pair()["ar"], language, scale)),
        }
    ]
    before = cache.get(
        f"before|{name}|{length}", lambda: measure(pair()["mdm"], language, scale, scale["rollout_steps"])
    )
    rows.append({**base, "model": "MDM before RL", **before})
    for estimator in grpo["estimators"]:
        for steps in scale["rollout_steps"]:
            for seed in scale["seeds"]:
                settings = sorted({**grpo, "estimators": estimator}.items())
                key = f"after|{name}|{length}|{steps}|{seed}|{settings}"
                cell = cache.get(key, lambda: after_cell(pair()["mdm"], language, scale, estimator, steps, seed))
                rows.append({**base, "model": "MDM after RL", "estimator": estimator, "rollout_steps": steps,
                             "seed": seed, **cell})  # fmt: skip
    return rows


def after_cell(model: Any, language: Any, scale: dict, estimator: str, steps: int, seed: int) -> dict[str, Any]:
    """GRPO from a copy of ``model`` on rollouts at ``steps``, then its measures (TER at ``steps`` only)."""
    policy, rewards = grpo_policy(model, language, scale, estimator, steps, seed)
    return {**measure(policy, language, scale, [steps], seed=seed), "rewards": rewards}


def grpo_policy(
    model: Any, language: Any, scale: dict, estimator: str, steps: int, seed: int
) -> tuple[Any, list[float]]:
    """A copy of ``model`` trained with GRPO (reward: the sample is in ``language``) on rollouts of the paper's
    sampler at ``steps``; returns it and the mean reward at each logged step."""
    from ..rl.language_task import language_prompts, language_tokenizer
    from ..rl.rewards import language_membership
    from ..rl.trainer import DiffusionGRPOConfig, grpo_trainer

    grpo = scale["grpo"]
    policy = copy.deepcopy(model).train()
    with tempfile.TemporaryDirectory() as folder:
        args = DiffusionGRPOConfig(
            output_dir=folder, per_device_train_batch_size=grpo["batch_size"], num_generations=grpo["num_generations"],
            max_completion_length=scale["length"], max_steps=grpo["max_steps"], learning_rate=grpo["learning_rate"],
            beta=grpo.get("beta", 0.0), estimator=estimator,
            rollout={"steps": steps, **PAPER_ROLLOUT}, bf16=False, use_cpu=not torch.cuda.is_available(),
            save_strategy="no", report_to=[], disable_tqdm=True, logging_steps=1, seed=seed,
            lr_scheduler_type="constant",
        )  # fmt: skip
        rows = grpo["max_steps"] * grpo["batch_size"] // grpo["num_generations"]
        trainer = grpo_trainer(
            policy, language_membership(language), language_prompts(rows), args, language_tokenizer(language.vocab_size)
        )
        trainer.train()
        rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return policy.eval(), rewards


def measure(model: Any, language: Any, scale: dict, ter_steps: list[int], seed: int = 0) -> dict[str, Any]:
    """SER (with its interval) and the distinct share at every rollout N, and the paper's TER at ``ter_steps``."""
    length, num = scale["length"], scale["num_samples"]
    cell: dict[str, Any] = {}
    for steps in scale["rollout_steps"]:
        samples = sample_mdm(model, num, length, steps, seed=1000 + seed)
        cell[f"n{steps}"] = {**ser_cell(language, samples), "distinct": distinct_share(samples)}
        if steps in ter_steps:
            cell[f"n{steps}"].update(
                sampler_ter_cell(
                    model, language, RevealLaw(steps), length, scale["ter_samples"], scale["ter_particles"], TER_SEED
                )  # fmt: skip
            )
    return cell


def ar_cell(model: Any, language: Any, scale: dict) -> dict[str, Any]:
    samples = sample_ar(model, scale["num_samples"], scale["length"], seed=1)
    ter = ar_ter_cell(model, language, scale["length"], scale["ter_samples"], TER_SEED)
    return {"ar": {**ser_cell(language, samples), "distinct": distinct_share(samples), **ter}}


def distinct_share(samples: torch.Tensor) -> float:
    """The share of distinct rows among ``samples`` (B, L)."""
    return torch.unique(samples, dim=0).shape[0] / samples.shape[0]


#: The range of each measure, where its interval is clipped: shares in [0, 1]; TER's relative increase >= -1.
RANGES = {
    "ser": (0.0, 1.0),
    "distinct": (0.0, 1.0),
    "ter_increase": (-1.0, math.inf),
    "ter": (0.0, math.inf),
    "reward": (0.0, 1.0),
}  # fmt: skip  (the reward here: membership, 0 or 1 a sample)


def seed_summary(values: list[float], key: str = "") -> tuple[float, float, float]:
    """(mean, 95% interval low, high) over seeds: Student's t with n - 1 degrees of freedom, clipped to the
    measure's range (`RANGES`)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    low, high = RANGES.get(key, (-math.inf, math.inf))
    return mean, max(mean - half, low), min(mean + half, high)


def _bound(cell: dict) -> bool:
    """Whether a measured cell's TER is only an upper bound (`hf_mdm.experiments.ter_cells`)."""
    return cell.get("ter_kind") == "upper bound"


def summary_rows(rows: list[dict], scale: dict) -> list[dict]:
    """Per language and rollout N: before, after (over seeds) and AR, for SER at every N, distinct share and TER."""
    out = []
    for name in dict.fromkeys(r["language"] for r in rows):
        mine = [r for r in rows if r["language"] == name]
        before = next(r for r in mine if r["model"] == "MDM before RL")
        ar = next(r for r in mine if r["model"] == "trained AR")["ar"]
        for estimator in scale["grpo"]["estimators"]:
            for trained in scale["rollout_steps"]:
                after = [r for r in mine if r.get("rollout_steps") == trained and r.get("estimator") == estimator]
                entry = {"language": name, "estimator": estimator, "rollout_steps": trained, "seeds": len(after),
                         "ar": ar}  # fmt: skip
                for steps in scale["rollout_steps"]:
                    for key in ("ser", "distinct") + (("ter", "ter_increase") if steps == trained else ()):
                        entry[f"before_{key}_n{steps}"] = before[f"n{steps}"][key]
                        entry[f"after_{key}_n{steps}"] = seed_summary([r[f"n{steps}"][key] for r in after], key)
                    if steps == trained:  # TER cells past the estimator's variance limit hold only an upper bound
                        entry[f"before_ter_bound_n{steps}"] = _bound(before[f"n{steps}"])
                        entry[f"after_ter_bound_n{steps}"] = any(_bound(r[f"n{steps}"]) for r in after)
                    for key in ("ser", "ter"):  # the measured cell's own 95% interval before RL
                        if f"{key}_ci_low" in before[f"n{steps}"]:
                            interval = (before[f"n{steps}"][f"{key}_ci_low"], before[f"n{steps}"][f"{key}_ci_high"])
                            entry[f"before_{key}_ci_n{steps}"] = interval
                entry["reward_first"] = seed_summary([statistics.fmean(r["rewards"][:5]) for r in after], "reward")
                entry["reward_last"] = seed_summary([statistics.fmean(r["rewards"][-5:]) for r in after], "reward")
                out.append(entry)
    return out


def rl_table(rows: list[dict], scale: dict) -> str:
    """Markdown: the setting, then per language and rollout N the measures before and after RL and the AR's."""
    grpo, length = scale["grpo"], scale["length"]
    lines = [
        f"GRPO (TRL, `hf_mdm.rl`) from the trained MDM of each language at L = {length}: reward 1 when the sample is "
        f"in the language; rollouts of the paper's sampler at N steps; {grpo['max_steps']} steps of "
        f"{grpo['batch_size']} completions ({grpo['num_generations']} per group), learning rate "
        f"{grpo['learning_rate']:g}, beta {grpo.get('beta', 0.0):g}, with each log-likelihood estimator of "
        f"{grpo['estimators']} (`hf_mdm.rl.estimators`); seeds {scale['seeds']}. SER over {scale['num_samples']} samples of the paper's sampler (95% "
        f"Wilson interval before RL; after RL, the mean over seeds with a 95% t-interval); TER: the paper's, "
        f"{scale['ter_samples']} sequences of the language scored by the policy's sampler law at the rollout N.",
        "",
        "| language | estimator | RL at N | measure | before RL | after RL | trained AR |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in summary_rows(rows, scale):
        trained = entry["rollout_steps"]
        for steps in scale["rollout_steps"]:
            for key, label in (("ser", "SER"), ("distinct", "distinct share"), ("ter", "TER")):
                if f"after_{key}_n{steps}" not in entry:
                    continue
                mean, low, high = entry[f"after_{key}_n{steps}"]
                before_bound, after_bound = (entry.get(f"{when}_ter_bound_n{steps}") for when in ("before", "after"))
                lines.append(
                    f"| {entry['language']} | {entry['estimator']} | {trained} | {label} at N = {steps} | "
                    f"{'<= ' if before_bound else ''}{entry[f'before_{key}_n{steps}']:.3f} | "
                    f"{'<= ' if after_bound else ''}{mean:.3f} [{low:.3f}, {high:.3f}] | {entry['ar'][key]:.3f} |"
                )
        first, last = entry["reward_first"], entry["reward_last"]
        lines.append(
            f"| {entry['language']} | {entry['estimator']} | {trained} | mean reward, first / last 5 steps | "
            f"{first[0]:.3f} | {last[0]:.3f} [{last[1]:.3f}, {last[2]:.3f}] | |"
        )
    return "\n".join(lines) + "\n"


def plot_rl(rows: list[dict], scale: dict, path: Path) -> None:
    """Per language (columns): SER and the share of distinct samples (rows) at each measured N, bars for the MDM
    before RL and after RL with each estimator and rollout N (95% t-intervals over seeds), the AR as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summary_rows(rows, scale)
    languages = list(dict.fromkeys(e["language"] for e in summary))
    fig, axes = plt.subplots(2, len(languages), figsize=(5.6 * len(languages), 6.4), squeeze=False)
    measured = scale["rollout_steps"]
    for column, name in enumerate(languages):
        entries = [e for e in summary if e["language"] == name]
        width = 0.8 / (len(entries) + 1)
        for row, (key, label) in enumerate((("ser", "SER"), ("distinct", "distinct share"))):
            ax = axes[row][column]
            xs = range(len(measured))
            ax.bar([x - 0.4 + width / 2 for x in xs], [entries[0][f"before_{key}_n{s}"] for s in measured], width,
                   label="before RL", color="0.6")  # fmt: skip
            for k, entry in enumerate(entries, start=1):
                values = [entry[f"after_{key}_n{s}"] for s in measured]
                ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], [v[0] for v in values], width,
                       yerr=[[v[0] - v[1] for v in values], [v[2] - v[0] for v in values]],
                       label=f"RL at N = {entry['rollout_steps']}, {entry['estimator']}")  # fmt: skip
            ax.axhline(entries[0]["ar"][key], color="k", lw=0.8, ls="--", label="trained AR")
            ax.set(xticks=list(xs), xticklabels=[f"sampled at N = {s}" for s in measured], ylabel=label,
                   ylim=(0, 1.05), title=f"{name}: {label}")  # fmt: skip
        axes[0][column].legend(fontsize=6)
    fig.suptitle(f"GRPO for correctness at few steps (L = {scale['length']}): what it buys and what it costs")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def rl_verdicts(result: dict) -> list[str]:
    """REPORT sentences, each from the rows with its interval: per language, estimator and rollout N, what GRPO did
    to the SER at that N (with the share of distinct samples), and to the paper's TER at that N (how much of the
    language the policy covers), said as a change only where the intervals separate."""
    from ..report_verdicts import ABOVE, BELOW, fmt, side

    def moved(before: tuple, after: tuple) -> str:
        relation = side(after, before)
        return {BELOW: "fell", ABOVE: "rose"}.get(relation, "moved by no resolved amount")

    lines = []
    for e in summary_rows(result["rows"], scale_of(result)):
        n = e["rollout_steps"]
        ser, ter, distinct = e[f"after_ser_n{n}"], e[f"after_ter_increase_n{n}"], e[f"after_distinct_n{n}"]
        before_ser = (e[f"before_ser_n{n}"], *e[f"before_ser_ci_n{n}"])
        before_ter = (e[f"before_ter_increase_n{n}"], *e[f"before_ter_ci_n{n}"])
        subject = (
            f"{e['language']}, GRPO with the `{e['estimator']}` estimator on rollouts at N = {n} ({e['seeds']} seeds)"
        )
        lines.append(
            f"{subject}: the SER at N = {n} {moved(before_ser[1:], ser[1:])}, from {fmt(*before_ser)} to "
            f"{fmt(*ser)} (the trained AR's: {e['ar']['ser']:.3f}), the share of distinct samples from "
            f"{e[f'before_distinct_n{n}']:.3f} to {fmt(*distinct)}."
        )
        change = f"from {fmt(*before_ter, percent=True)} to {fmt(*ter, percent=True)}"
        if e[f"before_ter_bound_n{n}"] or e[f"after_ter_bound_n{n}"]:  # a bound is no value: no rise or fall said
            which = " and ".join(w for w in ("before", "after") if e[f"{w}_ter_bound_n{n}"])
            lines.append(
                f"{subject}: the paper's TER at N = {n}, as a relative increase over the language's own, {change}: "
                f"these cells hold only an upper bound ({which} RL, the estimator's variance past its limit)."
            )
            continue
        lines.append(
            f"{subject}: the paper's TER at N = {n}, as a relative increase over the language's own, "
            f"{moved(before_ter[1:], ter[1:])}, {change}."
        )
    return lines + [run_sentence(result, name) for name in dict.fromkeys(r["language"] for r in result["rows"])]


def run_sentence(result: dict, name: str, margin: float = 0.05) -> str:
    """Over every GRPO run of a language (estimators, rollout N, seeds): how many reached an SER at their N within
    ``margin`` of the trained AR's, and what those runs kept of the language (distinct share, TER against before)."""
    rows = [r for r in result["rows"] if r["language"] == name]
    ar = next(r for r in rows if r["model"] == "trained AR")["ar"]["ser"]
    before = next(r for r in rows if r["model"] == "MDM before RL")
    runs = [r for r in rows if r["model"] == "MDM after RL"]
    good = [r for r in runs if r[f"n{r['rollout_steps']}"]["ser"] <= ar + margin]
    head = f"{name}: {len(good)} of {len(runs)} GRPO runs reached an SER at their N at most {margin} above the trained AR's ({ar:.3f})"
    if not good:
        return head + "."
    distinct = max(r[f"n{r['rollout_steps']}"]["distinct"] for r in good)
    estimated = [
        r for r in good if not _bound(r[f"n{r['rollout_steps']}"]) and not _bound(before[f"n{r['rollout_steps']}"])
    ]
    if not estimated:  # a ratio of bounds says nothing
        return (
            f"{head}; those runs kept at most {distinct:.3f} of their samples distinct (their TER: upper bounds only)."
        )
    ratio = min(r[f"n{r['rollout_steps']}"]["ter"] / before[f"n{r['rollout_steps']}"]["ter"] for r in estimated)
    return (
        f"{head}; those runs kept at most {distinct:.3f} of their samples distinct, and the TER at that N of those "
        f"with estimates was at least {ratio:.2f} times the MDM's before RL."
    )
