"""Host synchronisations: `count_host_syncs` counts the operations a GPU run waits on; the count-based samplers
(deterministic and stochastic counts) read nothing back inside a block: their reads per call do not grow with the
number of steps, and grow by a small constant per block; the adaptive ones read one value per step, speculative
decoding one per round."""

import pytest
import torch
from tiny_mdm import MASK, tiny_mdm

from hf_mdm import MDMForMaskedDiffusion
from hf_mdm.host_syncs import count_host_syncs

# the rows still running, the block's masked counts (the deterministic count table is built from them on the host;
# before, two copies to the CPU read them, which the counter does not see), the block's columns and its count table
READS_PER_BLOCK = 4
# the stochastic counts also read the block's reveal probabilities from the schedule: a tensor on the host (the time
# grid), which the counter cannot tell from a device tensor on a CPU run
SCHEDULE_READS = {"deterministic": 0, "stochastic": 1}


@pytest.fixture(scope="module")
def model() -> MDMForMaskedDiffusion:
    return tiny_mdm()


def test_the_counter_counts_reads_and_data_dependent_shapes():
    t = torch.arange(6)
    with count_host_syncs() as syncs:
        int(t[0]), bool(t.any()), t.tolist(), t.nonzero(), t[t > 2], torch.unique(t)
        t.clone()[t > 4] = 0
        t + 1, t.sum(), t[1:3], torch.where(t > 2, t, 0), t.topk(2)  # fixed shapes, nothing read
    assert dict(syncs.by_op) == {
        "_local_scalar_dense": 2,
        "tolist": 1,
        "nonzero": 1,
        "index": 1,
        "_unique2": 1,
        "index_put_": 1,
    }
    assert syncs.total == 7


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_reads_are_counted_once_in_either_mode(mode):
    """Under inference mode a CPU tensor's ``.item()`` dispatches no operator: the read is counted at the method."""
    with mode():
        t = torch.arange(6)
    with count_host_syncs() as syncs, mode():
        int(t[0]), bool(t.any()), float(t[1]), t[2].item(), range(t[3]), t.tolist()
    assert dict(syncs.by_op) == {"_local_scalar_dense": 5, "tolist": 1}


def _syncs(model, **settings) -> tuple[int, torch.Tensor, int]:
    prompt = torch.randint(0, MASK, (2, 5), generator=torch.Generator().manual_seed(1))
    with count_host_syncs() as syncs:
        out = model.generate(prompt, max_new_tokens=24, return_dict_in_generate=True, seed=0, **settings)
    return syncs.total, out.sequences, out.nfe


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("transfer", ["deterministic", "stochastic"])
@pytest.mark.parametrize("strategy", ["confidence", "margin", "entropy", "left_to_right"])
def test_count_based_samplers_read_nothing_inside_a_block(model, transfer, strategy, temperature):
    """Greedy or sampled: the proposals at the block's columns draw the same number of tokens every step."""
    settings = dict(transfer=transfer, strategy=strategy, temperature=temperature)
    few, _, few_nfe = _syncs(model, steps=6, block_length=8, **settings)
    many, _, many_nfe = _syncs(model, steps=24, block_length=8, **settings)
    assert many_nfe > 2 * few_nfe  # more forwards ...
    assert many == few  # ... and not one more read
    one_block, _, _ = _syncs(model, steps=24, **settings)
    six_blocks, _, _ = _syncs(model, steps=24, block_length=4, **settings)
    assert 0 < (six_blocks - one_block) / 5 <= READS_PER_BLOCK + SCHEDULE_READS[transfer]


@pytest.mark.parametrize(
    "settings", [dict(transfer="threshold", threshold=1.0), dict(transfer="entropy_bound", entropy_bound=1e-3)]
)
def test_adaptive_samplers_read_one_value_per_step(model, settings):
    """An adaptive rule's counts come from the step's proposals: one read per step says whether the block is done."""
    few, _, few_nfe = _syncs(model, steps=6, block_length=8, **settings)
    many, _, many_nfe = _syncs(model, steps=24, block_length=8, **settings)
    assert many_nfe > 2 * few_nfe
    assert many - few == many_nfe - few_nfe


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_papers_sampler_reads_nothing_inside_a_block(model, temperature):
    """Each position's step is drawn at the block's start: the steps then write with fixed shapes."""
    settings = dict(transfer="stochastic", strategy="random", temperature=temperature, block_length=8)
    few, _, few_nfe = _syncs(model, steps=6, **settings)
    many, _, many_nfe = _syncs(model, steps=24, **settings)
    assert many_nfe > 2 * few_nfe
    assert many == few


@pytest.mark.parametrize("variant", ["cap", "conf", "loop"])
def test_remdm_reads_one_value_per_step(model, variant):
    """A remasked position's step is drawn when it is remasked: a step reads how many positions it reveals."""
    settings = dict(transfer="stochastic", strategy="random", temperature=1.0, block_length=8, remdm=variant)
    settings.update(
        {"cap": dict(remdm_eta=0.2), "conf": {}, "loop": dict(remdm_t_on=0.6, remdm_t_off=0.2, remdm_eta=0.2)}[variant]
    )
    few, _, _ = _syncs(model, steps=6, **settings)
    many, _, _ = _syncs(model, steps=24, **settings)
    assert many - few == 24 - 6


def test_recording_scores_reads_nothing(model):
    """output_scores / output_logits write the step's scores where it reveals, with fixed shapes."""
    plain, plain_tokens, _ = _syncs(model, steps=24, block_length=8)
    recorded, tokens, _ = _syncs(model, steps=24, block_length=8, output_scores=True, output_logits=True)
    assert torch.equal(tokens, plain_tokens)
    assert recorded == plain


@pytest.mark.parametrize("transfer", ["deterministic", "stochastic", "threshold"])
def test_eos_early_stop_reads_one_value_per_step(model, transfer):
    """A row that stops leaves the block on the device; a step reads whether any row still runs."""
    settings = dict(transfer=transfer, block_length=8, eos_early_stop=True, eos_token_id=3)
    if transfer == "threshold":
        settings["threshold"] = 1.0
    few, _, few_nfe = _syncs(model, steps=6, **settings)
    many, _, many_nfe = _syncs(model, steps=24, **settings)
    assert many_nfe > 2 * few_nfe
    assert many - few == many_nfe - few_nfe


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_decoding_reads_one_value_per_round(model, temperature):
    """Speculative decoding reads back, once a round, the rows still running and the round's width: one read per
    forward (``nfe`` counts the rounds), and a small constant per block. (Unpadded rows: with padding, the model's
    attention mask reads whether any is padded at each forward.)"""
    prompt = torch.randint(0, MASK, (3, 5), generator=torch.Generator().manual_seed(1))

    def reads(new: int, block_length=None) -> tuple[int, int]:
        with count_host_syncs() as syncs:
            out = model.generate(
                prompt,
                max_new_tokens=new,
                block_length=block_length,
                transfer="speculative",
                draft_length=3,
                temperature=temperature,
                stop_at_eos=False,
                seed=0,
                return_dict_in_generate=True,
            )
        return syncs.total, out.nfe

    few, few_nfe = reads(8)
    many, many_nfe = reads(32)
    assert many_nfe > few_nfe + 4
    assert many - few == many_nfe - few_nfe
    blocks, blocks_nfe = reads(32, block_length=4)  # 8 blocks
    assert 0 < (blocks - many - (blocks_nfe - many_nfe)) / 7 <= READS_PER_BLOCK


def _reads_between_forwards(model, **settings) -> list[int]:
    """The host reads between each two consecutive forwards of one call (one block, so a step's reads only)."""
    prompt = torch.randint(0, MASK, (2, 5), generator=torch.Generator().manual_seed(1))
    marks: list[int] = []
    with count_host_syncs() as syncs:
        handle = model.register_forward_pre_hook(lambda module, args: marks.append(syncs.total))
        try:
            model.generate(prompt, max_new_tokens=24, steps=12, seed=0, **settings)
        finally:
            handle.remove()
    assert len(marks) == 12
    return [b - a for a, b in zip(marks, marks[1:])]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    "settings, per_step",
    [
        (dict(transfer="threshold", threshold=1.0), 1),
        (dict(transfer="threshold", threshold=1.0, kv_cache="dual"), 1),
        (dict(transfer="entropy_bound", entropy_bound=1e-3), 1),
        (dict(transfer="deterministic", strategy="confidence"), 0),
        (dict(transfer="stochastic", strategy="confidence"), 0),
    ],
)
def test_host_reads_of_each_step(model, settings, per_step, temperature):
    """Counted step by step, between one forward and the next: the threshold step reads one value (whether the
    block is done, and how many positions the next step asks logits at), at temperature 0 and 1 (the draws read
    nothing), and so does the entropy bound; a fixed rule's step reads none."""
    assert _reads_between_forwards(model, temperature=temperature, **settings) == [per_step] * 11
