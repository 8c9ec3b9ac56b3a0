"""``results/REPORT.md``: our synthetic-experiment numbers beside the paper's.

The paper's numbers are those published for arXiv 2502.09622 (Feng et al., NeurIPS 2025): the TER relative
increase of trained MDMs by sampling steps, and MDM (512 steps) vs AR wall-clock by sequence length.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .experiments.rl_report import rl_verdicts
from .experiments.speed import AR_MODEL, crossover_length, crossover_sentence
from .fileio import write_atomic
from .report_summary import report_summary
from .report_verdicts import sampler_verdicts, ser_verdicts, ter_verdicts

PAPER_TER = {  # epsilon_total in %, trained MDMs; steps 64, 128, 256, 512, 1024, 2048
    ("2-gram", 256): [2.72, 1.09, 0.27, 0.11, 0.10, 0.05],
    ("2-gram", 512): [2.72, 1.09, 0.54, 0.09, 0.05, 0.02],
    ("2-gram", 1024): [2.46, 1.09, 0.55, 0.13, 0.07, 0.02],
    ("3-gram", 256): [4.58, 1.63, 0.98, 0.33, 0.15, 0.08],
    ("3-gram", 512): [4.56, 1.95, 0.98, 0.42, 0.17, 0.09],
    ("3-gram", 1024): [4.56, 2.28, 0.98, 0.65, 0.33, 0.13],
    ("4-gram", 256): [5.26, 3.10, 1.86, 1.24, 0.93, 0.06],
    ("4-gram", 512): [5.33, 2.51, 1.25, 0.63, 0.31, 0.07],
    ("4-gram", 1024): [5.37, 2.91, 1.45, 0.84, 0.35, 0.05],
}
PAPER_TER_STEPS = [64, 128, 256, 512, 1024, 2048]
PAPER_STEPS = 512  # the MDM's steps in the paper's wall-clock
PAPER_WALLCLOCK_CLAIM = (
    "The paper (hardware not published): the MDM at 512 steps grows 3.7x and AR 51x from L = 256 to 8192, and AR is "
    "slower from about L = 2048 on. Our reading, not the paper's: its MDM's 512 forwards cost nearly the same at "
    "every L, as on a device with idle parallel units at small batch, while AR's forwards grow with L."
)
PAPER_WALLCLOCK = {  # seconds: MDM with 512 steps, AR; hardware not published
    256: (2.0, 0.9),
    512: (3.1, 1.7),
    1024: (4.2, 3.3),
    2048: (4.7, 7.0),
    4096: (4.7, 15.4),
    8192: (7.4, 45.8),
}

#: What each scale is, under the report's first line (`hf_mdm.experiments.scales`).
SCALE_TEXT = {
    "quick": """The quick scale (`make reproduce-quick`, about an hour on 2 CPU cores) scales the paper
down: shorter sequences, fewer samples, tiny models trained briefly. Each table states its languages, sampler, sample
count, model sizes and training budget. `make reproduce` runs the first-look scale (about 12 minutes, wider intervals) and
`make reproduce-paper` the paper's scale (see the section "Paper scale" at the end).""",
    "first_look": """The first-look scale (`make reproduce`, about 12 minutes on 2 CPU cores) runs every experiment
of the quick scale smaller still: fewer samples, lengths and repeats, models trained for fewer steps, the RL
experiment on one language. Its intervals are wider, so some findings the quick scale resolves are not resolved
here. Each table states its languages, sampler, sample count, model sizes and training budget. `make
reproduce-quick` runs the quick scale (the committed results/REPORT.md) and `make reproduce-paper` the paper's
scale.""",
    "full": "",
}

PAPER_TER_NOTE = (
    "The paper's table, as published (trained MDMs on n-gram languages, L = 256..1024, 2,000 samples per cell, "
    "models trained on 1,000,000 sequences for 20 epochs; its vocabulary, model sizes and schedule were not "
    "published). The same quantity as our first table (the paper's TER, TER(p)/TER(q) - 1), not the same set-up: "
    "our languages, lengths, steps, models and training are the ones stated above the tables, so compare the "
    "shapes, not the cells."
)
TER_TEXT = (
    "The paper's sampler (stochastic transfer, random order, linear schedule). Oracle rows use the exact posterior "
    "(no learning error). Two quantities under their own names: the paper's TER, 2^(E_{x~q}[-log2 p(x)/L]) (the "
    "language's sequences scored by the sampler's law p; estimated, except where a table says exact), and the "
    "generative perplexity 2^(E_{x~p}[-log2 q(x)/L]) (the sampler's samples scored by the language). Theorem 4.2 "
    "predicts that the paper's TER relative increase falls with N and does not depend on L. What the numbers show "
    "(computed from the rows; a difference is claimed only where the 95% intervals are disjoint):"
)
PAPER_WALLCLOCK_NOTE = (
    "The paper's timings, as published (MDM at 512 steps vs AR; hardware, model size and batch not published): the "
    "same quantity as our 512-step rows, seconds to generate, on other hardware, model size and batch."
)
SER_TEXT = (
    "Theorem 4.4 is an existence result: for one HMM the paper constructs, the MDM's SER stays high unless N grows "
    "with L. It predicts nothing for a random HMM such as ours, whose rows are measured here as an experiment, not "
    "as a test of the theorem; the chain language, the theorem's own 16-token construction (tokens (u, v), each next "
    "u equal to the previous v), shows the effect in closed form, 1 - (1 - 3/(4N))^(L-1) with the "
    "oracle, about exp(-3L/(4N)), so that its curves for different L nearly agree when plotted against N/L. The paper published this only as "
    "a figure (its HMM at L = 512): SER falls with steps and needs about L steps to approach AR; no number here is "
    "set beside a paper number. Our HMM: 16 hidden states, 16 tokens, each row drawn from a Dirichlet and its tail "
    "pruned (parameters in the Languages line under the figure). What the numbers show (computed from the rows; a "
    "change is claimed only where the 95% intervals are disjoint, and overlapping intervals mean not resolved, not "
    "agreement):"
)

SAMPLERS_TEXT = """Whether samplers other than the paper's (remasking, verification) avoid the
sequence-error limit of Theorem 4.4 is measured here. With the exact-posterior oracle there is no learning error: each point draws
sequences at temperature 1 in one block and is placed at its *sequential forwards per token*, the forwards one row
needs on its own (the steps or rounds in which it revealed something; a remasking step that only takes tokens back
runs no forward) over L; one token a forward (1.0) is the cost of left-to-right or AR decoding. Speculative decoding
computes several canvases per round: its canvases computed per token say what it spends in parallel. Every
comparison below is computed from the points with their 95% intervals."""


def _section(folder: Path, name: str, title: str, text: str) -> list[str]:
    if not (folder / f"{name}.md").exists():
        return [f"## {title}", "", "Not run.", ""]
    return [f"## {title}", "", text, "", f"![{title}]({name}.png)", "", (folder / f"{name}.md").read_text(), ""]


def _paper_ter_table() -> str:
    lines = [
        "| language | L | " + " | ".join(f"N={s}" for s in PAPER_TER_STEPS) + " |",
        "| --- | --- |" + " --- |" * len(PAPER_TER_STEPS),
    ]
    for (name, length), values in PAPER_TER.items():
        lines.append(f"| {name} | {length} | " + " | ".join(f"{v:.2f}%" for v in values) + " |")
    return "\n".join(lines)


def _paper_wallclock_table() -> str:
    lines = ["| L | MDM, 512 steps (s) | AR (s) | AR / MDM |", "| --- | --- | --- | --- |"]
    lines += [f"| {length} | {m} | {a} | {a / m:.2f} |" for length, (m, a) in PAPER_WALLCLOCK.items()]
    return "\n".join(lines)


def verdict_lines(folder: Path, name: str, verdicts: Callable[[dict], list[str]]) -> str:
    """The sentences ``verdicts`` computes from ``<folder>/<name>.json``, as a Markdown list (without it, a line saying
    it is missing)."""
    path = folder / f"{name}.json"
    if not path.exists():
        return f"No findings: {path} is missing (`hf-mdm reproduce --only {name}` writes it)."
    return "\n".join(f"- {line}" for line in verdicts(json.loads(path.read_text())))


def _wallclock_summary(folder: Path) -> str:
    """The MDM at the scale's first step count (the paper's 512) against AR in words: growth of each, the
    crossover, and why, beside the paper's."""
    path = folder / "wallclock.json"
    if not path.exists():
        return ""
    result = json.loads(path.read_text())
    rows = result["rows"]
    mdm_model = next(r["model"] for r in rows if r["model"].startswith("MDM, "))  # the scale's first mdm_steps
    mdm = [r for r in rows if r["model"] == mdm_model]
    steps = mdm[-1]["steps"]
    ar = [r for r in rows if r["model"] == AR_MODEL]
    first, last = mdm[0]["length"], mdm[-1]["length"]
    cost = mdm[-1]["ms_per_forward"] / mdm[0]["ms_per_forward"]
    paper = " (the paper's)" if steps == PAPER_STEPS else ""
    summary = (
        f"At N = {steps} steps{paper}, from L = {first} to {last} the MDM's time grows "
        f"{mdm[-1]['seconds'] / mdm[0]['seconds']:.1f}x and AR's {ar[-1]['seconds'] / ar[0]['seconds']:.1f}x "
        f"({result['machine']}). Time is forwards x cost per forward: AR makes L forwards of one new token, the "
        f"MDM min({steps}, L) forwards of all L tokens. Here one MDM forward costs {cost:.0f}x more at "
        f"L = {last} than at L = {first} ({mdm[0]['ms_per_forward']:.2f} -> {mdm[-1]['ms_per_forward']:.2f} "
        f"ms), one AR forward {ar[0]['ms_per_forward']:.2f} -> {ar[-1]['ms_per_forward']:.2f} ms. "
    )
    return summary + PAPER_WALLCLOCK_CLAIM + " " + _machine_against_paper(rows, mdm_model, cost)


def _machine_against_paper(rows: list[dict], mdm_model: str, cost: float) -> str:
    """Whether this machine's crossover at the paper's steps agrees with the paper's, in plain words, and where the
    other MDM settings (the equal-TER steps) cross."""
    crossover = crossover_length(rows, mdm_model)
    others = [m for m in dict.fromkeys(r["model"] for r in rows) if m not in (AR_MODEL, mdm_model)]
    rest = " ".join(f"{crossover_sentence(rows, m)}." for m in others)
    if crossover is None:
        return (
            f"This machine differs: {crossover_sentence(rows, mdm_model)} (up to L = {rows[-1]['length']}), "
            f"because here a forward's cost grows with the tokens it processes ({cost:.0f}x over the lengths "
            "measured; the paper's MDM time, 512 forwards at every L from 512 on, grew 3.7x over 32x the "
            "length), so the MDM's full-sequence forwards never become cheap against AR's one-token forwards. "
            "The other MDM settings: " + rest
        )
    return f"On this machine too, {crossover_sentence(rows, mdm_model)} (the paper: from about L = 2048). " + rest


RL_TEXT = (
    "Theorem 4.4 concerns the language's own distribution: for it, a low SER needs the steps N to grow with L. A "
    "policy fine-tuned with reinforcement learning for correctness at few steps (GRPO through TRL, reward 1 when a "
    "sample is in the language) is no longer that distribution, so the theorem does not bind it; what it gives up "
    "is measured by what the theorem leaves free: the share of distinct samples, and the paper's TER of the "
    "language's own sequences under the policy's sampler law (how much of the language the policy still covers; "
    "a rise means lost coverage). Rollouts use the paper's sampler at the N the table states, a run per seed; the "
    "trained MDM before RL and the trained AR model are beside it, each run's reward curve is in the figure, the runs "
    "that lost reward during RL are counted and named, and a KL sweep (where the scale has one) sets the SER at "
    "few steps against the share of distinct samples at several KL coefficients beta. Two log-likelihood estimators drive GRPO's ratio: `decoding` scores each "
    "token given the tokens revealed before its step under the rollouts' own sampler law, `coupled` is "
    "DiffuCoder's pair of complementary masks (their bias against the exact rollout likelihood: "
    "evaluation/RL_ESTIMATORS.md). What the numbers show (computed from the rows):"
)

BLOCKS_TEXT = (
    "Blocks of b positions decoded left to right, each in s steps of the paper's sampler (and other samplers at "
    "every b), with the exact-posterior oracle, which is a perfect block diffusion model: b = 1 is an AR order, "
    "b = L the paper's MDM. Costs on two axes: sequential forwards per token (latency) and positions computed per "
    "token with the exact block cache (compute). For the chain language the closed form "
    "1 - (1 - 3/(4s))^(L - L/b) is printed beside each measurement. Then trained models of one size: AR, the MDM "
    "and block diffusion models (block-causal attention, BD3-LM's objective) on the same data, sampled with the "
    "paper's sampler block by block, and untrained ones timed against L (AR with its KV cache, block diffusion with "
    "the exact block cache). Every sentence under the tables (the agreement with the closed form, the points no "
    "other point beats on a cost and SER, which settings reach AR's SER, at which lengths a model was faster than AR in every timed round) is "
    "computed from the rows."
)


#: The paper-scale run writes here (under the quick run's folder).
PAPER_SCALE_DIR = "full"
#: Sustained training throughputs assumed for the estimate (ours): one H100 in float32/TF32, the 2-core CPU.
GPU_FLOPS, CPU_FLOPS = 1e14, 1e11


def paper_scale_estimate(config_dir: Path = Path("evaluation") / "configs") -> dict[str, float]:
    """Training cost of the ``full:`` scales: models trained, FLOPs (6 x parameters x tokens per model, parameters
    of the transformer blocks from `model_dims`) and days at `GPU_FLOPS` and `CPU_FLOPS`; sampling is left out."""
    from .experiments import load_scale
    from .experiments.common import training_steps
    from .training import model_dims

    flops, models = 0.0, 0
    for name in ("ter_vs_steps", "ser_vs_steps"):
        _, scale = load_scale(Path(config_dir) / f"{name}.yaml", full=True)
        for spec in scale["languages"]:
            if spec.get("train", False):
                cfg = {**scale["training"], **spec.get("training", {})}
                dims = model_dims(cfg["size"])
                h, i = dims["hidden_size"], dims["intermediate_size"]
                params = dims["num_hidden_layers"] * (4 * h * h + 3 * h * i)
                for kind in ("mdm", "ar"):
                    tokens = training_steps(cfg, kind) * cfg["batch_size"] * scale["train_length"]
                    flops += 6 * params * tokens
                    models += 1
    day = 86_400
    return {"models": models, "flops": flops, "gpu_days": flops / GPU_FLOPS / day, "cpu_days": flops / CPU_FLOPS / day}


def paper_scale_text() -> str:
    estimate = paper_scale_estimate()
    return (
        "`make reproduce-paper` (or `hf-mdm reproduce --full --output-dir results/full`) runs every experiment with "
        "the `full:` scales of evaluation/configs: the paper's lengths (L = 256..1024 for TER, up to 8192 for "
        "wall-clock), 2,000 samples per cell, models trained on 1,000,000 sequences (our `paper` model size: the "
        f"paper did not publish its own). Our estimate of its training alone: {estimate['models']} models, "
        f"{estimate['flops']:.1e} FLOPs (6 x parameters x tokens), about {estimate['gpu_days']:.0f} days on one GPU "
        f"at a sustained {GPU_FLOPS:.0e} FLOP/s and about {estimate['cpu_days'] / 365:.0f} years on the quick "
        f"scale's 2-core CPU at {CPU_FLOPS:.0e} FLOP/s (both throughputs are our assumptions), so it is not run on "
        "a CPU. Its report is written to `results/full/REPORT.md`."
    )


def _paper_scale(folder: Path, full: bool) -> list[str]:
    """The paper-scale section of the quick report: a link to the full run's report when present."""
    if full:
        return []
    report = folder / PAPER_SCALE_DIR / "REPORT.md"
    status = (
        f"Results present: [{PAPER_SCALE_DIR}/REPORT.md]({PAPER_SCALE_DIR}/REPORT.md)."
        if report.exists()
        else "Not run here: no `results/full/REPORT.md`."
    )
    return ["## Paper scale", "", paper_scale_text(), "", status, ""]


def write_report(folder: Path, full: bool = False, scale_name: str = "") -> Path:
    """``<folder>/REPORT.md`` from the experiments' outputs there, for ``scale_name`` (else full or quick)."""
    folder = Path(folder)
    scale_name = scale_name or ("full" if full else "quick")
    full = scale_name == "full"
    lines = [
        "# Reproduction report",
        "",
        "Our numbers for the synthetic experiments of *Theoretical Benefit and Limitation of Diffusion Language "
        "Model* (Feng et al., NeurIPS 2025, arXiv 2502.09622), beside the paper's where it published them.",
        "",
        "Scale: " + ("full (the paper's scale)." if full else f"{scale_name}."),
        "",
        SCALE_TEXT[scale_name],
        "",
        report_summary(folder),
    ]
    ter_text = TER_TEXT + "\n\n" + verdict_lines(folder, "ter_vs_steps", ter_verdicts)
    lines += _section(folder, "ter_vs_steps", "The paper's TER vs steps (Theorem 4.2)", ter_text)
    lines += [PAPER_TER_NOTE, "", _paper_ter_table(), ""]
    ser_text = SER_TEXT + "\n\n" + verdict_lines(folder, "ser_vs_steps", ser_verdicts)
    lines += _section(folder, "ser_vs_steps", "Sequence error rate vs steps (Theorem 4.4)", ser_text)
    samplers_text = SAMPLERS_TEXT + "\n\n" + verdict_lines(folder, "samplers", sampler_verdicts)
    lines += _section(folder, "samplers", "Beyond Theorem 4.4: samplers at equal sequential forwards", samplers_text)
    lines += _section(folder, "block_diffusion", "Block diffusion: the block size between AR and MDM", BLOCKS_TEXT)
    rl_text = RL_TEXT + "\n\n" + verdict_lines(folder, "rl", rl_verdicts)
    lines += _section(
        folder, "rl", "Reinforcement learning for few-step correctness: what it costs (Theorem 4.4)", rl_text
    )
    lines += _section(
        folder, "wallclock", "Wall-clock: MDM at fixed steps vs AR with a KV cache", _wallclock_summary(folder)
    )
    lines += [PAPER_WALLCLOCK_NOTE, "", _paper_wallclock_table(), ""]
    lines += _paper_scale(folder, full)
    path = folder / "REPORT.md"
    write_atomic(path, "\n".join(lines))
    return path
