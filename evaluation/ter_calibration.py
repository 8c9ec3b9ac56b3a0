"""Calibration of the paper's-TER estimator: how often its 95% intervals hold the exact value, against its variance.

Two kinds of truth, both per sequence: the Theorem 4.4 chain language's closed form, log p(x) = log q(x) +
(L - 1) log(1 - 3/(4N)) on every valid sequence (so TER(p)/TER(q) - 1 = (1 - 3/(4N))^(-(L-1)/L) - 1 and any spread
is the estimator's own), on a grid of L and N; and exact enumeration of the sampler's law on an HMM language at
L = 7 and a 3-gram language at L = 5 (`exact_sampler_log_probs`). For each cell, ``--groups`` (``--long-groups``
at L >= 256) disjoint groups of ``--per-group`` sequences each give one 95% interval (`mean_interval`, the interval
`TokenErrorRate` puts on the relative increase) of the estimator's error log p^(x) - log p(x) over the group's
sequences; a group is covered where it holds 0. On the chain this is the TER interval holding the closed form; on
the enumerated languages it is the same test with the sequences' own spread of log q(x) - log p(x) taken out (their
TER intervals at L <= 7 are several times the value, so whether they hold it tests little). Methods:

- the estimator (`estimate_sampler_log_probs`: twisted particle filter, bias-corrected), with the oracle's exact
  twist and with the pseudo-likelihood twist a trained model gets (``--twists``); each group's mean per-sequence
  variance of the runs' log Z is what `variance_limit` compares, so each group gets the label a call on its
  sequences would get (``estimate`` or ``upper bound``);
- the old one (`prior_sampling_log_probs`: the log of a mean over 8 groupings drawn from the sampler's law).

Printed: per cell the exact value, the estimate over all groups with its interval, the particles and twist power
the pilot chose, the groups' variances, the groups that cover (all, and those labelled ``estimate``), the mean
error; then coverage by variance band and twist, the limit the rule (`supported_limit`) gives per twist and per
case (`CASES`: the trained model's case is the pseudo-likelihood twist where it is not exact) beside the library's,
coverage at or below candidate limits, and coverage of the groups labelled ``estimate`` under
`ESTIMATE_VARIANCE_LIMIT`, each against the interval's own nominal level (`nominal`). ``--output`` writes the same
as Markdown (atomically), ``--runs`` the raw runs as JSONL (a line of settings, then a line per cell and method,
with its groups), and ``--from-runs`` recomputes every table from such a file without running anything: the
committed runs are evaluation/ter_calibration_runs.jsonl, and evaluation/TER_CALIBRATION.md is
``--from-runs evaluation/ter_calibration_runs.jsonl --output evaluation/TER_CALIBRATION.md``. Run:
``.venv/bin/python evaluation/ter_calibration.py`` (about 7 CPU-minutes on one core; ``--quick``: L <= 64). Times
in the tables are CPU seconds (``time.process_time``), which contention for the cores barely changes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path
from statistics import NormalDist

import torch
from scipy import stats
from tqdm.auto import tqdm

from hf_mdm.fileio import write_atomic
from hf_mdm.languages import ChainLanguage, HMMLanguage, NGramLanguage, OracleDenoiser
from hf_mdm.likelihood_law import (
    RevealLaw,
    estimate_sampler_log_probs,
    exact_sampler_log_probs,
    prior_sampling_log_probs,
)
from hf_mdm.likelihood_smc import ESTIMATE_VARIANCE_LIMIT, MAX_PARTICLES, variance_limit
from hf_mdm.metrics import TokenErrorRate
from hf_mdm.metrics.common import mean_interval, wilson_interval

CHAIN_LENGTHS, QUICK_LENGTHS, CHAIN_STEPS = (16, 64, 256), (16, 64), (2, 4, 8, 16, 64)
#: Chain cells from this length on (the slow ones) take ``--long-groups`` groups instead of ``--groups``.
LONG_LENGTH = 256
ENUM_STEPS = (2, 3, 5)
OLD_ORDERS = 8
CI_LOW, CI_HIGH = "relative_increase_ci_low", "relative_increase_ci_high"
TWISTS = ("exact twist", "pseudo-likelihood twist")
#: Edges of the variance bands (mean per-sequence variance of the runs' log Z over a group, nats^2) and the
#: candidate limits the tables compare.
VARIANCE_BANDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, math.inf)
CANDIDATE_LIMITS = (0.1, 0.2, 0.3, 0.5, 1.0)
#: The particle caps of each chain cell: the default, and smaller ones that leave hard cells more variance.
MAX_PARTICLE_CAPS = (MAX_PARTICLES, 32, 8)
#: The arguments the tables name, stored with ``--rows-json``.
SETTINGS = ("groups", "long_groups", "per_group", "max_pseudo_length", "max_particles")


def nominal(per_group: int) -> float:
    """The coverage of the normal 95% interval of a mean of ``per_group`` normal values (Student t)."""
    z = NormalDist().inv_cdf(0.975)
    return float(2 * stats.t.cdf(z, per_group - 1) - 1)


def estimate(method: str, model, language, law, x, seed: int, max_particles: int = MAX_PARTICLES) -> dict:
    """One method's per-sequence numbers: ``log_p`` (bias-corrected, or prior sampling's), ``bound``, ``variance``
    (None for prior sampling), ``particles`` (the pilot's choice, at most ``max_particles``) and ``power`` (the
    twist's beta; None for the exact twist)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = language.vocab_size
    if method == "prior sampling":
        log_p = prior_sampling_log_probs(model, law, x, vocab, OLD_ORDERS, generator)
        return {"log_p": log_p, "bound": log_p, "variance": None, "particles": OLD_ORDERS, "power": None}
    exact = method == "exact twist"  # else as a trained model: the pseudo-likelihood twist
    est = estimate_sampler_log_probs(
        model, law, x, vocab, generator=generator, max_particles=max_particles, exact_twist=exact
    )
    return {
        "log_p": est.log_prob,
        "bound": est.log_prob_bound,
        "variance": est.variance,
        "particles": est.num_particles,
        "power": est.twist_power,
    }


def group_rows(out: dict, exact_log_p: torch.Tensor, groups: int) -> list[dict]:
    """Per disjoint group: its mean variance, whether its interval of the error holds 0, its mean error and whether
    the bound's mean lies below the exact one (its TER above)."""
    size = exact_log_p.shape[0] // groups
    rows = []
    for g in range(groups):
        own = slice(g * size, (g + 1) * size)
        mean, low, high = mean_interval(out["log_p"][own] - exact_log_p[own])
        rows.append(
            {
                "variance": None if out["variance"] is None else float(out["variance"][own].mean()),
                "covered": bool(low <= 0.0 <= high),
                "error": mean,
                "bound_holds": bool(float((out["bound"][own] - exact_log_p[own]).mean()) <= 0.0),
            }
        )
    return rows


def is_estimate(row: dict, group: dict) -> bool:
    """Whether ``group`` of ``row`` is labelled an estimate: its variance at most its twist's `variance_limit`
    (prior sampling has no label: always)."""
    return group["variance"] is None or group["variance"] <= variance_limit(row["power"])


def cells(args):
    """(name, language, length, steps, exact per-sequence log p function, exact relative increase) of every cell."""
    chain = ChainLanguage()
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else CHAIN_LENGTHS)
    for length, steps in itertools.product(lengths, args.steps or CHAIN_STEPS):
        truth = ChainLanguage.predicted_ter_increase(length, steps)
        yield "chain", chain, length, steps, lambda x, L=length, t=truth: chain.log_prob(x) - L * math.log1p(t), truth
    enumerated = (
        ("HMM", HMMLanguage.random(4, 3, seed=0, prune_threshold=0.0), 7),
        ("3-gram", NGramLanguage.random(3, 3, seed=0, prune_threshold=0.0), 5),
    )
    for (name, language, length), steps in itertools.product(enumerated, args.enum_steps):
        yield f"{name} (enumeration)", language, length, steps, *enumerated_truth(language, length, steps)


def enumerated_truth(language, length: int, steps: int):
    """The exact log p of the sampler for given sequences, and its relative increase (every sequence, weights q)."""
    xs = torch.tensor(list(itertools.product(range(language.vocab_size), repeat=length)))
    model = OracleDenoiser(language, dtype=torch.float64)
    log_p = exact_sampler_log_probs(model, RevealLaw(steps), length, language.vocab_size)
    q = language.log_prob(xs).exp()
    result = TokenErrorRate().compute(
        predictions=log_p.tolist(), references=xs.tolist(), weights=(q / q.sum()).tolist(), language=language
    )
    digits = language.vocab_size ** torch.arange(length - 1, -1, -1)
    return lambda x: log_p[(x * digits).sum(1)], result["relative_increase"]


def run(args) -> list[dict]:
    """Every cell's rows; a chain cell once per ``--max-particles`` (largest first), a smaller cap only where the
    pilot chose more particles than it under the larger one (else the settings would repeat)."""
    rows = []
    methods = [*args.twists, "prior sampling"]
    caps = sorted(set(args.max_particles), reverse=True)
    for name, language, length, steps, exact_of, truth in tqdm(list(cells(args)), desc="cells"):
        model = OracleDenoiser(language, dtype=torch.float64)
        offset = 0 if name == "chain" else 7
        groups = args.long_groups if name == "chain" and length >= LONG_LENGTH else args.groups
        chosen: dict[str, int] = {}
        for cap in caps if name == "chain" else caps[:1]:
            seed = length * 1000 + steps + offset + (0 if cap == caps[0] else 1_000_003 * cap)
            x = language.sample(groups * args.per_group, length, torch.Generator().manual_seed(seed))
            exact_log_p = exact_of(x)
            for method in methods:
                if method == "pseudo-likelihood twist" and length > args.max_pseudo_length:
                    continue
                if cap != caps[0] and (method == "prior sampling" or chosen.get(method, 0) <= cap):
                    continue
                start = time.process_time()
                out = estimate(method, model, language, RevealLaw(steps), x, seed - length * 999, cap)
                chosen[method] = out["particles"]
                whole = TokenErrorRate().compute(
                    predictions=out["log_p"].tolist(), references=x.tolist(), language=language
                )
                rows.append(
                    {
                        "cell": f"{name}, L = {length}, N = {steps}",
                        "method": method,
                        "truth": truth,
                        "whole": [whole[k] for k in ("relative_increase", CI_LOW, CI_HIGH)],
                        "error": list(mean_interval(out["log_p"] - exact_log_p)),
                        "particles": out["particles"],
                        "max_particles": None if method == "prior sampling" else cap,
                        "power": out["power"],
                        "groups": group_rows(out, exact_log_p, groups),
                        "seconds": time.process_time() - start,
                    }
                )
    return rows


def _coverage(groups: list[dict]) -> str:
    """``covered | coverage [Wilson 95%]`` of ``groups``."""
    covered = sum(g["covered"] for g in groups)
    if not groups:
        return "0 | - "
    low, high = wilson_interval(covered, len(groups))
    return f"{covered} | {covered / len(groups):.3f} [{low:.2f}, {high:.2f}]"


def _error(groups: list[dict]) -> str:
    """The mean over ``groups`` of their mean error (nats per sequence) with its 95% interval over groups."""
    if not groups:
        return "-"
    mean, low, high = mean_interval(torch.tensor([g["error"] for g in groups], dtype=torch.float64))
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


#: The target the limit is set by: every variance band at or below it holds the exact value in this share of groups.
TARGET_COVERAGE = 0.90
#: The pseudo-likelihood twist with beta = 1/2 on the chain language is its exact twist (each token shares two
#: links); the band table also shows the pseudo-likelihood groups without it.
NOT_EXACT = "pseudo-likelihood twist, not exact (beta != 1/2 or not the chain)"


def _pooled(rows: list[dict]) -> dict[str, list[tuple[dict, dict]]]:
    """(row, group) pairs per method, and the pseudo-likelihood twist's groups whose twist is not exact."""
    out: dict[str, list[tuple[dict, dict]]] = {}
    for r in rows:
        for g in r["groups"]:
            out.setdefault(r["method"], []).append((r, g))
            if r["method"] == "pseudo-likelihood twist" and not (r["cell"].startswith("chain") and r["power"] == 0.5):
                out.setdefault(NOT_EXACT, []).append((r, g))
    return out


def supported_limit(groups: list[dict]) -> float:
    """The largest band edge below which every band of ``groups`` (variances) holds at least `TARGET_COVERAGE`."""
    limit = VARIANCE_BANDS[0]
    for low, high in zip(VARIANCE_BANDS[:-1], VARIANCE_BANDS[1:]):
        own = [g for g in groups if low <= g["variance"] < high]
        if own and sum(g["covered"] for g in own) < TARGET_COVERAGE * len(own):
            break
        limit = high
    return limit


#: The cases a limit is set for, by the groups they cover: each twist on every cell, and the pseudo-likelihood twist
#: where it is not exact (a trained model's case: its twist is never the language's exact one).
CASES = {
    "exact twist (the oracle's case)": lambda r: r["method"] == "exact twist",
    "pseudo-likelihood twist, every cell": lambda r: r["method"] == "pseudo-likelihood twist",
    "pseudo-likelihood twist, not exact (a trained model's case)": lambda r: (
        r["method"] == "pseudo-likelihood twist" and not (r["cell"].startswith("chain") and r["power"] == 0.5)
    ),
}
#: Which library limit (`ESTIMATE_VARIANCE_LIMIT`) serves each case.
LIBRARY_LIMIT = {
    "exact twist (the oracle's case)": "exact",
    "pseudo-likelihood twist, every cell": "pseudo-likelihood",
    "pseudo-likelihood twist, not exact (a trained model's case)": "pseudo-likelihood",
}
KINDS = {
    "all": lambda r: True,
    "chain": lambda r: r["cell"].startswith("chain"),
    "enumeration": lambda r: "enumeration" in r["cell"],
}


def case_limits(rows: list[dict]) -> list[str]:
    """Markdown lines: per case (`CASES`) and per kind of cell (`KINDS`), the limit the rule gives and the groups
    behind it, beside the library's limit for that case."""
    lines = [
        f"The rule, per twist and case: the largest band edge below which every band holds the exact value in at "
        f"least {TARGET_COVERAGE:.0%} of its groups (`supported_limit`), over the groups of each case and kind of "
        "cell, beside the limit the library applies to that case (`ESTIMATE_VARIANCE_LIMIT`):",
        "",
        "| case | cells | groups | rule's limit | library's limit |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case, chosen in CASES.items():
        for kind, keep in KINDS.items():
            groups = [g for r in rows if chosen(r) and keep(r) for g in r["groups"]]
            if groups:
                library = ESTIMATE_VARIANCE_LIMIT[LIBRARY_LIMIT[case]]
                lines.append(f"| {case} | {kind} | {len(groups)} | {supported_limit(groups):g} | {library:g} |")
    return lines + [""]


def report(rows: list[dict], args) -> str:
    level = nominal(args.per_group)
    caps = ", ".join(str(c) for c in args.max_particles[1:]) or "-"
    lines = [
        f"TER estimator calibration: {args.groups} disjoint groups of {args.per_group} sequences per cell "
        f"({args.long_groups} at L >= {LONG_LENGTH}), one 95% interval per group of the estimator's error "
        "log p^(x) - log p(x) over its sequences (`mean_interval`, the normal interval `TokenErrorRate` puts on the "
        "relative increase; on the chain language it is the TER interval holding the closed form); 'covered': "
        f"groups whose interval holds 0. With {args.per_group} sequences a group that interval's own nominal "
        f"coverage is {level:.3f} (Student t with {args.per_group - 1} degrees of freedom), not 0.95. 'variance': a "
        "group's mean per-sequence variance of the runs' log Z (nats^2), what `ESTIMATE_VARIANCE_LIMIT` in "
        f"hf_mdm/likelihood_smc.py compares ({ESTIMATE_VARIANCE_LIMIT}); above its twist's limit a group is "
        "labelled an upper bound. The pseudo-likelihood twist (a trained model's) is run up to "
        f"L = {args.max_pseudo_length}. Sequences and runs are seeded per cell; one estimator call per cell and "
        "method, so the groups of a cell share the particles and twist power its pilot chose. Each chain cell is "
        f"run with at most {args.max_particles[0]} particles a run (the default) and again with at most {caps} "
        "where the pilot chose more than that (other sequences and seeds): the same cells at higher variance.",
        "",
        "Coverage by variance band and twist (every group, whatever its label); error: the mean over groups of "
        "their mean error of log p, nats per sequence [95% interval over groups]:",
        "",
        "| twist | variance | groups | covered | coverage [95% CI] | error, nats/seq |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    pooled = _pooled(rows)
    groups_of = {m: [g for _, g in pairs] for m, pairs in pooled.items()}
    twists = [m for m in groups_of if m != "prior sampling"]
    for twist in twists:
        for low, high in zip(VARIANCE_BANDS[:-1], VARIANCE_BANDS[1:]):
            own = [g for g in groups_of[twist] if low <= g["variance"] < high]
            if own:
                lines.append(f"| {twist} | [{low:g}, {high:g}) | {len(own)} | {_coverage(own)} | {_error(own)} |")
    supported = {t: supported_limit(groups_of[t]) for t in twists}
    lines += [
        "",
        f"The largest band edge below which every band holds the exact value in at least {TARGET_COVERAGE:.0%} of "
        "its groups: " + "; ".join(f"{t}: {v:g}" for t, v in supported.items()) + ".",
        "",
        *case_limits(rows),
        "Groups at or below each candidate limit (those a limit there labels estimates), and above it:",
        "",
        "| twist | variance <= | groups | covered | coverage [95% CI] | error, nats/seq | groups above |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for twist in twists:
        for limit in CANDIDATE_LIMITS:
            own = [g for g in groups_of[twist] if g["variance"] <= limit]
            above = len(groups_of[twist]) - len(own)
            lines.append(f"| {twist} | {limit:g} | {len(own)} | {_coverage(own)} | {_error(own)} | {above} |")
    lines += [
        "",
        f"Under `ESTIMATE_VARIANCE_LIMIT` ({ESTIMATE_VARIANCE_LIMIT}): the groups labelled estimates, and for those "
        "labelled upper bounds whether the bound's TER lies above the exact one:",
        "",
        "| method | estimate groups | covered | coverage [95% CI] | nominal | error, nats/seq | upper-bound groups "
        "| bound's TER above exact |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, pairs in pooled.items():
        own = [g for r, g in pairs if is_estimate(r, g)]
        bounds = [g for r, g in pairs if not is_estimate(r, g)]
        held = sum(g["bound_holds"] for g in bounds)
        lines.append(
            f"| {method} | {len(own)} | {_coverage(own)} | {level:.3f} | {_error(own)} | {len(bounds)} | "
            f"{held} / {len(bounds)} |"
        )
    lines += [
        "",
        "Per cell: exact relative increase; the estimate over all groups [95% CI]; the particles and twist power "
        "beta the pilot chose (-: the exact twist), and the most it could choose; the groups' variance, mean (min - "
        "max); groups covered, of all and of those labelled estimates; the error of log p over all the cell's "
        "sequences, nats/seq [95% CI]:",
        "",
        "| cell | method | exact | estimate, all groups [95% CI] | particles / at most | beta | variance | covered | "
        "covered, estimates | error, nats/seq | s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        value, low, high = r["whole"]
        groups = r["groups"]
        if groups[0]["variance"] is None:
            variance = "-"
        else:
            v = [g["variance"] for g in groups]
            variance = f"{sum(v) / len(v):.3g} ({min(v):.3g} - {max(v):.3g})"
        estimates = [g for g in groups if is_estimate(r, g)]
        cap = r["max_particles"]
        particles = f"{r['particles']}" + ("" if cap is None else f" / {cap}")
        mean, e_low, e_high = r["error"]
        lines.append(
            f"| {r['cell']} | {r['method']} | {100 * r['truth']:.3f}% | {100 * value:.3f}% [{100 * low:.3f}, "
            f"{100 * high:.3f}] | {particles} | {'-' if r['power'] is None else r['power']} | {variance} | "
            f"{sum(g['covered'] for g in groups)} / {len(groups)} | "
            f"{sum(g['covered'] for g in estimates)} / {len(estimates)} | {mean:+.3f} [{e_low:+.3f}, {e_high:+.3f}] "
            f"| {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="chain lengths 16 and 64 only")
    parser.add_argument("--lengths", type=int, nargs="+", help="chain lengths instead of the default ones")
    parser.add_argument("--steps", type=int, nargs="+", help="chain step counts instead of the default ones")
    parser.add_argument("--enum-steps", type=int, nargs="*", default=list(ENUM_STEPS), help="N of the enumerated cells")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--long-groups", type=int, default=4, help=f"groups of the chain cells at L >= {LONG_LENGTH}")
    parser.add_argument("--per-group", type=int, default=16)
    parser.add_argument("--twists", nargs="+", default=list(TWISTS), choices=TWISTS)
    parser.add_argument("--max-pseudo-length", type=int, default=256, help="longest L for the pseudo-likelihood twist")
    parser.add_argument("--output", type=Path, default=None, help="also write the tables here (Markdown)")
    parser.add_argument(
        "--max-particles", type=int, nargs="+", default=list(MAX_PARTICLE_CAPS), help="the caps of the chain cells"
    )
    parser.add_argument("--runs", type=Path, default=None, help="also write the raw runs here (JSONL)")
    parser.add_argument(
        "--from-runs", type=Path, default=None, help="recompute the tables from the runs a --runs file holds"
    )
    args = parser.parse_args()
    if min(args.groups, args.long_groups, *args.max_particles) < 1 or args.per_group < 2:
        parser.error("--groups, --long-groups and --max-particles must be >= 1, --per-group >= 2")
    if args.from_runs is not None:
        settings, rows = read_runs(args.from_runs)
        vars(args).update(settings)
    else:
        torch.set_num_threads(1)
        rows = [_compact(r) for r in run(args)]  # as --runs stores them, so that --from-runs gives the same tables
    text = report(rows, args)
    print(text)
    if args.output is not None:
        write_atomic(args.output, text)
    if args.runs is not None:
        write_atomic(args.runs, runs_jsonl({k: getattr(args, k) for k in SETTINGS}, rows))


def _compact(value):
    """``value`` with its floats to 6 significant digits (the JSONL's size)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    return [_compact(v) for v in value] if isinstance(value, list) else value


def runs_jsonl(settings: dict, rows: list[dict]) -> str:
    """The raw runs as JSONL: ``{"settings": ...}``, then one row a line."""
    lines = [json.dumps({"settings": settings})] + [json.dumps(r, separators=(",", ":")) for r in rows]
    return "\n".join(lines) + "\n"


def read_runs(path: Path) -> tuple[dict, list[dict]]:
    """(settings, rows) of a ``--runs`` file."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[0]["settings"], lines[1:]


if __name__ == "__main__":
    main()
