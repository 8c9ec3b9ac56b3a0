"""`make gpu-check` (`hf_mdm.gpu_check`) as the CPU runs it: tiny shapes, every row of the table, the CUDA tests
skipped with their reason, the files written; on a machine without CUDA the GPU run refuses with what to do."""

from __future__ import annotations

import json

import pytest

from hf_mdm.gpu_check.__main__ import main
from hf_mdm.gpu_check.adaptive import COMPARED
from hf_mdm.gpu_check.shapes import shapes
from hf_mdm.gpu_check.table import SAMPLERS


def test_the_cpu_run_writes_every_row(tmp_path, capsys):
    assert main(["--device", "cpu", "--tiny", "--output-dir", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    table = (tmp_path / "gpu_check.md").read_text()
    out = capsys.readouterr().out
    assert table in out and out.index("gpu-check: the plan") < out.index(table)  # the plan printed before the run
    assert payload["environment"]["device"].startswith("CPU") and payload["environment"]["cuda"] is None
    assert "skipped" in payload["cuda_tests"]["summary"] and payload["cuda_tests"]["returncode"] == 0
    rows = payload["rows"]
    settings = payload["settings"]
    for shape in shapes(tiny=True):
        for batch in settings["batches"]:
            mine = [r for r in rows if r["model"] == shape.name and r["batch"] == batch]
            if shape.kind == "ar":
                assert [r["nfe"] for r in mine] == [settings["new_tokens"]] * 2  # one forward a token
            else:
                samplers = {r["sampler"] for r in mine}
                wanted = set(SAMPLERS) if batch == 1 else {n for n in SAMPLERS if n.startswith("confidence")}
                assert samplers >= {name for name in wanted if not (shape.block_causal and "dual" in name)}
                fixed = [r for r in mine if "threshold" not in r["sampler"] and "llada2" not in r["sampler"]]
                # the block-causal LLaDA2 takes its family's steps per attention block (at least the call's)
                ok = (lambda n: n >= settings["steps"]) if shape.block_causal else (lambda n: n == settings["steps"])
                assert all(ok(r["nfe"]) for r in fixed), (shape.name, fixed)
            assert all(r["tokens_per_s"] > 0 and r["ms_per_forward"] > 0 and r["note"] == "" for r in mine)
    for r in rows:  # each row beside its two limits, the ratio over the larger
        assert r["flop_limit_ms"] > 0 and r["byte_limit_ms"] > 0
        assert r["limit_ratio"] == pytest.approx(r["ms_per_forward"] / max(r["flop_limit_ms"], r["byte_limit_ms"]))
    dual = {
        r["weights"]: r
        for r in rows
        if (r["model"], r["batch"], r["sampler"]) == ("LLaDA-8B", 1, "confidence, dual cache")
    }
    assert set(dual) == {"none", "int8", "int4"} and all(r["tokens_per_s"] > 0 for r in dual.values())
    assert dual["int8"]["byte_limit_ms"] < dual["none"]["byte_limit_ms"]  # quantized weights are fewer bytes to read
    (published,) = [r for r in rows if r["sampler"] == "llada2 published loop (no cache)"]
    assert published["tokens_equal"] is True  # the exact block cache gives the published loop's tokens
    assert "| LLaDA2.0-mini | 1 | llada2 preset, exact block cache | none |" in table
    assert table.startswith("# GPU check: tiny stand-ins, not the named models' shapes\n")
    assert payload["settings"]["tiny"] is True
    assert all(p["planned"] for p in payload["plan"]["parts"]) and "| Fast-dLLM | arXiv 2505.22618 |" in table
    order = [s.name for s in shapes(tiny=True)]
    keys = [(order.index(r["model"]), r["batch"]) for r in rows]
    assert keys == sorted(keys) and len({k[0] for k in keys}) == len(order)  # run by the plan, shown by model
    (compared,) = payload["threshold_vs_confidence"]  # interleaved, the same forwards (no confidence reaches 0.9)
    assert compared["model"] == "LLaDA-8B" and compared["nfe"] == dict.fromkeys(COMPARED, settings["steps"])
    assert all(len(ms) == compared["rounds"] == 3 and min(ms) > 0 for ms in compared["ms_per_forward"].values())
    assert "| LLaDA-8B | threshold 0.9 (adaptive: depends on the weights) | " in table
    # on the CPU in float32 rows of one length batch invariantly (hf_mdm.generation_rows.batches_invariantly)
    invariance = payload["batch_invariance"]
    assert [r["model"] for r in invariance] == [s.name for s in shapes(tiny=True) if s.kind == "diffusion"]
    assert all(r["logits_equal_rows"] == r["token_equal_rows"] == r["rows"] == 8 for r in invariance)
    assert all(r["max_logit_difference"] == 0.0 for r in invariance)
    assert "| LLaDA-8B | float32 | 8 of 8 | 0 | 8 of 8 |" in table
    # joined calls (hf-mdm serve's join scheduler) against one batched call: on the CPU every joined row equal
    serving = payload["serving"]
    assert [(r["model"], r["concurrent"]) for r in serving] == [
        (m, n) for m in ("LLaDA-8B", "LLaDA2.0-mini") for n in (1, 3)
    ]
    assert all(r["rows_equal"] == r["concurrent"] and r["joined_tokens_per_s"] > 0 for r in serving)
    assert "| LLaDA2.0-mini | 3 |" in table and "3 of 3 |" in table


def test_a_time_budget_skips_rows_and_still_writes(tmp_path):
    assert main(["--device", "cpu", "--tiny", "--quick", "--output-dir", str(tmp_path), "--budget-s", "0"]) == 0
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert rows and all(r["note"] == "skipped: time budget" for r in rows)


def test_without_cuda_the_gpu_run_says_what_to_do(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        return
    assert main(["--output-dir", str(tmp_path)]) == 2
    assert "--device cpu --tiny" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_differences_are_located():
    import torch

    from hf_mdm.gpu_check.table import first_difference

    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = a.clone()
    assert first_difference(a, b) is None
    b[1, 2] = 0
    assert first_difference(a, b) == 2
    b[0, 1] = 0
    assert first_difference(a, b) == 1


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--device", "tpu"], "--device tpu: the check runs on cuda (cuda:N for another GPU) or cpu (with --tiny)"),
        (["--device", "cpu", "--tiny", "--budget-s", "-5"], "--budget-s -5: a time budget must be >= 0 seconds"),
        (["--device", "cpu"], "--device cpu without --tiny would build the released 7-8B and 16B shapes"),
    ],
)
def test_bad_arguments_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, says):
    """A device the check does not run on, a negative budget and the real shapes on the CPU: refused in one line
    that says what to change, before the CUDA tests or any model."""
    import hf_mdm.gpu_check as gpu_check

    monkeypatch.setattr(gpu_check, "run_cuda_tests", lambda *a, **k: pytest.fail("the CUDA tests ran"))
    assert main([*argv, "--output-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and says in captured.err
    assert not list(tmp_path.iterdir())
