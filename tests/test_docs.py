"""The documentation site (docs/, mkdocs.yml) builds, and every code block of it and of the README runs.

- A fenced block right after a `<!-- not run: REASON -->` line is not run (a real checkpoint, a GPU, the network, or
  the test suite itself), and says why; ```text and ```bibtex blocks are listings, not code. Every other block runs:
  a page's ```python blocks in order, in one fresh process, offline, on tiny local models (here for docs/; the
  README's in tests/test_readme.py); every other block (```bash) by the test that `RUNNERS` names for it.
  `test_every_block_is_run_or_says_why_not` checks that this covers every block.
- `mkdocs build --strict` succeeds: a broken link or anchor, a page missing from nav or a missing included results
  file fails it (skipped, with the reason, where mkdocs is not installed: the `docs` extra).
"""

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenized_checkpoints import write_checkpoint

from hf_mdm.harness.tiny import build_tokenizer

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README = REPO / "README.md"
BIN = Path(sys.executable).parent
LISTINGS = ("text", "bibtex")
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>[^\n]*?) -->\n)?```(?P<language>[\w-]*)\n(?P<code>.*?)```", re.S)
# The block holding each key is run, as written (or, where a test says so, with sizes scaled down), by the test named.
RUNNERS = {
    "hf-mdm tune --model oracle": "test_readme.py::test_quickstart_tune_block_runs_as_written",
    "--model hf_timed --model_args pretrained=runs/tiny/llama --tasks mdm_gsm8k": (
        "test_readme.py::test_quickstart_evaluation_block_runs_as_written"
    ),
    "hf-mdm dataset build ngram2": "test_readme.py::test_synthetic_pipeline_commands",
    "hf-mdm tune --model runs/chain16-mdm/final": "test_readme.py::test_tuning_block_runs_as_written_and_writes_the_front",
    "ACCELERATE_USE_CPU=1 accelerate launch": "test_readme.py::test_tiny_model_evaluation_commands",
    "python -m hf_mdm.gpu_check --device cpu --tiny": "test_docs.py::test_gpu_check_cpu_block_runs_as_written",
}
# What a page's python blocks import from an optional extra: without it the page is skipped, saying which.
OPTIONAL = {
    "from diffusers import": "diffusers",
    "from hf_mdm.rl.trainer import": "trl",
    "from hf_mdm.quantization import": "torchao",
}


def code_blocks(path: Path) -> list[dict]:
    """The fenced blocks of a page: language, code and the reason it is not run (None when it runs)."""
    return [match.groupdict() for match in BLOCK.finditer(path.read_text(encoding="utf-8"))]


def blocks(path: Path, language: str) -> list[str]:
    """The code of the page's blocks in ``language`` that run (not marked `not run`)."""
    return [b["code"] for b in code_blocks(path) if b["language"] == language and b["reason"] is None]


def block_holding(path: Path, text: str) -> str:
    """The one block of the page (any language) that holds ``text``."""
    (block,) = [b["code"] for b in code_blocks(path) if text in b["code"]]
    return block


def documentation_text() -> str:
    """The README and every page of the site, one text."""
    return "\n".join(path.read_text(encoding="utf-8") for path in [README, *PAGES])


def missing_extras(code: str) -> list[str]:
    """The optional packages ``code`` imports that are not installed."""
    return [
        module for marker, module in OPTIONAL.items() if marker in code and importlib.util.find_spec(module) is None
    ]


def run_python(code: str, cwd: Path, hub_cache: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh process in ``cwd``, offline, with the Hub cache of tiny checkpoints."""
    env = dict(
        os.environ,
        HF_HUB_CACHE=str(hub_cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(cwd / "datasets"),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=500)


def build_hub_cache(cache: Path) -> Path:
    """A Hub cache holding a tiny LLaDA-8B-Base (published config keys and tensor names) at revision main."""
    repo = cache / "models--GSAI-ML--LLaDA-8B-Base"
    revision = "0" * 40
    write_checkpoint(repo / "snapshots" / revision, "llada", build_tokenizer())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return cache


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    return build_hub_cache(tmp_path_factory.mktemp("hub"))


def test_every_block_is_run_or_says_why_not():
    ran_by = {key: [] for key in RUNNERS}
    for path in [README, *PAGES]:
        for block in code_blocks(path):
            where = f"{path.relative_to(REPO)}: ```{block['language']} {block['code'][:60]!r}"
            if block["reason"] is not None:
                assert block["reason"].strip() and block["language"] != "python", f"{where}: a python block runs"
                continue
            if block["language"] in ("python", *LISTINGS):
                continue
            keys = [key for key in RUNNERS if key in block["code"]]
            assert len(keys) == 1, f"{where}: not run by any test (add it to RUNNERS or mark it `not run`)"
            ran_by[keys[0]].append(where)
    assert all(len(found) == 1 for found in ran_by.values()), ran_by
    for runner in RUNNERS.values():
        module, name = runner.split("::")
        tree = ast.parse((REPO / "tests" / module).read_text())
        assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, runner


PYTHON_PAGES = [path for path in PAGES if blocks(path, "python")]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=[str(path.relative_to(DOCS)) for path in PYTHON_PAGES])
def test_page_python_blocks_run_as_written(page, hub_cache, tmp_path):
    """The page's python blocks, in order, in one fresh process: each page runs on its own."""
    code = "\n".join(blocks(page, "python"))
    missing = missing_extras(code)
    if missing:
        pytest.skip(f"{page.relative_to(REPO)} imports {', '.join(missing)}, not installed (an optional extra)")
    result = run_python(code, tmp_path, hub_cache)
    assert result.returncode == 0, result.stderr[-4000:]


def test_gpu_check_cpu_block_runs_as_written(tmp_path):
    """docs/gpu-check.md's CPU command, as written: the tiny stand-ins' table, written where the command says."""
    block = block_holding(DOCS / "gpu-check.md", "python -m hf_mdm.gpu_check --device cpu --tiny")
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(
        ["bash", "-c", "set -e\n" + block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "runs" / "gpu-check" / "gpu_check.md").is_file()


def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra: pip install -e '.[docs]')")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # the figures are served beside the pages, the results' tables included as text, the API pages rendered
    assert (site / "results" / "ser_vs_steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (site / "results" / "report" / "index.html").read_text()
    assert 'src="../ser_vs_steps.png"' in report and "Sequence error rate vs steps" in report
    assert "hf_mdm llada2_pipeline, exact block cache" in (site / "peers" / "index.html").read_text()
    assert (
        'id="hf_mdm.generation_config.MaskedDiffusionGenerationConfig"'
        in (site / "api" / "generation" / "index.html").read_text()
    )


def test_pages_read_on_their_own():
    """Each guide opens with its title and a sentence saying what it is for, before any code."""
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        title, _, rest = text.partition("\n\n")
        assert title.startswith("# ") and "\n" not in title, path
        assert rest and not rest.startswith(("```", "<!--", "--8<--", ":::")), f"{path}: no opening sentence"
