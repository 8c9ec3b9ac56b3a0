"""What ``hf-mdm tune`` writes into its output folder, each file atomically: ``front.json`` (every row, the chosen
setting and its held-out quality), ``front.csv``, ``front.md`` (the table), ``front.png`` (quality against tokens/s
with intervals, the front and the chosen point marked, the AR baseline as a line) and ``generation_config.json``
(the chosen setting as a `MaskedDiffusionGenerationConfig` with every field its measurements ran with, the task's
temperature and length included, which `from_pretrained` reads from a model folder)."""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any, Optional

from ..fileio import write_atomic
from ..generation_config import MaskedDiffusionGenerationConfig
from .front import RESOLVING_ROUNDS
from .space import setting_key

#: The columns of ``front.csv`` and of every row of ``front.json`` besides ``setting``.
COLUMNS = (
    "quality",
    "quality_ci_low",
    "quality_ci_high",
    "samples",
    "nfe_per_token",
    "positions_per_token",
    "tokens_per_s",
    "tokens_per_s_min",
    "tokens_per_s_max",
    "on_front",
    "dropped_after",
)


def write_outputs(folder: Path, result: dict) -> None:
    """All files of the module docstring from ``result`` (rows, chosen, held_out, baseline, task description)."""
    folder = Path(folder)
    write_atomic(folder / "front.json", json.dumps(_json_safe(result), indent=1, allow_nan=False))
    write_atomic(folder / "front.csv", _csv(result["rows"]))
    write_atomic(folder / "front.md", front_table(result))
    write_atomic(folder / "front.png", _plot(result))
    write_generation_config(folder, result.get("generation_config") or result["chosen"]["setting"])


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None (a log-likelihood quality is -inf for a sample outside the
    language), so that ``front.json`` is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_generation_config(folder: Path, values: dict) -> Path:
    """``generation_config.json`` of ``values`` (generate fields) in ``folder`` (put it in a model folder to make it
    the default)."""
    config = MaskedDiffusionGenerationConfig(**values)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        text = (Path(tmp) / "generation_config.json").read_text()
    write_atomic(Path(folder) / "generation_config.json", text)
    return Path(folder) / "generation_config.json"


def _csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["setting", *COLUMNS])
    for row in rows:
        writer.writerow([setting_key(row["setting"]), *(row.get(c) for c in COLUMNS)])
    return buffer.getvalue()


def front_table(result: dict) -> str:
    """Markdown: every row by decreasing tokens/s, the front starred, then the chosen setting and its held-out
    quality."""
    lines = [
        f"Task: {result['task']}; quality: {result['quality_name']} on the development split, 95% intervals; "
        f"tokens/s: median of {result['rounds']} interleaved rounds [slowest, fastest]; on the front, speeds whose "
        f"ranges overlap (or of fewer than {RESOLVING_ROUNDS} rounds) count as equal.",
        "",
        "| front | setting | quality | 95% CI | samples | NFE / token | positions / token | tokens/s | dropped after round |",
        "| --- " * 9 + "|",
    ]
    for r in sorted(result["rows"], key=lambda r: -r["tokens_per_s"]):
        dropped = "" if r["dropped_after"] is None else str(r["dropped_after"])
        lines.append(
            f"| {'*' if r['on_front'] else ''} | `{setting_key(r['setting'])}` | {r['quality']:.3f} | "
            f"[{r['quality_ci_low']:.3f}, {r['quality_ci_high']:.3f}] | {r['samples']} | {r['nfe_per_token']:.3f} | "
            f"{r['positions_per_token']:.2f} | {r['tokens_per_s']:.0f} [{r['tokens_per_s_min']:.0f}, "
            f"{r['tokens_per_s_max']:.0f}] | {dropped} |"
        )
    lines += ["", _chosen_sentence(result), result.get("why"), _baseline_sentence(result.get("baseline"))]
    return "\n".join(line for line in lines if line is not None) + "\n"


def _chosen_sentence(result: dict) -> str:
    c, held = result["chosen"], result["held_out"]
    return (
        f"Chosen ({result['rule']}): `{setting_key(c['setting'])}` at {c['tokens_per_s']:.0f} tokens/s; held-out "
        f"quality {held['quality']:.3f} [{held['quality_ci_low']:.3f}, {held['quality_ci_high']:.3f}] from "
        f"{held['samples']} samples of the test split (selected on the development split)."
    )


def _baseline_sentence(baseline: Optional[dict]) -> Optional[str]:
    if not baseline:
        return None
    return (
        f"AR baseline: quality {baseline['quality']:.3f} [{baseline['quality_ci_low']:.3f}, "
        f"{baseline['quality_ci_high']:.3f}] at {baseline['tokens_per_s']:.0f} tokens/s "
        f"[{baseline['tokens_per_s_min']:.0f}, {baseline['tokens_per_s_max']:.0f}]."
    )


def _plot(result: dict) -> bytes:
    from ..experiments.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for on_front, colour, label in ((False, "0.6", "setting"), (True, "C0", "on the front")):
        rows = [r for r in result["rows"] if r["on_front"] == on_front and math.isfinite(r["quality"])]
        if rows:
            ax.errorbar(
                [r["tokens_per_s"] for r in rows],
                [r["quality"] for r in rows],
                yerr=[
                    [r["quality"] - r["quality_ci_low"] for r in rows],
                    [r["quality_ci_high"] - r["quality"] for r in rows],
                ],
                xerr=[
                    [r["tokens_per_s"] - r["tokens_per_s_min"] for r in rows],
                    [r["tokens_per_s_max"] - r["tokens_per_s"] for r in rows],
                ],
                fmt="o",
                color=colour,
                ms=4,
                capsize=2,
                label=label,
            )
    front = sorted(
        (r for r in result["rows"] if r["on_front"] and math.isfinite(r["quality"])), key=lambda r: r["tokens_per_s"]
    )
    ax.plot([r["tokens_per_s"] for r in front], [r["quality"] for r in front], "-", color="C0", lw=1)
    chosen = result["chosen"]
    ax.plot([chosen["tokens_per_s"]], [chosen["quality"]], "*", color="C3", ms=14, label="chosen")
    baseline = result.get("baseline")
    if baseline and math.isfinite(baseline["quality"]):
        ax.axhline(baseline["quality"], color="black", ls="--", lw=1, label="AR baseline quality")
        ax.plot([baseline["tokens_per_s"]], [baseline["quality"]], "ks", ms=6, label="AR baseline")
    ax.set(xscale="log", xlabel="tokens / s (median round; bars: range of rounds)", ylabel=result["quality_name"])
    ax.set_title("Quality against speed (bars: 95% intervals)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    return buffer.getvalue()
