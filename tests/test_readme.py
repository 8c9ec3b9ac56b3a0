"""The README's quickstart, and the command blocks of the guides it links, run as written, offline, on tiny local
models; the numbers the README and the guides quote are in the results they name.

- the README's ```python blocks, in order, in one fresh process (the Hub checkpoint the LLaDA block names is a tiny
  LLaDA in the published format, in a local Hub cache; the Hub itself is offline); its tuning and lm-eval blocks
  through bash as written, with ``/path/to/data`` the real benchmark folder;
- the guides' shell commands (docs/; tests/test_docs.py says which test runs each block): the synthetic pipeline of
  docs/data.md through ``hf_mdm.cli.main`` with the sizes scaled down (fewer training sequences and steps) and the
  Hub upload's network calls mocked; docs/tuning.md's block as written; docs/lm-eval.md's tiny-model block through
  bash as written. That block's `accelerate launch` line runs in `tests/harness/test_harness_cli.py` (two processes) and
  `hf-mdm compare` on the tiny config there too (with a lower limit);
- the README's and guides' examples that stand alone run on their own, and every `hf_mdm.x.y` they name exists.
"""

import importlib
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
from test_docs import (
    DOCS,
    PAGES,
    README,
    block_holding,
    blocks,
    build_hub_cache,
    code_blocks,
    missing_extras,
    run_python,
)

from hf_mdm import cli
from hf_mdm.languages import PAPER_CITATION

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = os.environ.setdefault("HF_MDM_DATA_DIR", str(REPO.parent / "shared" / "data"))
BIN = Path(sys.executable).parent
# the README and the guides it links (docs/), one text
GUIDES = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
SCALED = {
    "--num-train 20000": "--num-train 256 --num-validation 64 --num-test 16",
    "--max-steps 600": "--max-steps 2 --batch-size 16 --save-steps 2 --warmup-steps 0",
}
CHECKS = """
import json
print("README-CHECKS", json.dumps({
    "llada": type(model).__name__, "nfe": out.nfe, "new": out.sequences.shape[1] - prompt.shape[1],
    "served": answer.choices[0].finish_reason, "grpo_steps": grpo.state.global_step if "grpo" in globals() else None,
}))
"""


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    return build_hub_cache(tmp_path_factory.mktemp("hub"))


def commands(block: str) -> list[str]:
    """The block's command lines (continuations joined, comments dropped)."""
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("  #")[0].strip() for line in lines if line.strip() and not line.startswith("#")]


def bash_env(**extra: str) -> dict:
    """The environment a block runs in: the venv's commands first, offline."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra)
    env.pop("HF_MDM_DATA_DIR")  # the block exports it itself
    return env


def run_bash(script: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", "set -e\n" + script], cwd=cwd, env=bash_env(**extra), capture_output=True, text=True, timeout=600
    )


def runnable_python_blocks() -> list[str]:
    """The README's python blocks; a block that imports an optional extra not installed (diffusers, TRL: absent at
    the lowest versions) is left out (the guides' tests skip their pages with the reason)."""
    return [block for block in blocks(README, "python") if not missing_extras(block)]


def test_python_blocks_run_as_written(hub_cache, tmp_path):
    result = run_python("\n".join(runnable_python_blocks()) + CHECKS, tmp_path, hub_cache)
    assert result.returncode == 0, result.stderr[-4000:]
    checks = json.loads(result.stdout.split("README-CHECKS", 1)[1])
    assert checks["llada"] == "LLaDAModelLM" and checks["new"] == 32
    assert 0 < checks["nfe"] <= 16  # 4 blocks of 4 steps; a row that has reached EOS stops between blocks
    assert checks["served"] in ("length", "stop")
    assert checks["grpo_steps"] == (None if missing_extras("from hf_mdm.rl.trainer import") else 2)


def test_quickstart_tune_block_runs_as_written(tmp_path):
    """The quickstart's tuning block, as written: the oracle's front, the chosen setting on it, its config written."""
    result = run_bash(block_holding(README, "hf-mdm tune --model oracle"), tmp_path, OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    front = json.loads((tmp_path / "runs" / "tune" / "front.json").read_text())
    assert len(front["rows"]) == 5 and front["chosen"]["on_front"]
    assert json.loads((tmp_path / "runs" / "tune" / "generation_config.json").read_text())["max_new_tokens"] == 16


def test_quickstart_evaluation_block_runs_as_written(tmp_path):
    """The quickstart's lm-eval block, as written: the tiny MDM and the tiny Llama on the same 4 GSM8K questions,
    each request timed and its forwards counted."""
    block = block_holding(README, "--model hf_timed --model_args pretrained=runs/tiny/llama --tasks mdm_gsm8k")
    result = run_bash(block.replace("/path/to/data", DATA_DIR), tmp_path, OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "eval").rglob("results_*.json")]
    timing = {run["config"]["model"]: run["timing"]["all"] for run in runs}
    assert set(timing) == {"hf_mdm", "hf_timed"} and all(t["requests"] == 4 for t in timing.values())
    assert timing["hf_mdm"]["nfe"] == 32  # 8 steps a request, one batch each


def test_synthetic_pipeline_commands(tmp_path, monkeypatch, capsys):
    pipeline = block_holding(DOCS / "data.md", "hf-mdm dataset build ngram2")
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
    block = block_holding(DOCS / "lm-eval.md", "ACCELERATE_USE_CPU=1 accelerate launch")
    skipped = ("ACCELERATE_USE_CPU", "HF_ALLOW_CODE_EVAL=1 hf-mdm compare")  # run in test_harness_cli.py
    lines = [line for line in commands(block) if not line.startswith(skipped)]
    script = "\n".join(lines).replace("/path/to/data", DATA_DIR)
    result = run_bash(script, tmp_path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
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
    """Each passage of the README or of a guide (docs/) between `<!-- numbers: FILES -->` and `<!-- /numbers -->`
    quotes only decimals and "k of n" counts that appear in FILES (the committed results the passage reads), so a
    re-run that changes a number fails here until the page says the new one."""
    checked = []
    for path in [README, *PAGES]:
        for region in REGION.finditer(path.read_text(encoding="utf-8")):
            sources = "\n".join((REPO / name).read_text() for name in region["sources"].split())
            found = set(quoted_numbers(sources))
            missing = [n for n in quoted_numbers(region["text"]) if n not in found]
            assert not missing, f"{path.relative_to(REPO)}: numbers not in {region['sources']}: {missing}"
            checked.append(path.name)
    assert "README.md" in checked and len(checked) >= 10  # the summary; block diffusion, TER, peers, bench, ...


def test_tuning_block_runs_as_written_and_writes_the_front(tmp_path):
    """docs/tuning.md's first bash block, as written, on the CPU: front.json with every documented field, the chosen
    setting on the front, its held-out quality, the AR baseline."""
    result = run_bash(block_holding(DOCS / "tuning.md", "hf-mdm tune --model runs/chain16-mdm/final"), tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    front = json.loads((tmp_path / "runs" / "tune" / "front.json").read_text())
    fields = {"setting", "quality", "quality_ci_low", "quality_ci_high", "samples", "nfe_per_token"}
    fields |= {"positions_per_token", "tokens_per_s", "on_front"}
    assert len(front["rows"]) == 9 and all(fields <= set(row) for row in front["rows"])
    assert front["chosen"]["on_front"] and front["held_out"]["samples"] == 256
    assert (
        front["baseline"]["samples"] == 256 and "AR baseline" in (tmp_path / "runs" / "tune" / "front.md").read_text()
    )


def test_readme_is_short_and_links_what_exists():
    """The README stays a front page (the guides hold the rest), and every relative link in it resolves."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    assert [link for link in local if not (REPO / link).exists()] == []
    for section in ("## The two commands", "## Quickstart", "## What works with what", "## Layout", "## Citation"):
        assert section in text
    assert "make reproduce" in text and "make test" in text


def test_readme_cites_the_paper_as_the_package_does():
    (citation,) = [b["code"] for b in code_blocks(README) if b["language"] == "bibtex"]
    assert citation == PAPER_CITATION


def python_block(after: str) -> str:
    """The first ```python block after the text ``after``."""
    return re.search(r"```python\n(.*?)```", GUIDES[GUIDES.index(after) :], flags=re.S).group(1)


@pytest.mark.parametrize("after", ["# Reproducible at any batch size", "# Beside diffusers' LLaDA2Pipeline"])
def test_readme_examples_run_on_their_own(after):
    pytest.importorskip("diffusers")
    exec(compile(python_block(after), f"README.md: {after}", "exec"), {})


def exists(dotted: str) -> bool:
    """Whether ``dotted`` (``hf_mdm.module.name``) is a module, or a name in the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def test_readme_names_what_exists_and_how_to_reach_the_commands():
    named = sorted(set(re.findall(r"`(hf_mdm(?:\.\w+)+)", GUIDES)))
    assert "hf_mdm.generation_resolve.resolve_config" in named
    assert [dotted for dotted in named if not exists(dotted)] == []
    assert "source .venv/bin/activate" in GUIDES and "`.venv/bin/hf-mdm`" in GUIDES
