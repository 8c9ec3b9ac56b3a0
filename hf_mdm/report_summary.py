"""The table of findings that opens ``results/REPORT.md`` and ends ``hf-mdm reproduce``.

One row per finding: the experiment, the finding with its numbers and 95% intervals (a sentence the report computes
from the results JSON: the verdicts of `hf_mdm.report_verdicts`, the block-diffusion findings, the scaling fit, the
wall-clock crossover, the RL experiment's), its verdict (`verdict_of`: resolved, not resolved, or a bound only) and
the experiment's figure. The table adds no claim of its own; an experiment without its JSON is a row saying it was
not run, with the command that runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .experiments.a2d import CONVERTED, a2d_summary
from .experiments.blocks import findings as block_findings
from .experiments.budget import QUANTITIES, difference_verdict, equal_flops_summary
from .experiments.samplers import verdict as sampler_headline
from .experiments.scaling import scaling_sentences
from .experiments.speed import crossover_sentence
from .report_verdicts import ser_verdicts, ter_verdicts

#: Per sampler line of the samplers experiment, the parts kept: where it lies below / above the paper's, and the
#: share of distinct samples (the diversity a mode-seeking sampler gives up).
SAMPLER_PARTS = ("below the paper's", "above on", "share of distinct")


def _ter(result: dict) -> list[str]:
    keep = ("no dependence on L", "differs between lengths", "only an upper bound", "at no N measured", "The estimator")
    return [line for line in ter_verdicts(result) if any(k in line for k in keep)]


def _ser(result: dict) -> list[str]:
    keep = ("learning error alone", "closed form lies inside", "the trained AR's")
    lines = [line for line in ser_verdicts(result) if any(k in line for k in keep)]
    return lines + scaling_sentences(result.get("scaling_rows") or [])


def _samplers(result: dict) -> list[str]:
    kept = [line[2:] for line in sampler_headline(result["rows"]).splitlines() if line.startswith("- **")]
    parts = (line.rstrip(".").split("; ") for line in kept)
    return ["; ".join(p for p in part if any(k in p for k in SAMPLER_PARTS)) + "." for part in parts]


def _blocks(result: dict) -> list[str]:
    lines = [line for line in block_findings(result["rows"]).splitlines() if line.startswith("Chain language")]
    flops = result.get("equal_flops") or []
    for entry in (e for e in equal_flops_summary(flops) if "d_gap" in e) if flops else []:
        verdicts = "; ".join(difference_verdict(entry, key, name) for key, name in QUANTITIES)
        lines.append(f"{entry['model']} at equal training FLOPs: {verdicts}.")
    conversion = result.get("a2d") or []
    for entry in (e for e in a2d_summary(conversion) if e["model"] == CONVERTED) if conversion else []:
        verdicts = "; ".join(difference_verdict(entry, key, name, "the scratch MDM's") for key, name in QUANTITIES)
        lines.append(
            f"An AR model converted into an MDM (A2D), against an MDM from scratch at equal tokens: {verdicts}."
        )
    return lines


def _wallclock(result: dict) -> list[str]:
    models = [m for m in dict.fromkeys(r["model"] for r in result["rows"]) if m.startswith("MDM, ")]
    return [crossover_sentence(result["rows"], models[0]) + "."] if models else []


def _rl(result: dict) -> list[str]:
    from .experiments.rl_report import rl_verdicts

    return rl_verdicts(result)


#: (experiment, title, the sentences kept from its JSON).
SECTIONS: tuple[tuple[str, str, Callable[[dict], list[str]]], ...] = (
    ("ter_vs_steps", "The paper's TER against steps (Theorem 4.2)", _ter),
    ("ser_vs_steps", "Sequence error rate against steps (Theorem 4.4)", _ser),
    ("samplers", "Samplers beyond the paper's, against it at equal sequential forwards per token", _samplers),
    ("block_diffusion", "Block diffusion", _blocks),
    ("rl", "Reinforcement learning for few-step correctness", _rl),
    ("wallclock", "Wall-clock against AR", _wallclock),
)

#: Words that mark a finding whose intervals do not separate, or that holds only a bound.
UNRESOLVED = ("not resolved", "no change resolved", "moved by no resolved amount", "overlap")
BOUND_ONLY = ("cells hold only an upper bound",)
CAVEAT = ("says little",)
#: Words of a part of a finding that compares (the parts that do not, such as a parenthesis, carry no verdict).
COMPARING = ("lower", "higher", "above", "below", "fell", "rose", "falls", "rises", "resolved", "overlap")


def verdict_of(sentence: str) -> str:
    """ "bound only" where the finding holds only a bound, "caveat" where it qualifies a measurement; else per part
    of the sentence (split at ";"): "not resolved" where the intervals overlap in every part that compares, "partly
    resolved" where in some, else "resolved"."""
    if any(word in sentence for word in BOUND_ONLY):
        return "bound only"
    if any(word in sentence for word in CAVEAT):
        return "caveat"
    parts = [part for part in sentence.split("; ") if any(word in part for word in COMPARING)] or [sentence]
    unresolved = [any(word in part for word in UNRESOLVED) for part in parts]
    if all(unresolved):
        return "not resolved"
    return "partly resolved" if any(unresolved) else "resolved"


def report_summary(folder: Path) -> str:
    """Markdown: the table of findings, a row each (see the module docstring)."""
    lines = [
        "## Findings",
        "",
        "| experiment | finding (numbers with 95% intervals) | verdict | figure |",
        "| --- | --- | --- | --- |",
    ]
    for name, title, sentences in SECTIONS:
        path = Path(folder) / f"{name}.json"
        figure = f"[{name}.png]({name}.png)"
        if not path.exists():
            lines.append(f"| {title} | not run (no {path}; `hf-mdm reproduce --only {name}` runs it) | | |")
            continue
        chosen = sentences(json.loads(path.read_text())) or ["no finding computed"]
        lines += [f"| {title} | {_cell(s)} | {verdict_of(s)} | {figure} |" for s in chosen]
    return "\n".join(lines) + "\n"


def _cell(sentence: str) -> str:
    """A sentence as a table cell (its pipes escaped, on one line)."""
    return " ".join(sentence.replace("|", "\\|").split())
