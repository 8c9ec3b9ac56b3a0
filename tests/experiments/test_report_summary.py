"""The report's opening table of findings and what `hf-mdm reproduce` prints: progress per experiment, then the
table; each finding's verdict from its words."""

import json

import yaml

from hf_mdm import cli
from hf_mdm.cli_reproduce import CONFIG_DIR
from hf_mdm.experiments import load_scale, miniature
from hf_mdm.experiments.scales import CPU_MINUTES, DEFAULT_SCALE
from hf_mdm.report import write_report
from hf_mdm.report_summary import report_summary, verdict_of


def _flops_rows(block_gaps: list[float]) -> list[dict]:
    rows = []
    for seed, gap in enumerate(block_gaps):
        common = {"seed": seed, "steps": 1, "sequences": 1, "tokens": 1, "flops": 1, "ser": 0.5, "language": "hmm"}
        rows.append({**common, "model": "MDM (b = L = 16)", "gap": 0.10 + 0.02 * seed})
        rows.append({**common, "model": "block diffusion (b = 4)", "gap": gap})
    return rows


def test_summary_names_missing_experiments_and_the_command_that_runs_them(tmp_path):
    text = report_summary(tmp_path)
    assert text.startswith("## Findings\n\n| experiment | finding (numbers with 95% intervals) | verdict | figure |")
    assert f"not run (no {tmp_path / 'wallclock.json'}; `hf-mdm reproduce --only wallclock` runs it)" in text
    assert text.count("not run") == 6


def test_summary_carries_the_equal_flops_verdict_only_where_the_data_support_it(tmp_path):
    """A block model 0.01 below the MDM seed by seed is reported lower; scattered around it, not resolved."""
    for gaps, verdict in (
        ([0.091, 0.109, 0.131, 0.149], "lower than the MDM's"),
        ([0.13, 0.1, 0.16, 0.12], "not resolved"),
    ):
        result = {"rows": [], "equal_flops": _flops_rows(gaps)}
        (tmp_path / "block_diffusion.json").write_text(json.dumps(result))
        text = report_summary(tmp_path)
        line = next(x for x in text.splitlines() if "at equal training FLOPs" in x)
        assert line.startswith(
            "| Block diffusion | block diffusion (b = 4) at equal training FLOPs: exact NLL / entropy - 1 (one token a "
            "step left to right; AR: its own) " + verdict
        )
        expected = "partly resolved" if verdict == "lower than the MDM's" else "not resolved"  # SER: alike
        assert line.endswith(f"| {expected} | [block_diffusion.png](block_diffusion.png) |")


def test_a_findings_verdict_comes_from_its_words():
    assert verdict_of("SER 0.2 [0.1, 0.3] is above the AR's 0.05 [0.01, 0.09].") == "resolved"
    assert verdict_of("at every N the 95% intervals overlap: no dependence on L is resolved") == "not resolved"
    assert verdict_of("the SER moved by no resolved amount, from 0.5 to 0.5") == "not resolved"
    assert verdict_of("3 of 50 MDM cells hold only an upper bound of the paper's TER") == "bound only"
    assert verdict_of("NLL lower than the MDM's (-0.1 [-0.2, -0.05]); SER not resolved from it") == "partly resolved"


def test_a_section_whose_json_is_missing_says_so(tmp_path):
    (tmp_path / "ser_vs_steps.md").write_text("| table |\n")
    report = write_report(tmp_path).read_text()
    assert f"No findings: {tmp_path / 'ser_vs_steps.json'} is missing" in report
    assert report.index("## Findings") < report.index("## Sequence error rate vs steps")


def test_reproduce_names_each_experiment_and_ends_with_the_summary(tmp_path, capfd):
    """One experiment (the SER one, in miniature): a line when it starts and ends with how many remain, then one line
    per experiment with its time and table, the report's summary and where the report is; not the tables."""
    configs = tmp_path / "configs"
    configs.mkdir()
    _, full = load_scale(CONFIG_DIR / "ser_vs_steps.yaml", full=True)
    small = miniature(full)
    (configs / "ser_vs_steps.yaml").write_text(
        yaml.safe_dump({"experiment": "ser_vs_steps", "first_look": small, "quick": small, "full": small})
    )
    out = tmp_path / "results"
    args = [
        "reproduce",
        "--only",
        "ser_vs_steps",
        "--config-dir",
        str(configs),
        "--output-dir",
        str(out),
        "--jobs",
        "1",
    ]
    assert cli.main(args) == 0
    printed = capfd.readouterr().out  # the experiment's own process prints its start
    minutes = CPU_MINUTES[DEFAULT_SCALE]["ser_vs_steps"]
    assert f"scale {DEFAULT_SCALE} -> {out} (1 experiments, about {minutes:.0f} min on 1 cores)" in printed
    assert f"[1/1] ser_vs_steps: started, about {minutes:.1f} CPU-min (0 still to start)" in printed
    assert "[1/1 done] ser_vs_steps: " in printed and " CPU-min (" in printed
    assert "ser_vs_steps: " in printed and f"{out / 'ser_vs_steps'}.md" in printed
    assert "## Findings" in printed and "| Wall-clock against AR | not run" in printed
    assert f"report: {out / 'REPORT.md'}" in printed
    assert "| language |" not in printed  # the tables stay in their files
