"""Experiment c: MDM vs AR wall-clock as the sequence length grows, as forwards x cost per forward.

``wallclock`` times one batch at each length L of ``scale["lengths"]``: the same-size AR model (Llama) decoding
with its KV cache (L forwards of one new token each), and the MDM at each step count of ``scale["mdm_steps"]``
(the paper's 512) and at N chosen *per L* from the paper's TER at that L (`steps_per_length`): the smallest N
whose TER relative increase is within ``ter_target`` of the optimum, from the chain language's closed form (exact,
every L) and, with ``steps_from``, from the oracle's measured TER in that experiment's results (upper 95% bound
within the target; only at the lengths it measured: an L without a measurement is not timed). The MDM does
min(N, L) forwards of the whole sequence (steps that would reveal nothing are skipped). With
``dual_cache_blocks``, every MDM setting is timed again with Fast-dLLM's dual KV cache in that many blocks
(``hf_mdm.kv_cache``). The models are untrained: the time does not depend on the weights.

At each L every setting runs once untimed (warm-up), then ``repeats`` rounds time each setting once in turn
(interleaved, so a slow spell of a shared machine hits them alike); a row holds the median seconds
(``hf_mdm.timer.Stopwatch``, the device synchronised at both ends), the forwards of one run (counted by a forward
hook, with the positions they computed) and the milliseconds per forward (their quotient), so a crossover reads as
forwards x cost per forward; every row also gives its costs per token on the axes of the other tables: sequential
forwards, positions computed and wall milliseconds.
Writes ``wallclock.{json,md,png}``; cells are cached in ``<out>/cache/wallclock.json`` keyed on L, the batch
size, the settings and the device type.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ..generation import diffusion_generate
from ..languages import ChainLanguage
from ..timer import Stopwatch, interleaved_times
from .common import CellCache, experiment_result, scale_of, write_outputs
from .plotting import pyplot, save_figure

AR_MODEL = "AR, KV cache"
#: The source of the exact per-length steps.
CHAIN_SOURCE = "chain (closed form, exact)"


@torch.no_grad()
def wallclock(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``scale`` and write its outputs into ``out``; returns the JSON dict."""
    cache = CellCache(out / "cache" / "wallclock.json")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mdm, ar = untrained_models(scale, device)
    chosen = steps_per_length(scale, out)
    settings = mdm_settings(scale, chosen)
    rows: list[dict] = []
    for length in tqdm(scale["lengths"], desc="wall-clock", leave=False):
        rows += timing_rows(mdm, ar, length, scale, settings, cache, device)
    parameters = {"mdm": sum(p.numel() for p in mdm.parameters()), "ar": sum(p.numel() for p in ar.parameters())}
    crossovers = {s["model"]: crossover_length(rows, s["model"]) for s in settings}
    result = experiment_result(
        "wallclock", scale, rows, crossover_length=crossovers, parameters=parameters, steps_per_length=chosen
    )
    write_outputs(out, "wallclock", result, wallclock_table(result), lambda p: plot_wallclock(rows, p))
    return result


def untrained_models(scale: dict, device: torch.device) -> tuple[Any, Any]:
    """The MDM and the AR model of ``scale["size"]`` for the longest length, seeded, on ``device``, in eval mode."""
    from transformers import LlamaForCausalLM

    from .. import MDMForMaskedDiffusion
    from ..training import ar_config_for, mdm_config_for

    vocab, longest = scale["vocab_size"], max(scale["lengths"])
    torch.manual_seed(0)
    mdm = MDMForMaskedDiffusion(mdm_config_for(vocab, longest, scale["size"])).to(device).eval()
    ar = LlamaForCausalLM(ar_config_for(vocab, longest, scale["size"])).to(device).eval()
    return mdm, ar


def steps_per_length(scale: dict, out: Path) -> dict[str, dict]:
    """``{source: {"L": N, ...}}``: per length, the smallest N whose paper TER relative increase is within
    ``scale["ter_target"]``: ``chain (closed form, exact)`` at every L of the scale, and (with ``steps_from``) the
    oracle's measured TER per language of that experiment's JSON, upper 95% bound within the target, at the lengths
    it measured (where no N measured qualifies, the length is left out). Keys are strings (JSON)."""
    target = scale.get("ter_target")
    if target is None:
        return {}
    chain = {str(length): chain_steps(length, target) for length in scale["lengths"]}
    chosen = {CHAIN_SOURCE: chain}
    path = out / f"{scale['steps_from']}.json" if scale.get("steps_from") else None
    if path is not None and path.exists():
        rows = [r for r in json.loads(path.read_text())["rows"] if r["model"] == "oracle MDM" and "ter_ci_high" in r]
        for name in dict.fromkeys(r["language"] for r in rows):
            found = {}
            for r in sorted((r for r in rows if r["language"] == name), key=lambda r: r["steps"]):
                if r["ter_ci_high"] <= target and str(r["length"]) not in found:
                    found[str(r["length"])] = r["steps"]
            chosen[f"{name} oracle (measured, n = {rows[0]['ter_num_sequences']})"] = found
    return chosen


def chain_steps(length: int, target: float) -> int:
    """The smallest N with ``ChainLanguage.predicted_ter_increase(length, N) <= target`` (it falls with N)."""
    low, high = 1, 1
    while ChainLanguage.predicted_ter_increase(length, high) > target:
        low, high = high + 1, 2 * high
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if ChainLanguage.predicted_ter_increase(length, mid) > target else (low, mid)
    return low


def mdm_settings(scale: dict, chosen: dict[str, dict]) -> list[dict]:
    """The MDM settings to time: ``{"model": label, "steps": {L: N}, "dual": bool}``, each step count of
    ``scale["mdm_steps"]`` (the same N at every L) and each per-length choice of ``chosen``, then each again with
    the dual cache (``dual_cache_blocks``)."""
    lengths = [str(length) for length in scale["lengths"]]
    plain = [
        {"model": f"MDM, {n} steps", "steps": dict.fromkeys(lengths, n), "dual": False} for n in scale["mdm_steps"]
    ]
    target = scale.get("ter_target")
    for source, steps in chosen.items():
        label = f"MDM, N from the paper's sampler's TER within {100 * target:g}% ({source})"
        plain.append({"model": label, "steps": steps, "dual": False})
    blocks = scale.get("dual_cache_blocks")
    dual = (
        [{**s, "model": s["model"].replace("MDM", f"MDM + dual cache ({blocks} blocks)"), "dual": True} for s in plain]
        if blocks
        else []
    )
    return plain + dual


def timing_rows(
    mdm: Any, ar: Any, length: int, scale: dict, settings: list[dict], cache: CellCache, device: torch.device
) -> list[dict]:
    """One row per model at one length: AR first, then each MDM setting with an N at this length, timed together
    (`timed_together`: warm-up, interleaved repeats, medians)."""
    vocab, batch, blocks = scale["vocab_size"], scale["batch_size"], scale["dual_cache_blocks"]
    prompt = torch.zeros(batch, 0, dtype=torch.long, device=device)
    run_ar = ar_run(ar, length, vocab, batch, device)

    def run_mdm(steps: int, dual: bool) -> Callable[[], None]:
        cached = {"block_length": -(-length // blocks), "kv_cache": "dual"} if dual else {}
        return lambda: diffusion_generate(
            mdm,
            prompt,
            max_new_tokens=length,
            steps=steps,
            transfer="deterministic",
            strategy="confidence",
            stop_at_eos=False,
            **cached,
        )

    here = [s for s in settings if str(length) in s["steps"]]
    runs = {AR_MODEL: (run_ar, ar, length)}
    for s in here:
        steps = s["steps"][str(length)]
        runs[s["model"]] = (run_mdm(steps, s["dual"]), mdm, steps)
    described = json.dumps([[name, steps] for name, (_, _, steps) in runs.items()])
    digest = hashlib.sha1(described.encode()).hexdigest()[:10]
    key = f"v3|{length}|{batch}|{device.type}|{scale['repeats']}|{digest}"
    cells = cache.get(key, lambda: timed_together(runs, scale["repeats"], device))
    return [row(name, length, runs[name][2], cell, batch) for name, cell in cells.items()]


def ar_run(ar: Any, length: int, vocab: int, batch: int, device: torch.device) -> Callable[[], Any]:
    """AR decoding of ``length`` tokens for ``batch`` rows from BOS (id ``vocab``), greedy, with its KV cache."""
    bos = torch.full((batch, 1), vocab, dtype=torch.long, device=device)
    return lambda: ar.generate(
        bos,
        attention_mask=torch.ones_like(bos),
        max_new_tokens=length,
        min_new_tokens=length,
        do_sample=False,
        use_cache=True,
        pad_token_id=vocab,
        eos_token_id=None,
    )


def row(model: str, length: int, steps: int, cell: dict, batch: int) -> dict:
    """A timing row: the cell, the milliseconds per forward, and the costs per token generated (``batch`` x L)."""
    return {
        "length": length,
        "model": model,
        "steps": steps,
        **cell,
        "ms_per_forward": 1000 * cell["seconds"] / cell["forwards"],
        "forwards_per_token": cell["forwards"] / length,
        "positions_per_token": cell["positions"] / (batch * length),
        "ms_per_token": 1000 * cell["seconds"] / (batch * length),
    }


def timed_together(runs: dict[str, tuple], repeats: int, device: torch.device) -> dict[str, dict]:
    """``{name: {"seconds": median, "seconds_min", "seconds_max", "repeats", "forwards": per run, "positions": per
    run}}`` for ``runs`` (name -> (fn, model, steps)): each run once untimed with its forwards and the positions they
    computed (batch x input length) counted, then ``repeats`` rounds timing each in turn."""
    counts = {}
    for name, (fn, model, _) in runs.items():
        calls: list[int] = []

        def count(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
            calls.append(int(ids.shape[0] * ids.shape[1]))

        hook = model.register_forward_hook(count, with_kwargs=True)
        try:
            fn()  # warm-up: allocations, kernels and caches are set up before any timed run
        finally:
            hook.remove()
        counts[name] = {"forwards": len(calls), "positions": sum(calls)}
    times = interleaved_times({name: fn for name, (fn, _, _) in runs.items()}, repeats, device, warmup=0)
    return {name: {**spread(times[name]), **counts[name]} for name in runs}


def spread(seconds: list[float]) -> dict[str, float]:
    """The median of timed rounds with their range and count: what every timing sentence states."""
    return {
        "seconds": statistics.median(seconds),
        "seconds_min": min(seconds),
        "seconds_max": max(seconds),
        "repeats": len(seconds),
    }


def median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """The median wall-clock of ``repeats`` calls of ``fn``, each timed by a ``Stopwatch`` on ``device``."""
    times = []
    for _ in range(repeats):
        with Stopwatch(device) as watch:
            fn()
        times.append(watch.seconds)
    return statistics.median(times)


def ratio_over(ar: dict, row: dict) -> tuple[float, float, float]:
    """AR seconds / ``row``'s seconds at one length: the medians' ratio and its range over the timed rounds (AR's
    fastest round over the row's slowest, AR's slowest over its fastest; the median alone for rows without a
    range). AR is slower in every round where the low end is above 1: the one rule every timing sentence uses."""
    low = ar.get("seconds_min", ar["seconds"]) / row.get("seconds_max", row["seconds"])
    high = ar.get("seconds_max", ar["seconds"]) / row.get("seconds_min", row["seconds"])
    return ar["seconds"] / row["seconds"], low, high


def ar_over(rows: list[dict], model: str, ar_model: str = AR_MODEL) -> dict[int, tuple[float, float, float]]:
    """``{L: ratio_over(AR's row, model's row)}`` for each length where both were timed."""
    ar = {r["length"]: r for r in rows if r["model"] == ar_model}
    return {r["length"]: ratio_over(ar[r["length"]], r) for r in rows if r["model"] == model}


def crossover_length(rows: list[dict], model: str) -> Optional[int]:
    """The length from which AR is slower than ``model`` in every round (at that L and every longer one measured),
    or None when it is not at the longest L."""
    crossover = None
    for length, (_, low, _) in sorted(ar_over(rows, model).items()):
        crossover = (crossover or length) if low > 1 else None
    return crossover


def crossover_sentence(rows: list[dict], model: str) -> str:
    """Where AR is slower than ``model`` in every timed round, in words, with the medians' ratios and ranges."""
    ratios = sorted(ar_over(rows, model).items())
    slower = [length for length, (_, low, _) in ratios if low > 1]
    crossover = crossover_length(rows, model)
    described = ", ".join(f"{m:.2f}x [{lo:.2f}, {hi:.2f}] at L = {n}" for n, (m, lo, hi) in ratios)
    if crossover is not None:
        verdict = (
            f"AR is slower than the {model} in every round at every L measured from {crossover} to {ratios[-1][0]}"
        )
    elif slower:
        verdict = f"AR is slower than the {model} in every round only at L = {', '.join(map(str, slower))}"
    else:
        verdict = f"AR is slower than the {model} in every round at no L measured"
    return f"{verdict} (AR seconds / its seconds, median and range of the rounds: {described})"


def steps_sentence(chosen: dict[str, dict], target: Optional[float]) -> str:
    """Where the per-length steps come from, in words, with the N chosen at each L."""
    if not chosen:
        return "No `ter_target` in the scale: the MDM is timed at fixed step counts only."
    parts = []
    for source, steps in chosen.items():
        ordered = sorted(steps.items(), key=lambda item: int(item[0]))
        listed = ", ".join(f"L = {length}: N = {n}" for length, n in ordered) or "no length measured qualifies"
        parts.append(f"{source}: {listed}")
    return (
        f"Per-length steps: the smallest N whose paper TER relative increase TER(p)/TER(q) - 1 is within "
        f"{100 * target:g}% (for a measured source: the upper end of its 95% interval), chosen at each L from the TER "
        f"at that L ({'; '.join(parts)}). A length without such an N is not timed for that source."
    )


def size_sentence(result: dict) -> str:
    """Why these times are not the paper's, in words: the model size, batch and machine."""
    scale = scale_of(result)
    return (
        f"Absolute times are not comparable with the paper's: these are untrained `{scale['size']}` models "
        f"({result['parameters']['mdm']:,} / {result['parameters']['ar']:,} parameters, MDM / AR; the paper published "
        f"neither its model size nor its hardware) at batch {scale['batch_size']} on {result['machine']}. At this "
        "size a forward's fixed overhead weighs more than its arithmetic, and on a CPU a forward's cost grows with "
        "the positions it computes, so the shape against L, read as forwards x cost per forward, is what compares."
    )


def wallclock_table(result: dict) -> str:
    """Markdown: each model's steps, forwards, milliseconds per forward and seconds per batch at each L, then the
    set-up, the per-length steps, the model size and the crossovers in words."""
    scale, rows = scale_of(result), result["rows"]
    lines = [
        "| L | model | steps | sequential forwards / token | positions computed / token | wall ms / token "
        "| ms / forward | seconds, median [min, max] | AR / model |",
        "| --- " * 9 + "|",
    ]
    ar = {r["length"]: r["seconds"] for r in rows if r["model"] == AR_MODEL}
    for r in rows:
        ratio = "" if r["model"] == AR_MODEL else f"{ar[r['length']] / r['seconds']:.2f}"
        lines.append(
            f"| {r['length']} | {r['model']} | {r['steps']} | {r['forwards_per_token']:.3f} | "
            f"{r['positions_per_token']:.2f} | {r['ms_per_token']:.3f} | {r['ms_per_forward']:.2f} | "
            f"{r['seconds']:.3f} [{r.get('seconds_min', r['seconds']):.3f}, {r.get('seconds_max', r['seconds']):.3f}] "
            f"| {ratio} |"
        )
    models = list(dict.fromkeys(r["model"] for r in rows if r["model"] != AR_MODEL))
    lines += [
        "",
        f"{scale['vocab_size']} tokens, batch {scale['batch_size']}; at each L every setting ran once untimed "
        f"(warm-up), then {scale['repeats']} interleaved rounds timed each once: medians with the range of the "
        "rounds. Every MDM row samples with deterministic transfer in confidence order (argmax), AR decodes "
        "greedily; forwards are counted per run. A row whose N comes from a TER target takes N from the *paper's* "
        "sampler (stochastic transfer, random order), whose TER was measured; the timed sampler is another one "
        "(deterministic: its paper TER is infinite), and no TER was measured with the dual cache. These rows time "
        "a step count, not a quality. Each length is timed in its own interleaved rounds: ratios within a length "
        "share a time window, growth across lengths compares different windows.",
        "",
        steps_sentence(result.get("steps_per_length") or {}, scale.get("ter_target")),
        "",
        size_sentence(result),
        "",
    ]
    lines += [f"- {crossover_sentence(rows, m)}." for m in models]
    return "\n".join(lines) + "\n"


def plot_wallclock(rows: list[dict], path: Path) -> None:
    """Two log-log panels against L, one line per model: seconds per batch (error bars: the range of the timed
    rounds), and milliseconds per forward; the legend below the panels."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    legend_inches = 0.3 + 0.16 * len(models)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8 + legend_inches))
    palette = plt.get_cmap("tab20").colors  # 20 colours: no two of a run's series share one; AR in black
    others = iter(palette[i % len(palette)] for i in range(len(models)))
    for model in models:
        own = [r for r in rows if r["model"] == model]
        style = "-s" if model == AR_MODEL else ("--^" if "dual" in model else "-o")
        colour = "black" if model == AR_MODEL else next(others)
        xs = [r["length"] for r in own]
        spread = [
            [r["seconds"] - r.get("seconds_min", r["seconds"]) for r in own],
            [r.get("seconds_max", r["seconds"]) - r["seconds"] for r in own],
        ]
        axes[0].errorbar(
            xs, [r["seconds"] for r in own], yerr=spread, fmt=style, color=colour, label=model, ms=4, capsize=2
        )
        axes[1].plot(xs, [r["ms_per_forward"] for r in own], style, color=colour, ms=4)
    axes[0].set(ylabel="seconds per batch", title="Wall-clock vs L (bars: range of rounds)")
    axes[1].set(ylabel="ms per forward", title="Cost of one forward vs L")
    for ax in axes:
        ax.set(xscale="log", yscale="log", xlabel="sequence length L")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=7, frameon=False)
    save_figure(fig, path, bottom=legend_inches / (3.8 + legend_inches))
