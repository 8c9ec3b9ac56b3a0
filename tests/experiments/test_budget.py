"""Block sizes at equal training FLOPs (hf_mdm.experiments.budget): the FLOP count, the budget's steps, the seed
statistics and the sentences they allow."""

import math
import statistics

import pytest
from scipy import stats

from hf_mdm.experiments.budget import budget_plan, difference_verdict, equal_flops_summary, mean_interval
from hf_mdm.training import step_flops


def analytic_step_flops(positions: int, logits: int, batch: int, attention_products: int) -> int:
    """One training step of the "tiny" size (hidden 64, 2 layers, 4 heads, MLP 192) over a vocabulary of 16 + 1, by
    hand: per layer and position the q, k, v, o projections (4 d^2) and the gated MLP (3 d m), the LM head at
    ``logits`` positions, each 2 FLOPs a multiply-add, forward and twice that backward; attention's dense S x S
    products (each 2 S^2 d per layer) ``attention_products`` times: SDPA 2 forward + 5 backward (scores recomputed),
    eager 2 + 4."""
    d, layers, mlp, vocab = 64, 2, 192, 17
    linear = 2 * batch * positions * layers * (4 * d * d + 3 * d * mlp) + 2 * batch * logits * d * vocab
    return 3 * linear + attention_products * 2 * batch * positions**2 * d * layers


@pytest.mark.parametrize("implementation, products", [("sdpa", 7), ("eager", 6)])
@pytest.mark.parametrize("length, batch", [(8, 1), (16, 3)])
def test_step_flops_equal_the_count_by_hand_attention_included(implementation, products, length, batch):
    """The MDM reads L positions; block diffusion the noisy and the clean copy, 2L positions, its logits at the L
    noisy ones; AR reads BOS + L. Attention's share grows with L, so the count per token does too."""
    count = lambda *args: step_flops(*args, attn_implementation=implementation)
    assert count("mdm", 16, length, "tiny", batch) == analytic_step_flops(length, length, batch, products)
    block = count("mdm", 16, length, "tiny", batch, 4)
    assert block == analytic_step_flops(2 * length, length, batch, products)
    assert count("ar", 16, length, "tiny", batch) == analytic_step_flops(length + 1, length + 1, batch, products)


def test_step_flops_per_token_grow_with_the_length_through_attention():
    per_token = [step_flops("mdm", 16, length, "tiny") / length for length in (16, 128)]
    assert per_token[1] > 1.2 * per_token[0]


def test_budget_plan_gives_every_model_the_mdm_budget():
    section = {
        "length": 8,
        "block_sizes": [2, 4, 8, 3],  # 8 is the MDM itself, 3 does not divide L: neither is a block model
        "budget_mdm_steps": 100,
        "language": {"vocab_size": 16},
        "training": {"size": "tiny", "batch_size": 4},
    }
    plan = budget_plan(section)
    assert [p["model"] for p in plan] == [
        "AR (KV cache)",
        "MDM (b = L = 8)",
        "block diffusion (b = 2)",
        "block diffusion (b = 4)",
    ]
    budget = 100 * plan[1]["step_flops"]
    for p in plan:
        assert abs(p["steps"] * p["step_flops"] - budget) <= p["step_flops"] / 2  # steps rounded to the nearest
    assert plan[2]["steps"] < 67  # about half the MDM's steps: the block objective reads 2L positions


def test_mean_interval_is_the_student_t_interval():
    values = [0.11, 0.07, 0.09, 0.15]
    mean, low, high = mean_interval(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    assert (mean, low, high) == pytest.approx((0.105, 0.105 - half, 0.105 + half))
    assert math.isnan(mean_interval([0.2])[1])
    assert mean_interval([0.3, 0.3]) == (0.3, 0.3, 0.3)


def _rows(block_gaps: list[float]) -> list[dict]:
    """An MDM and a block model over len(block_gaps) seeds: the MDM's gaps 0.10, 0.12, ...; SERs equal."""
    rows = []
    for seed, gap in enumerate(block_gaps):
        common = {"seed": seed, "steps": 1, "sequences": 1, "tokens": 1, "flops": 1, "ser": 0.2 + 0.01 * seed}
        rows.append({**common, "model": "MDM (b = L = 16)", "gap": 0.10 + 0.02 * seed})
        rows.append({**common, "model": "block diffusion (b = 4)", "gap": gap})
    return rows


def test_a_difference_is_called_only_where_its_paired_interval_excludes_zero():
    """Seed by seed the block model 0.01 below the MDM (noise 0.001): lower, though the two means' own intervals
    overlap (the seeds differ more than the models); scattered around the MDM's: not resolved."""
    lower = _rows([0.091, 0.109, 0.131, 0.149])
    summary = equal_flops_summary(lower)
    mdm, block = summary
    assert block["gap_low"] < mdm["gap_high"]  # unpaired, the intervals overlap
    assert block["d_gap"] == pytest.approx(-0.01)
    assert difference_verdict(block, "gap", "gap").startswith("gap lower than the MDM's (-0.0100 [")
    assert "not resolved" in difference_verdict(block, "ser", "SER")  # equal SERs: a zero-width interval at 0
    higher = equal_flops_summary(_rows([0.111, 0.129, 0.151, 0.169]))[1]
    assert difference_verdict(higher, "gap", "gap").startswith("gap higher than the MDM's")
    scattered = equal_flops_summary(_rows([0.13, 0.10, 0.16, 0.12]))[1]
    assert "not resolved from the MDM's" in difference_verdict(scattered, "gap", "gap")
    assert "d_gap" not in mdm and mdm["seeds"] == 4
