"""The RL experiment's rows in words, table and figure (`hf_mdm.experiments.rl` measures them).

Runs are grouped into cells by (language, estimator, rollout N, KL coefficient beta); a cell's after-RL values are
the means over its seeds with a 95% t-interval (``seed_summary``). Beside each cell: the runs that lost reward during
RL (``lost_reward``: the mean reward of the last ``REWARD_WINDOW`` logged steps under that of the first by more than
``LOST_MARGIN``), named in the table and the text; the KL sweep (one language, estimator and N at several beta) set
side by side against beta 0 (``sweep_sentence``): what the KL term keeps of the share of distinct samples and what it
costs in SER at the few steps RL trained for.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .common import scale_of

#: The range of each measure, where its interval is clipped: shares in [0, 1]; TER's relative increase >= -1; the
#: reward (membership, 0 or 1 a sample) in [0, 1].
RANGES = {
    "ser": (0.0, 1.0),
    "distinct": (0.0, 1.0),
    "ter_increase": (-1.0, math.inf),
    "ter": (0.0, math.inf),
    "reward": (0.0, 1.0),
}
#: Logged steps averaged at each end of a run's reward curve, and the drop that counts as reward lost.
REWARD_WINDOW, LOST_MARGIN = 5, 0.05


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


def bound(cell: dict) -> bool:
    """Whether a measured cell's TER is only an upper bound (`hf_mdm.experiments.ter_cells`)."""
    return cell.get("ter_kind") == "upper bound"


def reward_ends(row: dict) -> tuple[float, float]:
    """A run's mean reward over its first and its last ``REWARD_WINDOW`` logged steps."""
    rewards = row["rewards"]
    return statistics.fmean(rewards[:REWARD_WINDOW]), statistics.fmean(rewards[-REWARD_WINDOW:])


def lost_reward(row: dict) -> bool:
    first, last = reward_ends(row)
    return last < first - LOST_MARGIN


def run_label(row: dict) -> str:
    """A run by its settings: estimator, rollout N, beta and seed."""
    return f"{row['estimator']} N = {row['rollout_steps']} beta {row.get('beta', 0.0):g} seed {row['seed']}"


def _cells(runs: list[dict]) -> dict[tuple, list[dict]]:
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        cells.setdefault((r["estimator"], r["rollout_steps"], r.get("beta", 0.0)), []).append(r)
    return cells


def summary_rows(rows: list[dict], scale: dict) -> list[dict]:
    """Per language and cell: before, after (over seeds) and AR, for SER and the distinct share at every measured N
    and TER at the cell's N; the reward at both ends; the runs that lost reward."""
    out = []
    for name in dict.fromkeys(r["language"] for r in rows):
        mine = [r for r in rows if r["language"] == name]
        before = next(r for r in mine if r["model"] == "MDM before RL")
        ar = next(r for r in mine if r["model"] == "trained AR")["ar"]
        for (estimator, trained, beta), after in _cells([r for r in mine if r["model"] == "MDM after RL"]).items():
            entry = {"language": name, "estimator": estimator, "rollout_steps": trained, "beta": beta,
                     "seeds": len(after), "ar": ar, "lost": [run_label(r) for r in after if lost_reward(r)]}  # fmt: skip
            for steps in scale["rollout_steps"]:
                for key in ("ser", "distinct") + (("ter", "ter_increase") if steps == trained else ()):
                    entry[f"before_{key}_n{steps}"] = before[f"n{steps}"][key]
                    entry[f"after_{key}_n{steps}"] = seed_summary([r[f"n{steps}"][key] for r in after], key)
                if steps == trained:  # TER cells past the estimator's variance limit hold only an upper bound
                    entry[f"before_ter_bound_n{steps}"] = bound(before[f"n{steps}"])
                    entry[f"after_ter_bound_n{steps}"] = any(bound(r[f"n{steps}"]) for r in after)
                for key in ("ser", "ter"):  # the measured cell's own 95% interval before RL
                    if f"{key}_ci_low" in before[f"n{steps}"]:
                        interval = (before[f"n{steps}"][f"{key}_ci_low"], before[f"n{steps}"][f"{key}_ci_high"])
                        entry[f"before_{key}_ci_n{steps}"] = interval
            entry["reward_first"] = seed_summary([reward_ends(r)[0] for r in after], "reward")
            entry["reward_last"] = seed_summary([reward_ends(r)[1] for r in after], "reward")
            out.append(entry)
    return out


def rl_table(rows: list[dict], scale: dict) -> str:
    """Markdown: the setting, then per language and cell the measures before and after RL and the AR's."""
    grpo, length, sweep = scale["grpo"], scale["length"], scale.get("kl_sweep")
    swept = (
        f" KL sweep: {sweep['language']}, `{sweep['estimator']}`, N = {sweep['rollout_steps']} at beta "
        f"{', '.join(f'{b:g}' for b in sweep['betas'])} besides {grpo.get('beta', 0.0):g}."
        if sweep
        else ""
    )
    lines = [
        f"GRPO (TRL, `hf_mdm.rl`) from the trained MDM of each language at L = {length}: reward 1 when the sample is "
        f"in the language; rollouts of the paper's sampler at N = {rl_steps(scale)}; {grpo['max_steps']} steps of "
        f"{grpo['batch_size']} completions ({grpo['num_generations']} per group), learning rate "
        f"{grpo['learning_rate']:g}, beta {grpo.get('beta', 0.0):g}, with each log-likelihood estimator of "
        f"{grpo['estimators']} (`hf_mdm.rl.estimators`); {len(scale['seeds'])} seeds a cell.{swept} SER over "
        f"{scale['num_samples']} samples of the paper's sampler (95% Wilson interval before RL; after RL, the mean "
        f"over seeds with a 95% t-interval); TER: the paper's, {scale['ter_samples']} sequences of the language "
        f"scored by the policy's sampler law at the rollout N ('<=': an upper bound only). A run lost reward when "
        f"its mean reward over the last {REWARD_WINDOW} steps is under that of its first {REWARD_WINDOW} by more "
        f"than {LOST_MARGIN:g}.",
        "",
        "| language | estimator | RL at N | beta | measure | before RL | after RL | trained AR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in summary_rows(rows, scale):
        head = f"| {e['language']} | {e['estimator']} | {e['rollout_steps']} | {e['beta']:g} |"
        for steps in scale["rollout_steps"]:
            for key, label in (("ser", "SER"), ("distinct", "distinct share"), ("ter", "TER")):
                if f"after_{key}_n{steps}" not in e:
                    continue
                mean, low, high = e[f"after_{key}_n{steps}"]
                marks = ["<= " if key == "ter" and e[f"{w}_ter_bound_n{steps}"] else "" for w in ("before", "after")]
                lines.append(
                    f"{head} {label} at N = {steps} | {marks[0]}{e[f'before_{key}_n{steps}']:.3f} | "
                    f"{marks[1]}{mean:.3f} [{low:.3f}, {high:.3f}] | {e['ar'][key]:.3f} |"
                )
        first, last = e["reward_first"], e["reward_last"]
        lines.append(
            f"{head} mean reward, first / last {REWARD_WINDOW} steps | {first[0]:.3f} | "
            f"{last[0]:.3f} [{last[1]:.3f}, {last[2]:.3f}] | |"
        )
        lines.append(f"{head} runs that lost reward | | {len(e['lost'])} of {e['seeds']}: "
                     f"{', '.join(e['lost']) or 'none'} | |")  # fmt: skip
    return "\n".join(lines) + "\n"


def rl_steps(scale: dict) -> list[int]:
    """The N GRPO's rollouts use (``rl_steps``, else every measured N of ``rollout_steps``)."""
    return scale.get("rl_steps", scale["rollout_steps"])


def plot_rl(rows: list[dict], scale: dict, path: Path) -> None:
    """Per language (columns): each run's reward curve (a line per seed, coloured by cell), and each run's SER at
    its N against its share of distinct samples (a point per seed; before RL and the AR marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    languages = list(dict.fromkeys(r["language"] for r in rows))
    fig, axes = plt.subplots(2, len(languages), figsize=(5.6 * len(languages), 7.2), squeeze=False)
    for column, name in enumerate(languages):
        mine = [r for r in rows if r["language"] == name]
        before = next(r for r in mine if r["model"] == "MDM before RL")
        ar = next(r for r in mine if r["model"] == "trained AR")["ar"]
        curves, trade = axes[0][column], axes[1][column]
        for k, ((estimator, steps, beta), runs) in enumerate(_cells([r for r in mine if "rewards" in r]).items()):
            colour, label = f"C{k}", f"{estimator}, N = {steps}, beta {beta:g}"
            for i, r in enumerate(runs):
                curves.plot(r["rewards"], color=colour, lw=0.7, alpha=0.6, label=label if i == 0 else None)
            trade.scatter([r[f"n{steps}"]["distinct"] for r in runs], [r[f"n{steps}"]["ser"] for r in runs],
                          color=colour, s=14, label=label)  # fmt: skip
        first = rl_steps(scale)[0]
        trade.scatter([before[f"n{first}"]["distinct"]], [before[f"n{first}"]["ser"]], color="k", marker="*", s=80,
                      label=f"before RL (N = {first})")  # fmt: skip
        trade.scatter([ar["distinct"]], [ar["ser"]], color="k", marker="x", s=50, label="trained AR")
        curves.set(xlabel="GRPO step", ylabel="mean reward (in the language)", ylim=(-0.02, 1.02),
                   title=f"{name}: reward per run (a line per seed)")  # fmt: skip
        trade.set(xlabel="share of distinct samples", ylabel="SER at the run's N", xlim=(-0.02, 1.02),
                  ylim=(-0.02, 1.02), title=f"{name}: SER against diversity, a point per run")  # fmt: skip
        curves.legend(fontsize=6)
        trade.legend(fontsize=6)
    fig.suptitle(f"GRPO for correctness at few steps (L = {scale['length']}): what it buys and what it costs")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def _moved(before: tuple, after: tuple) -> str:
    from ..report_verdicts import ABOVE, BELOW, side

    return {BELOW: "fell", ABOVE: "rose"}.get(side(after, before), "moved by no resolved amount")


def rl_verdicts(result: dict) -> list[str]:
    """REPORT sentences, each from the rows with its interval: per cell, what GRPO did to the SER at its N (with the
    share of distinct samples) and to the paper's TER there (no rise or fall said of a bound); per language, the runs
    that lost reward and those that reached the AR's SER; the KL sweep against beta 0."""
    from ..report_verdicts import fmt

    lines = []
    summary = summary_rows(result["rows"], scale_of(result))
    for e in summary:
        n = e["rollout_steps"]
        ser, ter, distinct = e[f"after_ser_n{n}"], e[f"after_ter_increase_n{n}"], e[f"after_distinct_n{n}"]
        before_ser = (e[f"before_ser_n{n}"], *e[f"before_ser_ci_n{n}"])
        before_ter = (e[f"before_ter_increase_n{n}"], *e[f"before_ter_ci_n{n}"])
        subject = (
            f"{e['language']}, GRPO with the `{e['estimator']}` estimator, beta {e['beta']:g}, on rollouts at N = {n} "
            f"({e['seeds']} seeds)"
        )
        lines.append(
            f"{subject}: the SER at N = {n} {_moved(before_ser[1:], ser[1:])}, from {fmt(*before_ser)} to "
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
            f"{_moved(before_ter[1:], ter[1:])}, {change}."
        )
    names = dict.fromkeys(r["language"] for r in result["rows"])
    lines += [lost_sentence(result, name) for name in names] + [run_sentence(result, name) for name in names]
    return lines + sweep_sentence(summary, scale_of(result))


def lost_sentence(result: dict, name: str) -> str:
    """How many of a language's GRPO runs lost reward during RL, each named with its reward at both ends."""
    runs = [r for r in result["rows"] if r["language"] == name and r["model"] == "MDM after RL"]
    lost = [r for r in runs if lost_reward(r)]
    named = ", ".join(f"{run_label(r)} ({reward_ends(r)[0]:.3f} -> {reward_ends(r)[1]:.3f})" for r in lost)
    return (
        f"{name}: {len(lost)} of {len(runs)} GRPO runs lost reward during RL (mean reward of the last {REWARD_WINDOW} "
        f"steps under that of the first {REWARD_WINDOW} by more than {LOST_MARGIN:g})"
        + (f": {named}." if lost else ".")
    )


def run_sentence(result: dict, name: str, margin: float = 0.05) -> str:
    """Over every GRPO run of a language (estimators, rollout N, beta, seeds): how many reached an SER at their N
    within ``margin`` of the trained AR's, and what those runs kept of the language (distinct share, TER)."""
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
        r for r in good if not bound(r[f"n{r['rollout_steps']}"]) and not bound(before[f"n{r['rollout_steps']}"])
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


def sweep_sentence(summary: list[dict], scale: dict) -> list[str]:
    """The KL sweep (``scale["kl_sweep"]``): the SER at its N and the share of distinct samples at each beta, each
    beta > 0 against beta 0 (above, below, or not resolved from, by the 95% t-intervals over seeds)."""
    from ..report_verdicts import ABOVE, BELOW, fmt, side

    sweep = scale.get("kl_sweep")
    if not sweep:
        return []
    n = sweep["rollout_steps"]
    cells = {e["beta"]: e for e in summary if (e["language"], e["estimator"], e["rollout_steps"]) ==
             (sweep["language"], sweep["estimator"], n)}  # fmt: skip
    if 0.0 not in cells or len(cells) < 2:
        return []
    base, parts = cells[0.0], []
    for beta, e in sorted(cells.items()):
        for key, label in (("ser", f"SER at N = {n}"), ("distinct", "distinct share")):
            value = e[f"after_{key}_n{n}"]
            where = {ABOVE: "above", BELOW: "below"}.get(side(value[1:], base[f"after_{key}_n{n}"][1:]))
            relation = "" if beta == 0.0 else f" ({where or 'not resolved from'} beta 0's)"
            parts.append(f"beta {beta:g}, {label} {fmt(*value)}{relation}")
    return [
        f"{sweep['language']}, KL sweep with the `{sweep['estimator']}` estimator on rollouts at N = {n} "
        f"({base['seeds']} seeds a beta): " + "; ".join(parts) + "."
    ]
