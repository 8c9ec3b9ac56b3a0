"""hf-mdm tune (hf_mdm.tuning): the space, the front against brute force, halving against the grid, the files, the
chosen config round trip, resuming, and the command line."""

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from hf_mdm import MDMForMaskedDiffusion, cli
from hf_mdm.experiments.common import CellCache
from hf_mdm.languages import ChainLanguage, NGramLanguage, OracleDenoiser
from hf_mdm.tuning import SyntheticTask, choose, expand, pareto_front, search, tune
from hf_mdm.tuning.front import choice_note
from hf_mdm.tuning.outputs import write_generation_config
from hf_mdm.tuning.space import check_settings, setting_key

CHAIN_SPACE = [
    {"transfer": "stochastic", "strategy": "random", "steps": [2, 4, 8, 16]},
    {"transfer": "deterministic", "strategy": "left_to_right", "steps": 16},
]


def test_space_expands_each_group_to_its_product_once():
    space = [{"transfer": "threshold", "threshold": [0.5, 0.9], "block_length": [4, 8]}, {"steps": 4}, {"steps": [4]}]
    settings = expand(space)
    assert len(settings) == 5 and settings[-1] == {"steps": 4}
    assert {"transfer": "threshold", "threshold": 0.9, "block_length": 4} in settings


@pytest.mark.parametrize(
    "space, message",
    [
        ({"steps": [4]}, "must be a non-empty list of groups"),
        ([{"stepz": [4]}], "space[0]: unknown generate field 'stepz' (did you mean steps"),
        ([{"steps": 4}, {"temperature": [0.5]}], "space[1]: 'temperature' is fixed by the task"),
        ([{}], "space[0] must be a non-empty mapping"),
        ([{"steps": 4}, {"transfer": "stochastic", "steps": []}], "space[1]: 'steps' has no values"),
    ],
)
def test_bad_spaces_are_named(space, message):
    with pytest.raises(ValueError) as err:
        expand(space)
    assert message in str(err.value)


def test_settings_generate_refuses_are_refused_before_anything_runs():
    oracle = OracleDenoiser(ChainLanguage())
    with pytest.raises(ValueError, match=r'setting \{"threshold":0.9\}: threshold=0.9 is read only by'):
        check_settings(oracle, expand([{"threshold": 0.9}]), 8)


def _brute_front(rows):
    def beats(a, b):
        return (
            a["quality"] >= b["quality"]
            and a["tokens_per_s"] >= b["tokens_per_s"]
            and a != b
            and (a["quality"] > b["quality"] or a["tokens_per_s"] > b["tokens_per_s"])
        )

    return {id(r) for r in rows if not any(beats(o, r) for o in rows)}


def test_front_is_exactly_the_undominated_rows():
    rng = random.Random(0)
    for _ in range(50):
        rows = [
            {"quality": rng.choice([0.1, 0.5, 0.9]), "tokens_per_s": rng.choice([10, 20, 30]), "dropped_after": None}
            for _ in range(8)
        ]
        front = pareto_front(rows)
        assert {id(r) for r in front} == _brute_front(rows)
        assert [r["tokens_per_s"] for r in front] == sorted(r["tokens_per_s"] for r in front)


def _row(quality, speed, spread=1.0, nfe=1.0, positions=8.0, steps=None):
    """A measured row: ``speed`` tokens/s with its rounds within ``spread`` of it."""
    return {
        "setting": {"steps": steps},
        "quality": quality,
        "tokens_per_s": speed,
        "tokens_per_s_min": speed - spread,
        "tokens_per_s_max": speed + spread,
        "nfe_per_token": nfe,
        "positions_per_token": positions,
        "dropped_after": None,
    }


def test_choice_is_the_fastest_within_the_tolerance():
    front = [_row(0.99, 10), _row(0.975, 20), _row(0.9, 50)]  # speeds resolved: the ranges of rounds are disjoint
    assert choose(front, 0.02)["tokens_per_s"] == 20
    assert choose(front, 0.1)["tokens_per_s"] == 50
    assert choose(front, 0.0)["tokens_per_s"] == 10
    assert choose(front, objective=lambda r: r["quality"] * r["tokens_per_s"])["tokens_per_s"] == 50


def test_unresolved_speeds_choose_the_cheaper_setting_and_resolved_ones_the_faster():
    """README's first example with one round: 16 steps at 53 tokens/s against 8 steps (half the forwards) at 51, the
    same quality: a difference the timing cannot resolve picks the cheaper; a resolved one the faster."""
    sixteen, eight = _row(1.0, 53, 4, nfe=1.0, steps=16), _row(1.0, 51, 4, nfe=0.5, steps=8)
    assert choose([sixteen, eight], rounds=5) is eight  # ranges [49, 57] and [47, 55] overlap
    assert pareto_front([sixteen, eight]) == [eight, sixteen]  # equal on the front: neither beats the other
    assert choose([sixteen, eight], rounds=1) is eight  # one round resolves nothing
    assert choose([sixteen, eight], rounds=3) is eight  # three rounds neither (1/10 of equal speeds look resolved)
    faster = _row(1.0, 80, 4, nfe=1.0, steps=16)
    assert choose([faster, eight], rounds=5) is faster and choose([faster, eight], rounds=4) is faster
    assert choose([faster, eight], rounds=1) is eight
    # equal forwards: fewer positions computed, then the earlier in the space
    cached = _row(1.0, 52, 4, nfe=0.5, positions=4.0, steps=8)
    assert choose([sixteen, eight, cached]) is cached
    # the tolerance gives up quality for a resolved speed only: a cheaper setting of lower quality at a speed the
    # timing does not tell apart is beaten (off the front)
    worse = _row(0.99, 51, 4, nfe=0.5, steps=8)
    assert pareto_front([sixteen, worse]) == [sixteen] and choose([sixteen, worse], tolerance=0.02) is sixteen
    quick = _row(0.99, 80, 4, nfe=0.5, steps=8)  # resolved: the fastest within the tolerance
    assert choose([sixteen, quick], tolerance=0.02) is quick and choose([sixteen, quick], tolerance=0.0) is sixteen
    first, second = _row(1.0, 50, 4, nfe=0.5, steps=1), _row(1.0, 54, 4, nfe=0.5, steps=2)
    assert choose([first, second]) is first and choose([second, first]) is second
    # the output says so
    note = choice_note(pareto_front([sixteen, eight], 5), eight, 0.02, 5)
    assert "2 settings within the tolerance" in note and "ranges of rounds overlap" in note
    assert "the cheapest of them is chosen" in note and '`{"steps":16}`' in note
    assert "fewer than 4 rounds resolve none" in choice_note(pareto_front([faster, eight], 1), eight, 0.02, 1)
    assert (
        choice_note(pareto_front([faster, eight], 5), faster, 0.02, 5)
        == "It is the only setting on the front within the tolerance."
    )
    quick_note = choice_note(pareto_front([sixteen, quick], 5), quick, 0.02, 5)
    assert (
        quick_note == "Its speed is resolved from every other setting within the tolerance (5 rounds, disjoint ranges)."
    )


def test_rows_a_halving_search_dropped_are_never_chosen():
    kept, dropped = _row(0.9, 50, nfe=1.0), {**_row(0.95, 50, nfe=0.1), "dropped_after": 0}
    assert choose([kept, dropped], tolerance=0.1) is kept


def _speeds(settings, slow_key=None):
    """Deterministic speeds: a forward per step, so tokens/s = 1000 / steps; ``slow_key`` ten times slower (every
    round alike: the ranges are points)."""
    speeds = {setting_key(s): 1000 / s["steps"] / (10 if setting_key(s) == slow_key else 1) for s in settings}
    return {key: {"tokens_per_s": v, "tokens_per_s_min": v, "tokens_per_s_max": v} for key, v in speeds.items()}


def _chain_fronts(model, tmp_path, language):
    settings = expand(CHAIN_SPACE)
    speeds = _speeds(settings)
    task = SyntheticTask(language, 16)
    rows = {}
    for how in ("grid", "halving"):
        cache = CellCache(tmp_path / f"{how}.json")
        rows[how] = search(model, task, settings, speeds, cache, how, min_samples=32, max_samples=128)
    return rows


def test_halving_finds_the_grid_front_with_fewer_samples_on_the_oracle(tmp_path):
    """The chain language with its oracle: random order at 16 steps (SER about 0.5) ties left-to-right's speed with
    a far lower quality, so halving drops it after its first 32 samples; both searches give the same front."""
    rows = _chain_fronts(OracleDenoiser(ChainLanguage()), tmp_path, ChainLanguage())
    fronts = {how: [setting_key(r["setting"]) for r in pareto_front(found)] for how, found in rows.items()}
    brute = _brute_front(rows["grid"])  # the grid's front, by brute force in this test
    assert {setting_key(r["setting"]) for r in rows["grid"] if id(r) in brute} == set(fronts["halving"])
    assert fronts["grid"] == fronts["halving"]
    dropped = [r for r in rows["halving"] if r["dropped_after"] is not None]
    assert [r["setting"] for r in dropped] == [{"transfer": "stochastic", "strategy": "random", "steps": 16}]
    assert dropped[0]["samples"] == 32 and dropped[0]["dropped_after"] == 0
    used = {how: sum(r["samples"] for r in found) for how, found in rows.items()}
    assert used == {"grid": 5 * 128, "halving": 5 * 128 - 96}
    front = pareto_front(rows["grid"])
    assert all(
        not any(o["quality"] > r["quality"] and o["tokens_per_s"] >= r["tokens_per_s"] for o in rows["grid"])
        for r in front
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny MDM trained briefly on a 2-gram language with every sequence valid but one pruned transition."""
    from datasets import Dataset
    from transformers import TrainingArguments

    from hf_mdm.training import build_trainer

    language = NGramLanguage.random(vocab_size=4, n=2, seed=0, prune_threshold=0.2)
    rows = language.sample(2048, 8, generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": rows.tolist()})
    folder = tmp_path_factory.mktemp("trained")
    args = TrainingArguments(
        output_dir=str(folder / "run"),
        per_device_train_batch_size=64,
        max_steps=150,
        learning_rate=3e-3,
        report_to=[],
        logging_steps=1000,
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    trainer = build_trainer("mdm", data, data, vocab_size=4, length=8, args=args)
    trainer.train()
    trainer.model.save_pretrained(folder / "model")
    language.save_pretrained(folder / "model" / "language")
    return folder / "model", language


def test_halving_and_grid_agree_on_a_trained_model(trained, tmp_path):
    folder, language = trained
    model = MDMForMaskedDiffusion.from_pretrained(folder).eval()
    settings = expand([{"transfer": "stochastic", "strategy": "random", "steps": [1, 2, 8]}])
    slow = setting_key(settings[2])
    speeds = _speeds(settings, slow_key=slow)  # 8 steps, ten times slower: dominated once 1 or 2 steps beat it
    task = SyntheticTask(language, 8)
    grid = search(model, task, settings, speeds, CellCache(tmp_path / "g.json"), "grid", 32, 256)
    halving = search(model, task, settings, speeds, CellCache(tmp_path / "h.json"), "halving", 32, 256)
    assert [setting_key(r["setting"]) for r in pareto_front(grid)] == [
        setting_key(r["setting"]) for r in pareto_front(halving)
    ]
    brute = _brute_front(grid)
    assert {setting_key(r["setting"]) for r in grid if id(r) in brute} == {
        setting_key(r["setting"]) for r in pareto_front(halving)
    }
    assert sum(r["samples"] for r in halving) <= sum(r["samples"] for r in grid)


def test_tune_writes_the_front_and_a_config_generate_uses(trained, tmp_path):
    folder, language = trained
    model = MDMForMaskedDiffusion.from_pretrained(folder).eval()
    space = [
        {"transfer": "stochastic", "strategy": "random", "steps": [2, 8]},
        {"transfer": "threshold", "strategy": "confidence", "threshold": 0.9},
    ]
    out = tmp_path / "tune"
    result = tune(model, SyntheticTask(language, 8), space, out, min_samples=16, max_samples=32, rounds=2)
    front = json.loads((out / "front.json").read_text())
    assert front["chosen"]["on_front"] and front["held_out"]["samples"] == 32
    for row in front["rows"]:
        assert {"setting", "quality", "quality_ci_low", "quality_ci_high", "samples", "nfe_per_token"} <= set(row)
        assert {"positions_per_token", "tokens_per_s", "on_front"} <= set(row)
        assert row["quality_ci_low"] <= row["quality"] <= row["quality_ci_high"]
    assert (out / "front.csv").read_text().count("\n") == 4 and (out / "front.png").stat().st_size > 0
    assert "Chosen (the fastest on the front within 0.02 of the best quality" in (out / "front.md").read_text()
    assert front["why"] and front["why"] in (out / "front.md").read_text()  # why this one, in words
    # the chosen setting, put in a model folder, is what generate does by default
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    write_generation_config(copy, result["chosen"]["setting"])
    reloaded = MDMForMaskedDiffusion.from_pretrained(copy).eval()
    prompt = torch.zeros(4, 0, dtype=torch.long)
    by_default = reloaded.generate(prompt, max_new_tokens=8, seed=3, temperature=1.0)
    explicit = model.generate(prompt, max_new_tokens=8, seed=3, temperature=1.0, **result["chosen"]["setting"])
    assert torch.equal(by_default, explicit)


def test_the_saved_config_is_the_measured_setting_and_generate_reproduces_it(trained, tmp_path, capsys):
    """hf-mdm tune --save-to-model writes every field the measurement ran with (temperature 1 included): generate
    from the folder, with the held-out split's seed, draws the held-out samples again, so its quality is the
    measured one."""
    from hf_mdm.experiments.fast import generate_batches
    from hf_mdm.tuning.tasks import TEST_SEED

    folder, language = trained
    shutil.copytree(folder, tmp_path / "model")
    (tmp_path / "space.yaml").write_text(yaml.safe_dump([{"transfer": "stochastic", "strategy": "random", "steps": 4}]))
    argv = ["tune", "--model", str(tmp_path / "model"), "--space", str(tmp_path / "space.yaml"), "--length", "8"]
    argv += ["--output-dir", str(tmp_path / "out"), "--min-samples", "32", "--max-samples", "32", "--rounds", "1"]
    assert cli.main(argv + ["--save-to-model", "--threads", "1"]) == 0
    assert "temperature=1.0, stop_at_eos=False, max_new_tokens=8" in capsys.readouterr().out
    front = json.loads((tmp_path / "out" / "front.json").read_text())
    saved = json.loads((tmp_path / "model" / "generation_config.json").read_text())
    assert {k: saved[k] for k in front["generation_config"]} == front["generation_config"]
    assert saved["temperature"] == 1.0 and saved["steps"] == 4 and saved["max_new_tokens"] == 8
    reloaded = MDMForMaskedDiffusion.from_pretrained(tmp_path / "model").eval()
    drawn = reloaded.generate(torch.zeros(32, 0, dtype=torch.long), seed=TEST_SEED)
    model = MDMForMaskedDiffusion.from_pretrained(folder).eval()
    measured = next(generate_batches(model, 32, 8, TEST_SEED, front["chosen"]["setting"])).sequences
    assert torch.equal(drawn, measured) and len({tuple(r) for r in drawn.tolist()}) > 1
    assert int(language.in_support(drawn).sum()) / 32 == front["held_out"]["quality"]


def test_a_killed_tune_resumes_to_the_same_front(tmp_path, monkeypatch):
    """The cache of a finished run with its last chunks removed (a kill mid-run): the same call measures only those
    chunks again and writes the same front."""
    language = ChainLanguage()
    oracle, task = OracleDenoiser(language), SyntheticTask(language, 16)
    first = tune(oracle, task, CHAIN_SPACE, tmp_path / "a", min_samples=32, max_samples=64, rounds=2)
    cells = json.loads((tmp_path / "a" / "cache.json").read_text())
    chunks = sorted(k for k in cells if k.startswith("chunk|") and "|dev|" in k)
    kept = {k: v for k, v in cells.items() if k not in chunks[:3]}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "cache.json").write_text(json.dumps(kept))
    calls = []
    measure = SyntheticTask.measure
    monkeypatch.setattr(SyntheticTask, "measure", lambda self, *a, **k: calls.append(a) or measure(self, *a, **k))
    second = tune(oracle, task, CHAIN_SPACE, tmp_path / "b", min_samples=32, max_samples=64, rounds=2)
    assert len(calls) == 3
    assert [r["on_front"] for r in second["rows"]] == [r["on_front"] for r in first["rows"]]
    assert [r["quality"] for r in second["rows"]] == [r["quality"] for r in first["rows"]]


def test_cli_tune_on_the_oracle_and_its_errors(tmp_path, capsys):
    language = ChainLanguage()
    language.save_pretrained(tmp_path / "lang")
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(CHAIN_SPACE))
    argv = ["tune", "--model", "oracle", "--language", str(tmp_path / "lang"), "--space", str(tmp_path / "space.yaml")]
    argv += ["--length", "8", "--output-dir", str(tmp_path / "out"), "--min-samples", "16", "--max-samples", "32"]
    assert cli.main(argv + ["--rounds", "2", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "| front | setting |" in printed and "samples used:" in printed
    assert json.loads((tmp_path / "out" / "front.json").read_text())["search"] == "halving"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump([{"transfer": "stochastic", "stepz": [2]}]))
    bad = [a if a != str(tmp_path / "space.yaml") else str(tmp_path / "bad.yaml") for a in argv]
    assert cli.main(bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown generate field 'stepz'" in err[0]
    assert not (tmp_path / "out2").exists()


def test_cli_tune_on_a_tiny_lm_eval_task(tmp_path, capsys, monkeypatch):
    """hf-mdm tune --task: the tiny MDM on mdm_gsm8k, two settings, two then four development documents each, the
    chosen one on four held-out documents; the rows carry the harness's counted costs."""
    import os

    from hf_mdm.harness.tiny import build_tiny_models

    monkeypatch.setenv(
        "HF_MDM_DATA_DIR", os.environ.get("HF_MDM_DATA_DIR", str(Path(__file__).parents[3] / "shared" / "data"))
    )
    paths = build_tiny_models(tmp_path / "models")
    space = [{"transfer": "stochastic", "strategy": "random", "steps": [4, 8]}]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    argv = ["tune", "--model", paths["mdm"], "--task", "mdm_gsm8k", "--space", str(tmp_path / "space.yaml")]
    argv += ["--max-gen-toks", "8", "--output-dir", str(tmp_path / "out"), "--min-samples", "2", "--max-samples", "4"]
    assert (
        cli.main(argv + ["--rounds", "1", "--timing-rows", "2", "--batch-size", "2", "--ar-model", paths["llama"]]) == 0
    )
    front = json.loads((tmp_path / "out" / "front.json").read_text())
    assert [r["samples"] for r in front["rows"]] == [4, 4] and front["held_out"]["samples"] == 4
    by_steps = {r["setting"]["steps"]: r for r in front["rows"]}
    # a step that reveals nothing runs no forward: at most 4 and 8 forwards for the 8 tokens
    assert 0 < by_steps[4]["nfe_per_token"] <= 4 / 8 < by_steps[8]["nfe_per_token"] <= 1.0
    assert front["quality_name"].startswith("mdm_gsm8k exact_match")
    assert (
        front["baseline"]["samples"] == 4 and front["baseline"]["tokens_per_s"] > 0
    )  # the tiny Llama on the same docs
    assert front["baseline"]["nfe_per_token"] == pytest.approx(1.0, abs=0.5)  # one forward a token (stops early)
    oracle = ["tune", "--model", "oracle"] + argv[3:]
    assert cli.main(oracle) == 2 and "--task runs a checkpoint through lm-eval" in capsys.readouterr().err
    bad_task = argv[:4] + ["nosuchtask"] + argv[5:]
    assert cli.main(bad_task) == 2 and "--task nosuchtask: no such lm-eval task" in capsys.readouterr().err
    # more timed documents than the task has: one line naming both numbers and what to change, nothing measured
    big = [a if a != str(tmp_path / "out") else str(tmp_path / "big") for a in argv] + ["--timing-rows", "5000"]
    assert cli.main(big) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "--timing-rows 5000 is more than the 1319 documents of mdm_gsm8k: pass --timing-rows 1319 or fewer"
    )
    assert not (tmp_path / "big").exists()
    # the whole setting measured: the chosen one, the task's temperature 0 and the generated length
    config = front["generation_config"]
    assert front["chosen"]["setting"].items() <= config.items() and config["temperature"] == 0.0
    assert config["max_new_tokens"] == 8
    # the chosen setting in a model folder is what the lm-eval model samples with by default
    from hf_mdm.harness.evaluator import create_lm

    shutil.copytree(paths["mdm"], tmp_path / "chosen")
    write_generation_config(tmp_path / "chosen", front["chosen"]["setting"])
    resolved = create_lm("hf_mdm", {"pretrained": str(tmp_path / "chosen")})._resolve_generation_config({})
    assert {k: getattr(resolved, k) for k in front["chosen"]["setting"]} == front["chosen"]["setting"]


def test_an_objective_picks_the_chosen_setting(tmp_path):
    language = ChainLanguage()
    oracle, task = OracleDenoiser(language), SyntheticTask(language, 16)
    picked = tune(
        oracle, task, CHAIN_SPACE, tmp_path, min_samples=32, max_samples=32, rounds=1, objective=lambda r: -r["quality"]
    )
    front = [r for r in picked["rows"] if r["on_front"]]
    assert (
        picked["chosen"]["quality"] == min(r["quality"] for r in front)
        and picked["rule"] == "the objective's best on the front"
    )


def test_likelihood_quality_is_the_samples_mean_log_q_per_token(tmp_path):
    """On the chain every valid sequence of 16 tokens has log q = -log 16 - 15 log 4: one token a step left to right
    with the oracle (an exact sampler) scores exactly that per token, with a zero-width interval; two steps of the
    paper's sampler produce invalid sequences, whose log q is -inf, and no interval can lift them."""
    import math

    language = ChainLanguage()
    task = SyntheticTask(language, 16, quality="likelihood")
    settings = expand(CHAIN_SPACE)
    rows = search(
        OracleDenoiser(language), task, settings, _speeds(settings), CellCache(tmp_path / "c.json"), "grid", 32, 64
    )
    by_key = {setting_key(r["setting"]): r for r in rows}
    exact = by_key[setting_key(settings[-1])]
    assert exact["quality"] == pytest.approx(-(math.log(16) + 15 * math.log(4)) / 16)
    assert exact["quality_ci_low"] == pytest.approx(exact["quality"]) == pytest.approx(exact["quality_ci_high"])
    assert by_key[setting_key(settings[0])]["quality"] == -math.inf
    assert task.quality_name.startswith("mean log q(x) per token")
    assert exact in pareto_front(rows)


def test_front_json_is_strict_json_with_null_for_minus_infinity(tmp_path):
    language = ChainLanguage()
    task = SyntheticTask(language, 16, quality="likelihood")
    tune(OracleDenoiser(language), task, CHAIN_SPACE, tmp_path, min_samples=16, max_samples=16, rounds=1)

    def refuse(constant):
        raise AssertionError(f"{constant} in front.json")

    front = json.loads((tmp_path / "front.json").read_text(), parse_constant=refuse)
    steps2 = next(r for r in front["rows"] if r["setting"].get("steps") == 2)
    assert steps2["quality"] is None and steps2["quality_ci_low"] is None  # invalid samples: log q = -inf
    assert front["chosen"]["quality"] < 0  # the tolerance rule picks among finite qualities near the best
