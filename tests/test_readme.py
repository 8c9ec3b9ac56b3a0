"""The README's tour runs as written, offline, against tiny local models.

- its ```python blocks, in order, in one fresh process (the Hub checkpoint the LLaDA block names is a tiny LLaDA in
  the published format, in a local Hub cache; the Hub itself is offline);
- its shell commands: the synthetic pipeline through ``hf_mdm.cli.main`` with the sizes scaled down (fewer
  training sequences and steps) and the Hub upload's network calls mocked; the tiny-model evaluation block through
  bash as written, with ``/path/to/data`` the real benchmark folder. The block's `accelerate launch` line runs in
  `tests/test_harness_cli.py` (two processes) and `hf-mdm compare` on the tiny config there too (with a lower limit);
  the lines naming 8B Hub checkpoints are not run.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from huggingface_hub import HfApi
from test_harness_presets import write_checkpoint  # noqa: E402

from hf_mdm import cli
from hf_mdm.harness.tiny import build_tokenizer

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DATA_DIR = os.environ.setdefault("HF_MDM_DATA_DIR", str(REPO.parent / "shared" / "data"))
BIN = Path(sys.executable).parent
SCALED = {
    "--num-train 20000": "--num-train 256 --num-validation 64 --num-test 16",
    "--max-steps 600": "--max-steps 2 --batch-size 16 --save-steps 2 --warmup-steps 0",
}
CHECKS = """
import json, math
print("README-CHECKS", json.dumps({
    "loss": float(loss), "nfe": out.nfe, "sequences": list(out.sequences.shape), "llada": type(model).__name__,
    "samples": list(samples.shape), "train_rows": dataset["train"].num_rows,
    "gen_ppl": GenerativePerplexity().compute(predictions=samples.tolist(), language=language)["generative_perplexity"],
}))
"""


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def commands(block: str) -> list[str]:
    """The block's command lines (continuations joined, comments dropped)."""
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("  #")[0].strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A Hub cache holding a tiny LLaDA-8B-Base (published config keys and tensor names) at revision main."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--GSAI-ML--LLaDA-8B-Base"
    revision = "0" * 40
    write_checkpoint(repo / "snapshots" / revision, "llada", build_tokenizer())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return cache


def runnable_python_blocks() -> list[str]:
    """The README's python blocks; without diffusers (the ``peers`` extra, absent at the lowest versions) the
    blocks that import it are left out (their own test skips with the reason)."""
    import importlib.util

    have_diffusers = importlib.util.find_spec("diffusers") is not None
    return [block for block in blocks("python") if have_diffusers or "diffusers import" not in block]


def test_python_blocks_run_as_written(hub_cache, tmp_path):
    code = "\n".join(runnable_python_blocks()) + CHECKS
    env = dict(
        os.environ,
        HF_HUB_CACHE=str(hub_cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "datasets"),
        OMP_NUM_THREADS="1",
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500
    )
    assert result.returncode == 0, result.stderr[-4000:]
    checks = json.loads(result.stdout.split("README-CHECKS", 1)[1])
    assert checks["nfe"] == 16 and checks["sequences"] == [1, 35] and checks["loss"] > 0
    assert checks["llada"] == "LLaDAModelLM" and checks["samples"] == [256, 32] and checks["train_rows"] == 20_000
    assert checks["gen_ppl"] > 1.0  # the oracle's samples are in the support (no pruning): a finite perplexity


def test_synthetic_pipeline_commands(tmp_path, monkeypatch, capsys):
    (pipeline,) = [b for b in blocks("bash") if "hf-mdm dataset build" in b and "hf-mdm tune" not in b]
    monkeypatch.chdir(tmp_path)
    printed = {}
    with mock.patch.object(HfApi, "create_repo"), mock.patch.object(HfApi, "create_commit") as commit:
        for line in commands(pipeline):
            for written, scaled in SCALED.items():
                line = line.replace(written, scaled)
            argv = shlex.split(line)
            assert argv[0] == "hf-mdm" and cli.main(argv[1:]) == 0, line
            printed[argv[1]] = capsys.readouterr().out
    assert commit.call_args.kwargs["repo_id"] == "you/mdm-ngram2"
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert len(samples["samples"]) == 256 and samples["sampler"]["schedule"] == "linear"
    scores = json.loads(printed["score"])
    assert scores["num_sequences"] == 256
    assert (scores["generative_perplexity"] is None) == (scores["num_out_of_support"] > 0)


def test_tiny_model_evaluation_commands(tmp_path):
    (block,) = [b for b in blocks("bash") if "hf-mdm tiny-models" in b]
    skipped = ("ACCELERATE_USE_CPU", "HF_ALLOW_CODE_EVAL=1 hf-mdm compare")  # run in test_harness_cli.py
    lines = [line for line in commands(block) if not line.startswith(skipped)]
    script = "set -e\n" + "\n".join(lines).replace("/path/to/data", DATA_DIR)
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("HF_MDM_DATA_DIR")
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "eval").rglob("results_*.json")]
    by_task = {task: run for run in runs for task in run["results"]}
    assert by_task["mdm_gsm8k"]["timing"]["all"]["requests"] == 4 and by_task["mdm_gsm8k"]["timing"]["all"]["nfe"] == 32
    assert by_task["mdm_humaneval"]["timing"]["all"]["requests"] == 2
    assert "pass_at_1,sandbox" in by_task["mdm_humaneval"]["results"]["mdm_humaneval"]


NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\d])")
COUNT = re.compile(r"\b\d+ of \d+\b")
REGION = re.compile(r"<!-- numbers: (?P<sources>[^>]+?) -->(?P<text>.*?)<!-- /numbers -->", re.S)


def quoted_numbers(text: str) -> list[str]:
    """The decimals ("0.422", "1.95" of "1.95x") and counts ("21 of 21") a README passage quotes."""
    return NUMBER.findall(text) + COUNT.findall(text)


def test_quoted_numbers_finds_decimals_and_counts():
    text = "SER 0.422 [0.363, 0.483] in 21 of 21 points, 1.95x at L = 32, b = 4, `arXiv 2502.09622`"
    assert quoted_numbers(text) == ["0.422", "0.363", "0.483", "1.95", "2502.09622", "21 of 21"]


def test_every_number_the_readme_quotes_is_in_the_results_it_names():
    """Each README passage between `<!-- numbers: FILES -->` and `<!-- /numbers -->` quotes only decimals and "k of
    n" counts that appear in FILES (the committed results the passage reads), so a re-run that changes a number
    fails here until the README says the new one."""
    regions = list(REGION.finditer(README))
    assert len(regions) >= 3  # block diffusion, the TER estimator, make bench
    for region in regions:
        sources = "\n".join((REPO / name).read_text() for name in region["sources"].split())
        found = set(quoted_numbers(sources))
        missing = [n for n in quoted_numbers(region["text"]) if n not in found]
        assert not missing, f"README numbers not in {region['sources']}: {missing}"


def test_tuning_block_runs_as_written_and_writes_the_front(tmp_path):
    """The Tuning section's first bash block, as written, on the CPU: front.json with every documented field, the
    chosen setting on the front, its held-out quality, the AR baseline."""
    (block,) = [b for b in blocks("bash") if "hf-mdm tune" in b]
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(
        ["bash", "-c", "set -e\n" + block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    front = json.loads((tmp_path / "runs" / "tune" / "front.json").read_text())
    fields = {"setting", "quality", "quality_ci_low", "quality_ci_high", "samples", "nfe_per_token"}
    fields |= {"positions_per_token", "tokens_per_s", "on_front"}
    assert len(front["rows"]) == 9 and all(fields <= set(row) for row in front["rows"])
    assert front["chosen"]["on_front"] and front["held_out"]["samples"] == 256
    assert (
        front["baseline"]["samples"] == 256 and "AR baseline" in (tmp_path / "runs" / "tune" / "front.md").read_text()
    )
