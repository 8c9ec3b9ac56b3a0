"""The scales of the experiment configs (`hf_mdm.experiments.scales`): every config offers each, the first look
runs the same keys (so the same code path and findings) as the quick scale, and its measured CPU minutes fit the
20 minutes `make reproduce` promises on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_mdm.cli_reproduce import AFTER, CONFIG_DIR, EXPERIMENT_CONFIGS
from hf_mdm.experiments import load_scale
from hf_mdm.experiments.scales import CPU_MINUTES, SCALES, estimate_line, wall_estimate


def key_paths(value, path=""):
    """The paths of a scale's settings (a list's entries, such as languages, are its own to choose)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from [f"{path}.{key}", *key_paths(inner, f"{path}.{key}")]


@pytest.mark.parametrize("name", EXPERIMENT_CONFIGS)
def test_every_config_offers_every_scale_and_the_first_look_has_quicks_keys(name):
    scales = {p: load_scale(CONFIG_DIR / f"{name}.yaml", scale_name=p)[1] for p in SCALES}
    assert set(key_paths(scales["first_look"])) == set(key_paths(scales["quick"]))
    assert scales["first_look"].get("num_samples", 0) <= scales["quick"].get("num_samples", 0)


def test_the_first_look_fits_twenty_minutes_on_two_cores_and_the_lines_say_so():
    assert set(CPU_MINUTES["first_look"]) == set(EXPERIMENT_CONFIGS) == set(CPU_MINUTES["quick"])
    minutes = wall_estimate("first_look", list(EXPERIMENT_CONFIGS), jobs=2, after=AFTER)
    table = CPU_MINUTES["first_look"]
    # ter and ser side by side; block diffusion after ter, samplers then rl (ser's models) after ser; wallclock alone
    chains = (table["ter_vs_steps"] + table["block_diffusion"], table["ser_vs_steps"] + table["samplers"] + table["rl"])
    assert minutes == pytest.approx(max(chains) + table["wallclock"])
    assert minutes <= 20 and wall_estimate("first_look", ["rl"], jobs=2) == table["rl"]
    assert wall_estimate("full", ["rl"], jobs=2) is None
    assert estimate_line("quick", "ter_vs_steps") == f"about {CPU_MINUTES['quick']['ter_vs_steps']:.1f} CPU-min"
    assert "no estimate" in estimate_line("full", "rl")


def test_a_config_without_the_asked_scale_says_which(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("experiment: rl\nquick: {}\nfull: {}\n")
    with pytest.raises(ValueError, match=f"{path}: missing the `first_look` field"):
        load_scale(Path(path), scale_name="first_look")
