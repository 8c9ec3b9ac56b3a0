"""hf-mdm-eval (lm-eval's CLI with hf_mdm's models and tasks), accelerate sharding and hf-mdm compare, end to end
on tiny local checkpoints and real GSM8K / HumanEval rows; a broken compare config is one line naming it."""

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hf_mdm.harness import compare
from hf_mdm.harness.tiny import build_tiny_models

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = os.environ.setdefault("HF_MDM_DATA_DIR", str(REPO.parent / "shared" / "data"))
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


def _env() -> dict:
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_MDM_DATA_DIR=DATA_DIR,
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_ALLOW_CODE_EVAL="1",
    )
    env.pop("ACCELERATE_USE_CPU", None)
    return env


def _run(command: list, env: dict = None) -> str:
    result = subprocess.run(command, cwd=REPO, env=env or _env(), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout


def _eval_args(model: str, pretrained: str, output: Path, extra: str = "") -> list:
    return [
        "run",
        "--model",
        model,
        "--model_args",
        f"pretrained={pretrained}{extra}",
        "--tasks",
        "mdm_gsm8k",
        "--limit",
        "3",
        "--output_path",
        str(output),
        "--log_samples",
    ]


def _outputs(output: Path) -> tuple[dict, list]:
    results = json.loads(next(output.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next(output.rglob("samples_mdm_gsm8k_*.jsonl")).read_text().splitlines()]
    return results, samples


@pytest.fixture(scope="module")
def mdm_run(tiny, tmp_path_factory):
    output = tmp_path_factory.mktemp("mdm_run")
    stdout = _run([str(BIN / "hf-mdm-eval"), *_eval_args("hf_mdm", tiny["mdm"], output, ",steps=8"), "--device", "cpu"])
    return stdout, *_outputs(output)


def test_hf_mdm_eval_writes_accuracy_and_timing(mdm_run):
    stdout, results, samples = mdm_run
    assert "exact_match" in stdout and "wall_s" in stdout  # lm-eval's table, with the timing rows
    timing = results["timing"]["tasks"]["mdm_gsm8k"]
    assert timing["requests"] == 3 and timing["nfe"] == 3 * 8 and timing["wall_s"] > 0
    assert 0 < timing["generate_s"] <= timing["wall_s"]
    assert results["results"]["mdm_gsm8k"]["nfe,timing"] == 24
    assert "exact_match,strict-match" in results["results"]["mdm_gsm8k"]
    assert results["config"]["model"] == "hf_mdm" and results["config"]["generation_config"]["steps"] == 8
    assert len(samples) == 6  # 3 documents x (strict, flexible)
    for sample in samples:
        (record,) = sample["timing"]
        assert record["nfe"] == 8 and record["generate_s"] > 0 and record["generated_tokens"] <= 256


def test_hf_timed_eval_writes_accuracy_and_timing(tiny, tmp_path):
    _run(
        [
            sys.executable,
            "-m",
            "hf_mdm.harness",
            *_eval_args("hf_timed", tiny["llama"], tmp_path),
            "--device",
            "cpu",
            "--gen_kwargs",
            "max_gen_toks=48",
        ]
    )
    results, samples = _outputs(tmp_path)
    timing = results["timing"]["tasks"]["mdm_gsm8k"]
    assert timing["requests"] == 3 and 0 < timing["generated_tokens"] <= 3 * 48
    assert timing["nfe"] >= timing["generated_tokens"] / 3  # one forward per decoding step of each batch
    for sample in samples:
        (record,) = sample["timing"]
        text = sample["resps"][0][0]
        assert record["generated_tokens"] >= len(text.encode()) and record["time_s"] > 0


def readme_command(start: str) -> str:
    """The shell command of the README or of a guide (docs/) that starts with ``start`` (continuation lines
    joined)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    text = "\n".join(path.read_text() for path in pages).replace("\\\n", " ")
    (line,) = [line.split("  #")[0].strip() for line in text.splitlines() if line.startswith(start)]
    return line


@pytest.mark.slow
def test_two_processes_give_the_single_process_scores(tiny, mdm_run, tmp_path):
    """The README's `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 ...`, as written, with
    runs/tiny the tiny models: requests are sharded across the two processes and gathered; every answer and score
    equals the single-process run's, a request's NFE does not depend on the batch size, and the wall-clock is the
    slowest process's (not the sum over processes)."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny").symlink_to(Path(tiny["mdm"]).parent)
    command = readme_command("ACCELERATE_USE_CPU=1 accelerate launch")
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=dict(_env(), PATH=f"{BIN}:{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    _, single, single_samples = mdm_run
    sharded, sharded_samples = _outputs(tmp_path / "runs" / "eval-2proc")

    def answers(samples):
        return sorted((s["doc_id"], s["filter"], s["resps"][0][0], s["filtered_resps"][0]) for s in samples)

    assert answers(sharded_samples) == answers(single_samples)
    for metric in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert sharded["results"]["mdm_gsm8k"][metric] == single["results"]["mdm_gsm8k"][metric]
    ranks = {record["rank"] for s in sharded_samples for record in s["timing"]}
    assert ranks == {0, 1}  # really two processes
    assert sharded["timing"]["all"]["ranks"] == 2 and sharded["timing"]["all"]["requests"] == 3
    assert sharded["timing"]["all"]["nfe"] == single["timing"]["all"]["nfe"]
    records = [r for s in sharded_samples for r in s["timing"] if s["filter"] == "strict-match"]
    assert max(r["batch_size"] for r in records) == 2 and all(r["nfe"] == 8 for r in records)  # batch 2, NFE 8 each
    assert all(r["batch_forward_rows"] == 8 * r["batch_size"] for r in records)
    for run, samples in ((single, single_samples), (sharded, sharded_samples)):
        timing = run["timing"]["all"]
        assert timing["wall_s"] == max(timing["rank_s"]) and len(timing["rank_s"]) == timing["ranks"]
        kept = [r["time_s"] for s in samples if s["filter"] == "strict-match" for r in s["timing"]]
        assert timing["summed_s"] == pytest.approx(sum(kept))
        assert timing["tokens_per_s"] == pytest.approx(timing["generated_tokens"] / timing["wall_s"])
        assert timing["nfe_per_request"] == 8 and set(run["timing"]["fields"]) >= set(timing)
    assert single["timing"]["all"]["wall_s"] == pytest.approx(single["timing"]["all"]["summed_s"])
    assert sharded["timing"]["all"]["wall_s"] < sum(sharded["timing"]["all"]["rank_s"])  # the max, not the sum


def test_plain_accelerate_launch_says_it_started_one_process(tiny, tmp_path):
    """`accelerate launch --num_processes 2` without --multi_gpu starts one process on CPU: refused, with the
    command that shards."""
    command = [
        str(BIN / "accelerate"),
        "launch",
        "--num_processes",
        "2",
        "-m",
        "hf_mdm.harness",
        "run",
        "--model",
        "hf_mdm",
        "--model_args",
        f"pretrained={tiny['mdm']}",
        "--tasks",
        "mdm_gsm8k",
        "--limit",
        "1",
        "--output_path",
        str(tmp_path),
    ]
    result = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=400)
    assert result.returncode != 0 and not list(tmp_path.rglob("results_*.json"))
    assert (
        "started this one alone" in result.stderr
        and "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu" in result.stderr
    )


@pytest.mark.slow
def test_compare_on_the_tiny_config_writes_table_and_plot(tmp_path, monkeypatch):
    pytest.importorskip("diffusers")  # the tiny config's tiny-llada2-diffusers runs diffusers' LLaDA2Pipeline
    config = yaml.safe_load((REPO / "evaluation" / "configs" / "tiny.yaml").read_text())
    config["output_dir"] = str(tmp_path / "out")
    config["tiny_models"] = str(tmp_path / "models")
    config["evaluate"]["gen_kwargs"] = {"max_gen_toks": 16}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    assert compare.main(["--config", str(path), "--limit", "1"]) == 0
    out = tmp_path / "out"
    rows = list(csvreader(out / "results.csv"))
    cells = {(r["model"], r["setting"], r["task"]) for r in rows}
    assert len(cells) == 20 and all(float(r["time_s"]) > 0 and r["accuracy"] != "" for r in rows)
    assert (out / "accuracy_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "results.md").read_text()
    assert "| gsm8k | tiny-mdm | 8 steps |" in table and "| humaneval | tiny-llama | autoregressive |" in table
    assert "| gsm8k | tiny-mdm | dual cache + threshold 0.9 |" in table
    assert "| gsm8k | tiny-llada2 | llada2 defaults |" in table
    assert "| gsm8k | tiny-llada2 | LLaDA2Pipeline settings |" in table
    assert "| gsm8k | tiny-llada2-diffusers | LLaDA2Pipeline defaults |" in table
    assert "| humaneval | tiny-diffusion-gemma | entropy bound 0.1 |" in table
    cell = json.loads((out / "cells" / "tiny-mdm__8-steps__mdm_gsm8k.json").read_text())
    assert cell["reproducibility"] == {"batch_invariant": False, "seeds": "per request", "seed": 1234}
    # resumable: a second run reuses every finished cell
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    loaded = compare.load_config(path, limit=1)
    assert compare.run_matrix(loaded) == []
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()} == stamps
    (out / "cells" / "tiny-llama__autoregressive__mdm_gsm8k.json").unlink()
    assert [p.name for p in compare.run_matrix(loaded)] == ["tiny-llama__autoregressive__mdm_gsm8k.json"]


def test_compare_refuses_before_its_first_cell(tmp_path, monkeypatch):
    """Every requirement of the whole matrix is checked first: the HumanEval cells need HF_ALLOW_CODE_EVAL=1, so
    not even the GSM8K cells before them run."""
    config = yaml.safe_load((REPO / "evaluation" / "configs" / "tiny.yaml").read_text())
    config.update(output_dir=str(tmp_path / "out"), tiny_models=str(tmp_path / "models"))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    with pytest.raises(ValueError, match="mdm_humaneval run generated code: set HF_ALLOW_CODE_EVAL=1"):
        compare.main(["--config", str(path)])
    assert not (tmp_path / "out" / "cells").exists()
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    monkeypatch.delenv("HF_MDM_DATA_DIR")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match="offline .*set HF_MDM_DATA_DIR"):
        compare.main(["--config", str(path)])
    config["models"][0]["model_args"]["pretrained"] = str(tmp_path / "models" / "mdn")
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("HF_MDM_DATA_DIR", DATA_DIR)
    with pytest.raises(ValueError, match=f"pretrained={tmp_path / 'models' / 'mdn'}: no such file.* has mdm"):
        compare.main(["--config", str(path)])
    assert not (tmp_path / "out" / "cells").exists()


def test_hf_mdm_eval_refuses_a_code_task_without_the_opt_in(tiny, tmp_path, monkeypatch, capsys):
    from hf_mdm.harness.__main__ import main

    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    argv = [
        "run",
        "--model",
        "hf_mdm",
        "--model_args",
        f"pretrained={tiny['mdm']}",
        "--tasks",
        "mdm_humaneval",
        "--limit",
        "1",
        "--confirm_run_unsafe_code",
        "--output_path",
        str(tmp_path),
    ]
    assert main(argv) == 2 and not list(tmp_path.iterdir())
    assert "mdm_humaneval run generated code: set HF_ALLOW_CODE_EVAL=1" in capsys.readouterr().err


def test_offline_without_a_data_folder_points_to_it(monkeypatch):
    from hf_mdm.harness.data import load_gsm8k

    monkeypatch.delenv("HF_MDM_DATA_DIR")
    with pytest.raises(ConnectionError, match="openai/gsm8k.*point HF_MDM_DATA_DIR at a local copy"):
        load_gsm8k()


def csvreader(path: Path):
    import csv

    with open(path, newline="") as handle:
        yield from csv.DictReader(handle)


def test_paper_numbers_cover_the_paper_configs():
    paper = compare.paper_numbers()
    for name in ("paper_gsm8k", "paper_humaneval", "paper_mbpp"):
        config = yaml.safe_load((REPO / "evaluation" / "configs" / f"{name}.yaml").read_text())
        benchmark = compare.benchmark_of(config["tasks"][0])
        expected = {key for key in paper if key[0] == benchmark}
        declared = {(benchmark, m["name"], s["name"]) for m in config["models"] for s in m["settings"]}
        assert expected <= declared, name  # every published number has its row
        extra = {setting for _, _, setting in declared - expected}  # rows beyond the paper: the KV-cache sampler
        assert extra == {"dual cache + threshold 0.9"}, (name, extra)


def test_cli_is_lm_evals_with_our_tasks_on_the_include_path(tmp_path):
    from hf_mdm.harness.__main__ import HarnessCLI, _include_paths
    from hf_mdm.harness.evaluator import TASKS_DIR

    cli = HarnessCLI()
    legacy = cli.parse_args(["--model", "hf_mdm", "--tasks", "mdm_gsm8k", "--confirm_run_unsafe_code"])
    assert legacy.command == "run" and legacy.model == "hf_mdm" and legacy.confirm_run_unsafe_code
    assert set(cli._subparsers.choices) == {"run", "ls", "validate"}
    explicit = cli.parse_args(["run", "--model", "hf_timed", "--tasks", "mdm_mbpp", "--include_path", "/a:/b"])
    assert _include_paths(explicit) == ["/a", "/b", str(TASKS_DIR)]
    config = tmp_path / "run.yaml"
    config.write_text("include_path: /from/config\ntasks: [mdm_gsm8k]\n")
    assert _include_paths(cli.parse_args(["run", "--config", str(config)])) == ["/from/config", str(TASKS_DIR)]


def _answers_in_cache(cache_dir: Path) -> int:
    """Answers committed to the request caches under ``cache_dir`` (lm-eval's SQLite files; timing keys aside)."""
    import sqlite3

    count = 0
    for path in cache_dir.glob("*.db"):
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            try:
                count += db.execute("SELECT COUNT(*) FROM unnamed WHERE key NOT LIKE 'hf_mdm_timing:%'").fetchone()[0]
            except sqlite3.OperationalError:  # not created yet
                pass
    return count


@pytest.mark.slow
def test_compare_killed_mid_way_resumes_without_redoing_requests(tiny, tmp_path):
    """A compare matrix killed with SIGKILL mid-cell and started again with the same command answers the finished
    requests from lm-eval's request cache and ends with the results of an uninterrupted run."""

    def config(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": name,
                    "output_dir": str(tmp_path / name),
                    "tasks": ["mdm_gsm8k"],
                    "evaluate": {
                        "batch_size": 1,
                        "device": "cpu",
                        "limit": 6,
                        "log_samples": True,
                        "gen_kwargs": {"max_gen_toks": 24},
                    },
                    "models": [
                        {
                            "name": "tiny-mdm",
                            "model": "hf_mdm",
                            "model_args": {"pretrained": tiny["mdm"]},
                            "settings": [
                                {"name": "16 steps", "model_args": {"steps": 16}},
                                {"name": "32 steps", "model_args": {"steps": 32}},
                            ],
                        }
                    ],
                }
            )
        )
        return path

    command = [str(BIN / "hf-mdm"), "compare", "--config"]
    _run(command + [str(config("uninterrupted"))])
    killed = config("killed")
    process = subprocess.Popen(
        command + [str(killed)], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    cache, deadline = tmp_path / "killed" / "cache", time.time() + 300
    while _answers_in_cache(cache) < 2 and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before = _answers_in_cache(cache)
    assert 2 <= done_before < 12, "killed mid-way"
    leftovers = [p.name for p in (tmp_path / "killed").rglob("*") if p.name.startswith(".") and p.is_file()]
    assert not (tmp_path / "killed" / "results.csv").exists() and not leftovers  # nothing half-written
    _run(command + [str(killed)])  # the same command again

    def outputs(name: str) -> tuple:
        out = tmp_path / name
        cells = {p.name: json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))}
        samples = {
            p.name: [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted((out / "samples").glob("*.jsonl"))
        }
        return cells, samples

    cells, samples = outputs("killed")
    expected_cells, expected_samples = outputs("uninterrupted")
    assert cells.keys() == expected_cells.keys() and len(cells) == 2
    counts = ("requests", "nfe", "generated_tokens", "output_tokens")
    for name, cell in cells.items():
        assert cell["accuracy"] == expected_cells[name]["accuracy"]
        assert {k: cell["timing"][k] for k in counts} == {k: expected_cells[name]["timing"][k] for k in counts}
        assert [s["resps"] for s in samples[name.replace(".json", ".jsonl")]] == [
            s["resps"] for s in expected_samples[name.replace(".json", ".jsonl")]
        ]
    # the requests finished before the kill were not redone
    assert sum(cell["timing"]["cached_requests"] for cell in cells.values()) == done_before
    assert all(cell["timing"]["cached_requests"] == 0 for cell in expected_cells.values())
    accuracy = [(r["setting"], r["accuracy"], r["requests"]) for r in csvreader(tmp_path / "killed" / "results.csv")]
    assert accuracy == [
        (r["setting"], r["accuracy"], r["requests"]) for r in csvreader(tmp_path / "uninterrupted" / "results.csv")
    ]


def test_hf_mdm_eval_with_use_cache_resumes_from_finished_requests(tiny, tmp_path, monkeypatch):
    """The same ``hf-mdm-eval run --use_cache`` command again answers every finished request from lm-eval's cache
    (with its timing) and writes the same results; the cache file is named after the model and its arguments."""
    from hf_mdm.harness.__main__ import main

    monkeypatch.setenv("HF_MDM_DATA_DIR", DATA_DIR)
    runs = []
    for name in ("first", "again"):
        argv = _eval_args("hf_mdm", tiny["mdm"], tmp_path / name, ",steps=8") + [
            "--device",
            "cpu",
            "--use_cache",
            str(tmp_path / "cache" / "requests"),
        ]
        assert main(argv) == 0
        runs.append(_outputs(tmp_path / name))
    (first, first_samples), (again, again_samples) = runs
    assert [s["resps"] for s in again_samples] == [s["resps"] for s in first_samples]
    assert again["results"]["mdm_gsm8k"] == {
        **first["results"]["mdm_gsm8k"],
        **{k: v for k, v in again["results"]["mdm_gsm8k"].items() if "timing" in k},
    }
    assert again["timing"]["all"]["cached_requests"] == again["timing"]["all"]["requests"] == 3
    assert first["timing"]["all"]["cached_requests"] == 0
    assert again["timing"]["all"]["nfe"] == first["timing"]["all"]["nfe"]
    assert [p.name for p in (tmp_path / "cache").iterdir()][0].startswith("requests_")
    assert not [p for p in tmp_path.rglob(".hf_mdm_staging-*")]


def test_interrupted_writes_leave_no_file(tmp_path, monkeypatch):
    """lm-eval's result and sample files are written whole or not at all (Ctrl-C in the middle of a write)."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    from hf_mdm.harness.resume import atomic_outputs

    def save(self, *args, interrupt=False, **kwargs):
        path = Path(self.output_path) / "model" / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as handle:
            handle.write('{"half": ')
            if interrupt:
                raise KeyboardInterrupt
            handle.write("1}")

    monkeypatch.setattr(EvaluationTracker, "save_results_aggregated", save)
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    with atomic_outputs(), pytest.raises(KeyboardInterrupt):
        tracker.save_results_aggregated({}, interrupt=True)
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []
    with atomic_outputs():
        tracker.save_results_aggregated({})
    assert json.loads((tmp_path / "out" / "model" / "results.json").read_text()) == {"half": 1}
    assert tracker.output_path == str(tmp_path / "out") and len(list((tmp_path / "out").iterdir())) == 1


def _small_compare_config(tmp_path: Path, tiny: dict, evaluate: dict = None, setting: dict = None) -> Path:
    """Two cells of the tiny MDM on one GSM8K request (on the device `hf_mdm.harness.evaluator.pick_device` picks,
    unless ``evaluate`` names one)."""
    path = tmp_path / "small.yaml"
    config = {
        "name": "small",
        "output_dir": str(tmp_path / "out"),
        "tasks": ["mdm_gsm8k"],
        "evaluate": {"batch_size": 1, "limit": 1, "gen_kwargs": {"max_gen_toks": 8}, **(evaluate or {})},
        "models": [
            {
                "name": "tiny-mdm",
                "model": "hf_mdm",
                "model_args": {"pretrained": tiny["mdm"]},
                "settings": [{"name": "2 steps", "model_args": {"steps": 2}}, {"name": "4 steps", **(setting or {})}],
            }
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_compare_config_mistakes_are_one_line_errors(tiny, tmp_path, capsys):
    """A key no section of the config takes is named with the closest accepted key and all of them, before
    anything runs (not a TypeError from lm-eval once the model is loaded)."""
    from hf_mdm.cli import main as hf_mdm_main

    path = _small_compare_config(tmp_path, tiny, evaluate={"batch_sise": 2, "device": "cpu"})
    assert hf_mdm_main(["compare", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-mdm: error: ")
    assert "unknown key 'batch_sise' in `evaluate` (did you mean 'batch_size'?); accepted keys: " in err
    assert "batch_size, max_batch_size, device" in err
    path = _small_compare_config(tmp_path, tiny, {"device": "cpu"}, {"model_arg": {"steps": 4}})
    with pytest.raises(
        ValueError, match=r"'model_arg' in `models\[0\]\.settings\[1\]` \(tiny-mdm\) \(did you mean 'model_args'"
    ):
        compare.main(["--config", str(path)])
    assert not (tmp_path / "out").exists()


def test_compare_refuses_unknown_gen_kwargs_before_its_first_cell(tiny, tmp_path):
    path = _small_compare_config(tmp_path, tiny, {"device": "cpu"}, {"gen_kwargs": {"stpes": 4}})
    with pytest.raises(ValueError, match=r"'stpes' in gen_kwargs of tiny-mdm / 4 steps .*\(did you mean 'steps'\?\)"):
        compare.main(["--config", str(path)])
    assert not (tmp_path / "out" / "cells").exists()


def test_compare_interrupted_says_how_to_resume(tiny, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the second cell (on a machine without CUDA, no device named): one line with what finished and the
    command that resumes, exit status 130; that command then runs the second cell alone."""
    import torch

    from hf_mdm.harness import evaluator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    real, cells_run = evaluator.simple_evaluate, []

    def simple_evaluate(*args, interrupt_at=2, **kwargs):
        cells_run.append(kwargs["model_args"]["steps"])
        if len(cells_run) == interrupt_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator, "simple_evaluate", simple_evaluate)
    path = _small_compare_config(tmp_path, tiny, setting={"model_args": {"steps": 4}})
    try:
        status = compare.main(["--config", str(path)])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped hf-mdm compare as a traceback")
    assert status == 130
    err = capsys.readouterr().err
    out = tmp_path / "out"
    assert "KeyboardInterrupt" not in err and err.splitlines()[-1] == (
        f"hf-mdm compare: interrupted; 1 of 2 cells finished (in {out / 'cells'}, the unfinished cell's finished "
        f"requests in {out / 'cache'}): run `hf-mdm compare --config {path}` (without --force) to resume where it "
        "stopped"
    )
    monkeypatch.setattr(evaluator, "simple_evaluate", functools.partial(simple_evaluate, interrupt_at=0))
    assert compare.main(["--config", str(path)]) == 0
    assert cells_run == [2, 4, 4] and len(list((out / "cells").glob("*.json"))) == 2


def test_readme_names_every_registered_model():
    """docs/lm-eval.md's sentence about the models hf-mdm-eval adds names each model the harness registers."""
    sources = (REPO / "hf_mdm" / "harness").glob("*.py")
    ours = sorted({m for p in sources for m in re.findall(r'@register_model\("(\w+)"\)', p.read_text())})
    text = " ".join((REPO / "docs" / "lm-eval.md").read_text(encoding="utf-8").split())
    sentence = re.search(r"`hf-mdm-eval` is lm-eval's own CLI with (\w+) more models, (.*?)\. ", text)
    assert sentence is not None and ours
    assert sentence.group(1) == {2: "two", 3: "three", 4: "four", 5: "five"}[len(ours)]
    assert sorted(set(re.findall(r"`(hf_\w+)`", sentence.group(2)))) == ours


def test_a_broken_compare_config_is_one_line_naming_it(tmp_path, capsys):
    from hf_mdm.harness.compare import load_config

    config = tmp_path / "compare.yaml"
    config.write_text("models:\n  - name: a\n   model: hf_mdm\n")  # one space short
    with pytest.raises(ValueError) as err:
        load_config(config)
    message = str(err.value)
    assert "\n" not in message and str(config) in message and "line 3" in message
    with pytest.raises(ValueError, match="no compare config at"):
        load_config(tmp_path / "missing.yaml")
