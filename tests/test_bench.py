"""The arithmetic of `make bench` (evaluation/bench.py, evaluation/bench_measure.py) on cases computed by hand; no
timing is asserted."""

import json
import re
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
import bench  # noqa: E402
from bench_measure import Call, ForwardMeter, Series, Target, cache_positions, interleave, outside_share  # noqa: E402

from hf_mdm.generation import diffusion_generate  # noqa: E402

# prompt 4, 12 new tokens, blocks of 4 (k = 3), 6 steps (s = 2 a block): canvas L = 16. Forward by forward:
# no cache: 6 x 16 = 96; prefix: each block's first forward 16, its second from the block's start: 12, 8, 4 -> 72;
# dual: 16 then the block (4), three times -> 60; exact (block-causal): 16, 4, then per later block the block before
# it and the block (8), then the block (4) -> 16 + 4 + 12 + 12 = 44.
HAND = dict(prompt=4, new=12, block=4, steps=6)
HAND_LENGTHS = {
    None: [16] * 6,
    "prefix": [16, 12, 16, 8, 16, 4],
    "dual": [16, 4, 16, 4, 16, 4],
    "exact": [16, 4, 8, 4, 8, 4],
}


@pytest.mark.parametrize("cache, positions", [(None, 96), ("prefix", 72), ("dual", 60), ("exact", 44)])
def test_cache_positions_by_hand(cache, positions):
    assert cache_positions(cache, **HAND) == positions == sum(HAND_LENGTHS[cache])


def test_cache_positions_refuses_blocks_that_do_not_divide():
    with pytest.raises(ValueError, match="divide"):
        cache_positions("dual", prompt=4, new=10, block=4, steps=6)
    with pytest.raises(ValueError, match="unknown cache"):
        cache_positions("suffix", **HAND)


def tiny(block_size=None):
    args = Namespace(vocab=32, hidden=16, layers=1, prompt=HAND["prompt"], new_tokens=HAND["new"])
    return bench.mdm(args, block_size=block_size)


@pytest.mark.parametrize("cache", [None, "prefix", "dual", "exact"])
def test_the_hook_counts_what_the_denoiser_computes(cache):
    """The forward hook's input lengths are the hand-derived ones, and its positions the sampler's own count."""
    model = tiny(block_size=HAND["block"] if cache == "exact" else None)
    kv_cache = {"exact": "prefix", None: "none"}.get(cache, cache)
    prompt = torch.randint(0, 30, (2, HAND["prompt"]), generator=torch.Generator().manual_seed(0))
    with ForwardMeter(model) as meter:
        out = diffusion_generate(
            model,
            prompt,
            max_new_tokens=HAND["new"],
            steps=HAND["steps"],
            block_length=HAND["block"],
            kv_cache=kv_cache,
            return_dict_in_generate=True,
            **bench.GREEDY,
        )
    assert meter.lengths == HAND_LENGTHS[cache]
    assert meter.positions == out.forward_tokens == 2 * cache_positions(cache, **HAND)
    assert meter.forwards == out.nfe == HAND["steps"]
    assert 0 < meter.seconds


def test_outside_share():
    assert outside_share(2.0, 1.5) == 0.25
    assert outside_share(1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="inside <= total"):
        outside_share(1.0, 1.5)
    calls = [Call(1.0, 0.9, 1, 1), Call(2.0, 1.0, 1, 1), Call(4.0, 1.0, 1, 1)]  # shares 0.1, 0.5, 0.75
    series = Series(calls)
    assert series.outside_share == 0.5
    assert (series.min, series.median, series.forward_median) == (1.0, 2.0, 1.0)


def test_target_verdicts():
    assert Target("outside", 0.05, 0.05, at_most=True).holds
    assert not Target("outside", 0.06, 0.05, at_most=True).holds
    assert Target("measured/ideal", 0.8, 0.8, at_most=False).holds
    assert not Target("measured/ideal", 0.79, 0.8, at_most=False).holds


def test_cache_row_arithmetic():
    """measured = median over rounds of (no cache / cache); ideal = positions without / with; the target on their
    ratio. Dual cache, batch 1 on HAND: ideal 96 / 60 = 1.6; rounds 2/1, 4/1, 3/2 -> median 2; 2 / 1.6 = 1.25."""
    args = Namespace(
        **{"prompt": HAND["prompt"], "new_tokens": HAND["new"], "block": HAND["block"], "steps": HAND["steps"]},
        judge_batch=1,
        batches=[1],
    )
    plain = Series([Call(t, 0.0, 6, 96) for t in (2.0, 4.0, 3.0)])
    cached = Series([Call(t, 0.0, 6, 60) for t in (1.0, 1.0, 2.0)])
    row = bench.cache_row("dual", 1, cached, plain, "dual", args)
    assert row["target"].value == pytest.approx(1.25)
    assert row["target"].holds
    assert "2.00x / ideal 1.60x = 1.25" in row["measured"]
    slow = Series([Call(t, 0.0, 6, 60) for t in (2.0, 4.0, 3.0)])  # no gain: 1 / 1.6
    assert not bench.cache_row("dual", 1, slow, plain, "dual", args)["target"].holds
    wrong = Series([Call(1.0, 0.0, 6, 59)])
    with pytest.raises(RuntimeError, match="by hand"):
        bench.cache_row("dual", 1, wrong, plain, "dual", args)


def test_interleave_calls_every_run_once_a_round_after_warmup():
    order = []
    model = torch.nn.Linear(2, 2)
    runs = {name: (model, lambda n=name: order.append(n)) for name in ("a", "b")}
    lines = []
    series = interleave(runs, repeats=2, warmup=1, progress=lines.append)
    assert order == ["a", "b"] * 3
    assert lines == ["round 1 of 3 (warm-up)", "round 2 of 3 (timed)", "round 3 of 3 (timed)"]
    assert [len(s.calls) for s in series.values()] == [2, 2]
    with pytest.raises(ValueError, match="repeats"):
        interleave(runs, repeats=0)


def test_quick_run_prints_every_row(capsys, tmp_path):
    """Every row at each batch; the targets judged at --judge-batch only, the others marked; the cost row is
    information."""
    rows = bench.main(["--quick", "--batches", "1", "2", "--judge-batch", "2", "--json", str(tmp_path / "b.json")])
    table = capsys.readouterr().out
    cost = "forward cost per position, 8 vs 24 positions a row"
    names = [*bench.SAMPLERS, *bench.CACHES, bench.EXACT[0], "mdm forward / llama forward", cost, bench.COMPILED_ROW]
    assert [row["name"] for row in rows] == names * 2
    for name in names:
        for batch, ends in ((1, (" not judged) |",)), (2, ("| PASS |", "| FAIL |"))):
            line = next(line for line in table.splitlines() if line.startswith(f"| {name} | {batch} |"))
            assert line.endswith("| information |" if name == cost else ends), line
    numbers = json.loads((tmp_path / "b.json").read_text())
    assert [n["judged"] for n in numbers if n["name"] == "threshold 0.9"] == [False, True]
    assert "value" not in next(n for n in numbers if n["name"] == cost)
    compiled = next(line for line in table.splitlines() if line.startswith(f"| {bench.COMPILED_ROW} | 2 |"))
    assert "tokens equal" in compiled and compiled.endswith("| PASS |")
    greedy, sampled, paper = (next(r for r in rows if r["name"] == name)["series"] for name in list(bench.SAMPLERS)[:3])
    assert 0 < paper.syncs <= greedy.syncs == sampled.syncs  # fixed shapes at any temperature, the paper's sampler too


def test_targets_are_judged_at_the_judge_batch_or_the_largest():
    assert [bench.judged(Namespace(judge_batch=8, batches=[1, 8]), b) for b in (1, 8)] == [False, True]
    assert [bench.judged(Namespace(judge_batch=8, batches=[1, 4]), b) for b in (1, 4)] == [False, True]
    assert Target("x", 2.0, 1.0, True, judged=False).verdict == "(FAIL, not judged)"
    assert Target("x", 0.5, 1.0, True).verdict == "PASS"


def test_position_cost_row():
    """(short time / block) / (full time / canvas), median over rounds: rounds 1/4, 2/4, 3/4 of the full forward's
    time for 8 of 24 positions -> per position 0.5 * 3 = 1.5x."""
    args = Namespace(prompt=8, new_tokens=16, block=8)
    full = Series([Call(4.0, 0.0, 1, 24)] * 3)
    short = Series([Call(t, 0.0, 1, 8) for t in (1.0, 2.0, 3.0)])
    row = bench.position_cost_row(args, {"mdm forward": full, "mdm block-wide forward": short}, 1)
    assert row["measured"] == "1.50x" and "target" not in row


def test_batch_invariance_counts_differences_and_quick_run_writes_its_tables(tmp_path):
    import bench_invariance

    assert bench_invariance.differences(torch.tensor([[1, 2, 3], [4, 5, 6]]), [[1, 2, 3], [4, 0, 0]]) == (1, 2)
    output = tmp_path / "invariance.md"
    text = bench_invariance.main(["--quick", "--output", str(output)])
    assert output.read_text() == text
    variance = text.split("Cost of")[0]
    rows = [line.split(" | ") for line in variance.splitlines() if line.startswith(("| MDM |", "| AR ("))]
    assert len(rows) == 2 * (len(bench_invariance.SAMPLERS) + 1)
    assert all(row[-1].startswith("0 of 3") for row in rows)  # batch_invariant: every row as alone
    cost = [
        line.split(" | ") for line in text.split("Cost of")[1].splitlines() if line.startswith(("| equal", "| mixed"))
    ]
    assert len(cost) == 2 * len(bench_invariance.TARGETS)  # each case, float32 and bfloat16
    assert all(row[5].startswith("<= ") and row[5].endswith(("(met)", "(not met)")) for row in cost)


def test_lm_head_bench_quick_run_counts_rows_and_checks_tokens(tmp_path):
    """One token a step, blocks of 4, batch 2: before, 8 LM-head rows a forward; now the still-masked positions,
    (8 + 6 + 4 + 2) / 4 = 5 on average; the tokens at temperature 0 equal."""
    import bench_lm_head

    text = bench_lm_head.main(["--quick", "--output", str(tmp_path / "lm_head.md")])
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(("| LLaDA", "| Qwen"))]
    assert len(rows) == 2 * len(bench_lm_head.SETTINGS)
    assert all((row[2], row[3], row[4]) == ("8.0", "5.0", "5.0") for row in rows)
    assert all(row[-1] in ("yes |", "- |") for row in rows)


def test_quant_bench_quick_run_measures_every_family(tmp_path):
    """``make bench``'s quantization table: each family in bfloat16, int8 and int4, int8's and int4's weights smaller
    than bfloat16's, the agreements shares."""
    pytest.importorskip("torchao", reason="torchao is not installed (the quant extra)")
    import bench_quant

    text = bench_quant.main(["--quick", "--output", str(tmp_path / "quant.md")])
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ") and "|" in line[2:]]
    rows = [row for row in rows if row[1] in bench_quant.VARIANTS]
    assert len(rows) == 4 * len(bench_quant.VARIANTS)
    assert all(
        float(row[3]) < 1 and 0 <= float(row[6]) <= 1 and 0 <= float(row[7]) <= 1
        for row in rows
        if row[1] != "bfloat16"
    )


def test_peers_bench_quick_run_times_every_peer_on_equal_tokens(tmp_path):
    """``make bench``'s peer table: diffusers' LLaDA2Pipeline and transformers' DiffusionGemma generate beside
    hf_mdm's presets, every row's tokens equal to its peer's."""
    pytest.importorskip("diffusers")
    import bench_peers

    text = bench_peers.main(["--quick", "--output", str(tmp_path / "peers.md")])
    rows = [line for line in text.splitlines() if line.startswith("| LLaDA2Pipeline") or line.startswith("| Diff")]
    assert len(rows) == 10 and all(line.endswith("| yes |") for line in rows)
    assert (tmp_path / "peers.md").read_text() == text


def test_sft_memory_bench_runs_each_kind_and_its_losses_agree():
    """The SFT memory table's runs, in this process at the quick shape: hf_mdm's loss (LM head at the masked positions)
    is the loss read off every position's logits, AR's with the LM head at the scored positions is transformers',
    the mask draw masks its expected counts within the tolerance, and the table puts each run beside both AR runs."""
    import bench_sft_memory as sft

    args = sft.parse(["--quick"])
    model = sft.build("mdm", args)
    batch = sft.batch_of("mdm", args)
    with torch.no_grad():
        ours = sft.loss_of("mdm", model, batch)
        every = sft.loss_of("mdm_all_logits", model, batch)
    assert float(ours) == pytest.approx(float(every), rel=1e-5)
    draw = sft.mask_draw(args)
    scored = batch["labels"] != -100
    assert int(scored.sum()) == draw["masked"] and int(scored.sum(1).max()) == draw["longest"]
    for value, expected in [(draw["masked"], draw["expected"]), (draw["given_times"], draw["expected"])]:
        assert abs(value - expected) <= max(sft.TOLERANCE * expected, 1.0)
    assert abs(draw["longest"] - draw["expected_longest"]) <= max(sft.TOLERANCE * draw["expected_longest"], 1.0)
    ar, ar_batch = sft.build("ar", args), sft.batch_of("ar", args)
    with torch.no_grad():
        whole, at_scored = sft.loss_of("ar", ar, ar_batch), sft.loss_of("ar_scored", ar, ar_batch)
    assert float(at_scored) == pytest.approx(float(whole), rel=1e-5)
    rows = [
        dict(kind=kind, lora=lora, checkpointing=False, **sft.run_one(kind, lora, False, args))
        for lora in (False, True)
        for kind in sft.KINDS
    ]
    assert all(row["added_mb"] >= 0 and row["s_per_step"] > 0 for row in rows)
    table = sft.markdown(args, rows)
    assert table.count("| AR (Llama, transformers' loss) |") == 2
    assert table.count("| AR (Llama, LM head at the scored positions) |") == 2
    assert table.count("| MDM, hf_mdm (LM head at the masked positions) |") == 2
    assert all(line.count("|") == 10 for line in table.splitlines() if line.startswith("| MDM"))  # both AR ratios


def test_serve_bench_quick_run_writes_its_targets_and_trace(tmp_path):
    """The serving benchmark's smoke run (loopback, a tiny model): the throughput rows of both schedulers at both
    loads and the latency row, each with a verdict; the three schedulers' latencies ordered p50 <= p99 on both
    traces of both models, and the comparisons of joining with the micro-batcher."""
    import bench_serve

    text = bench_serve.main(["--quick", "--output", str(tmp_path / "serve.md")])
    targets = [
        line.split(" | ")
        for line in text.splitlines()
        if line.startswith(("| throughput", "| one request at a time, latency"))
    ]
    assert len(targets) == 5 and all(row[-1].endswith(("(met) |", "(not met) |")) for row in targets)
    names = ("| one request at a time |", "| micro-batcher |", "| joining |")
    trace = [line.split(" | ") for line in text.splitlines() if line.startswith(names)]
    assert len(trace) == 12 and all(float(row[1]) <= float(row[2]) for row in trace)
    assert len(re.findall(r"p99 [\d.]+ s against [\d.]+ s \([\d.]+x (better|worse)\)", text)) == 2
    assert len(re.findall(r"the long requests' slowest [\d.]+ s against [\d.]+ s \([\d.]+x\)", text)) == 2
    assert (tmp_path / "serve.md").read_text() == text
