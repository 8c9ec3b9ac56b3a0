"""The one-screen summary that opens ``results/REPORT.md`` and ends ``hf-mdm reproduce``.

Every line is a sentence the report computes from the results JSON (the verdicts of `hf_mdm.report_verdicts`, the
block-diffusion findings, the scaling fit, the wall-clock crossover), chosen per experiment: the summary adds no
claim of its own. An experiment without its JSON is named as not run, with the command that runs it.
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


#: (experiment, title, the sentences kept from its JSON).
SECTIONS: tuple[tuple[str, str, Callable[[dict], list[str]]], ...] = (
    ("ter_vs_steps", "The paper's TER against steps (Theorem 4.2)", _ter),
    ("ser_vs_steps", "Sequence error rate against steps (Theorem 4.4)", _ser),
    ("samplers", "Samplers beyond the paper's, against it at equal sequential forwards per token", _samplers),
    ("block_diffusion", "Block diffusion", _blocks),
    ("wallclock", "Wall-clock against AR", _wallclock),
)


def report_summary(folder: Path) -> str:
    """Markdown: per experiment its title and the chosen sentences, or that it was not run."""
    lines = ["## Summary", ""]
    for name, title, sentences in SECTIONS:
        path = Path(folder) / f"{name}.json"
        if not path.exists():
            lines.append(f"- **{title}**: not run (no {path}; `hf-mdm reproduce --only {name}` runs it).")
            continue
        chosen = sentences(json.loads(path.read_text()))
        lines.append(f"- **{title}**" + (":" if chosen else ": no finding computed."))
        lines += [f"  - {sentence}" for sentence in chosen]
    return "\n".join(lines) + "\n"
