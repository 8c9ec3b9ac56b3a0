"""`make gpu-check`'s plan (`hf_mdm.gpu_check.schedule`) and the limits its rows are set against
(`hf_mdm.gpu_check.limits`), on the CPU: the plan of the real shapes fits 8 minutes by its measured and estimated
costs, keeps every model's batch-1 and batch-32 rows, then the target rows (LLaDA-8B's CUDA graphs at batch 1), and
runs the other costly rows last; the limits' arithmetic by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_mdm.gpu_check import execute
from hf_mdm.gpu_check.limits import ModelSize, Work, forward_work, limit_ratio, limits_ms, model_size, positions
from hf_mdm.gpu_check.schedule import BUDGET_S, MEASURED, TARGET_MODEL, plan
from hf_mdm.gpu_check.shapes import shapes
from hf_mdm.gpu_check.table import Settings, table_rows

RESULTS = Path(__file__).resolve().parents[2] / "results" / "gpu"


def test_the_plan_fits_eight_minutes_with_every_models_rows_and_the_costly_ones_last():
    settings = Settings("cuda", torch.bfloat16)
    schedule = plan(shapes(), settings, cuda=True)
    assert BUDGET_S == 480 and 0 < schedule.total_s <= BUDGET_S
    assert sum(e.seconds for e in schedule.entries) > BUDGET_S  # so the plan had to leave parts out, and names them
    planned = {(e.item.spec.model, e.item.spec.batch, e.item.spec.sampler, e.item.spec.weights) for e in schedule.planned if e.item.spec}  # fmt: skip
    for shape in shapes():
        for batch in (1, 32):
            eager = [s for s in table_rows(shape, batch, cuda=True) if not s.compiled]
            assert eager and {(s.model, s.batch, s.sampler, s.weights) for s in eager} <= planned, (shape.name, batch)
    for weights in ("int8", "int4"):
        assert ("LLaDA-8B", 1, "confidence, dual cache", weights) in planned
    target = [e.item.costly and e.item.model == TARGET_MODEL and e.item.spec.batch == 1 for e in schedule.entries]
    kinds = [("target" if t else "costly" if e.item.costly else e.item.kind) for t, e in zip(target, schedule.entries)]
    first_target, first_costly = kinds.index("target"), kinds.index("costly")
    assert set(kinds[:first_target]) == {
        "row",
        "adaptive",
    }  # every eager row first, then the target rows, cheap work after
    # threshold against confidence, interleaved, right after LLaDA-8B's batch-1 rows (its model still built), planned
    (at,) = [n for n, e in enumerate(schedule.entries) if e.item.kind == "adaptive"]
    before, after = schedule.entries[at - 1].item, schedule.entries[at + 1].item
    assert schedule.entries[at].planned and schedule.entries[at].item.model == before.model == TARGET_MODEL
    assert before.spec.batch == 1 and after.model != TARGET_MODEL
    assert kinds[first_target:].count("target") == kinds.count("target") >= 3
    assert all(k in ("costly", "cuda tests") for k in kinds[first_costly:])  # nothing cheap after the other costly
    assert kinds.count("costly") >= 12
    reached = {e.item.spec.sampler for e in schedule.planned if e.item.costly and e.item.model == TARGET_MODEL}
    assert {"confidence, no cache, CUDA graphs", "confidence, dual cache, CUDA graphs"} <= reached
    for e in schedule.entries:  # measured where results/gpu timed the row, an estimate otherwise, and said
        spec = e.item.spec
        measured = spec is not None and spec.weights == "none" and spec.batch == 1 and (spec.model, spec.sampler) in MEASURED  # fmt: skip
        assert e.basis.startswith("measured") == measured and e.seconds > 0
    lines = schedule.lines()
    assert f"of a {BUDGET_S:.0f} s budget" in lines[0] and sum("no: past the budget" in line for line in lines) == len(
        schedule.dropped
    )


def test_one_models_plan_reaches_its_costly_rows():
    """With one model the budget reaches its CUDA-graph rows, batch 1 first, compiled on a model kept built."""
    schedule = plan(shapes(names=["LLaDA-8B"]), Settings("cuda", torch.bfloat16), cuda=True)
    costly = [e for e in schedule.planned if e.item.costly]
    assert costly and costly[0].item.spec.batch == 1 and schedule.total_s <= BUDGET_S
    assert "confidence, dual cache, CUDA graphs" in {e.item.spec.sampler for e in costly}


def test_measured_costs_are_those_of_results_gpu():
    rows = [r for name in ("gpu_check.json", "gpu_check_second_run.json") for r in json.loads((RESULTS / name).read_text())["rows"]]  # fmt: skip
    timed = {(r["model"], r["sampler"]): r["ms_per_forward"] for r in rows if r["batch"] == 1 and r["ms_per_forward"]}
    assert {key: round(ms, 2) for key, ms in timed.items()} == MEASURED


def test_forward_work_by_hand():
    size = ModelSize(
        parameters=1000, computed_parameters=800, weight_bytes=2000, layers=2, attention_width=8, kv_width=4
    )
    work = forward_work(size, batch=3, computed=5, attended=7)
    assert work.flops == 2 * 800 * 3 * 5 + 4 * 2 * 8 * 3 * 5 * 7  # 24,000 + 6,720
    assert work.bytes == 2000 + 2 * 2 * 4 * 3 * 7 * 2  # weights + keys and values, bfloat16
    assert limits_ms(Work(790e9, 4.8e9)) == pytest.approx((1.0, 1.0))  # a GFLOP-ms and a 4.8 GB-ms
    assert limit_ratio(3.0, Work(790e9, 2.4e9)) == pytest.approx(3.0) and limit_ratio(None, work) is None
    # prompt 4 + 8 new tokens, blocks of 4, 2 steps a block: a block's first forward computes all 12 positions
    assert positions("none", 4, 8, 4, 4) == (12.0, 12.0)
    assert positions("prefix", 4, 8, 4, 4) == ((12 + 8 + 12 + 4) / 4, 12.0)  # then from the block on: 8, then 4
    assert positions("dual", 4, 8, 4, 4) == ((12 + 4 + 12 + 4) / 4, 12.0)  # then the block alone
    with pytest.raises(ValueError, match="unknown cache 'x'"):
        positions("x", 4, 8, 4, 4)


def test_model_size_counts_a_tiny_llama_and_a_tiny_mixture_of_experts_by_hand():
    (llama,) = shapes(tiny=True, names=["Llama-3-8B"])
    size = model_size(llama.build(torch.bfloat16, "meta"))  # hidden 64, 2 layers, 4 heads of 16, 2 kv heads, mlp 128
    embedding, layer = 512 * 64, 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert size.parameters == 2 * embedding + 2 * layer + 64  # untied LM head, final norm
    assert size.computed_parameters == size.parameters - embedding  # the input embeddings are a lookup
    assert (size.layers, size.attention_width, size.kv_width, size.weight_bytes) == (2, 64, 32, 2 * size.parameters)
    (moe,) = shapes(tiny=True, names=["LLaDA2.0-mini"])
    size = model_size(moe.build(torch.bfloat16, "meta"))  # 4 routed experts of width 32, 2 a token, in layer 1
    routed = 4 * (2 * 32) * 64 + 4 * 64 * 32
    assert size.parameters - size.computed_parameters == 512 * 64 + routed // 2


def test_parts_left_out_of_the_plan_are_named_and_nothing_runs(monkeypatch):
    import hf_mdm.gpu_check as gpu_check

    monkeypatch.setattr(gpu_check, "run_cuda_tests", lambda *a, **k: pytest.fail("the CUDA tests ran"))
    tiny = shapes(tiny=True)
    settings = Settings("cpu", torch.float32, batches=(1,))
    schedule = plan(tiny, settings, cuda=False, budget_s=0.5, cost=lambda item, builds: (1.0, "test"))
    assert not schedule.planned and schedule.total_s == 0
    done = execute(schedule, tiny, settings, cuda=False)
    assert done["rows"] and all(r.note == "skipped: not in the plan (past the budget)" for r in done["rows"])
    assert done["tests"]["summary"] == "not run: not in the plan (past the budget)" and not done["invariance"]
    assert {r.note for r in done["serving"]} == {"skipped: not in the plan (past the budget)"}
