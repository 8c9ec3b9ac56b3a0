"""The reverse-process sampler: semantics, reproducibility, padding, infilling, transfer counts, bad input."""

import itertools
import math
import warnings

import pytest
import torch
from tiny_mdm import MASK, tiny_mdm
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.modeling_outputs import MaskedLMOutput

from hf_mdm import MDMConfig
from hf_mdm.generation import (
    MaskedDiffusionGenerationConfig,
    deterministic_counts,
    diffusion_generate,
    resolve_config,
    split_steps,
)
from hf_mdm.schedules import get_schedule


@pytest.fixture(scope="module")
def model():
    return tiny_mdm(sharpen=20)  # a sharper random network: fewer near-ties in the confidences


def prompt(bsz=2, length=5, seed=0):
    return torch.randint(0, MASK, (bsz, length), generator=torch.Generator().manual_seed(seed))


SCHEDULES = ["linear", "cosine", "polynomial", "loglinear", "geometric"]
TRANSFERS = ["stochastic", "deterministic", "threshold"]
STRATEGIES = ["random", "confidence", "margin", "entropy", "left_to_right"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_combination_fills_all_masks_and_keeps_prompt(model, schedule):
    x = prompt()
    for transfer, strategy in itertools.product(TRANSFERS, STRATEGIES):
        out = model.generate(
            x,
            max_new_tokens=10,
            steps=6,
            block_length=4,
            schedule=schedule,
            transfer=transfer,
            strategy=strategy,
            threshold=0.3 if transfer == "threshold" else None,  # read by the threshold transfer only
            temperature=0.8,
            top_k=10,
            top_p=0.95,
            seed=3,
            return_dict_in_generate=True,
        )
        seq = out.sequences
        assert seq.shape == (2, 15)
        assert not (seq == MASK).any(), (schedule, transfer, strategy)
        assert torch.equal(seq[:, :5], x)
        assert out.nfe == out.steps <= 6 + 2  # a block gets at least one step: 3 blocks may need up to 8
        assert out.num_generated_tokens.tolist() == [10, 10]


def test_left_to_right_one_token_per_step_is_autoregressive(model):
    out = model.generate(
        prompt(1),
        max_new_tokens=8,
        steps=8,
        strategy="left_to_right",
        output_history=True,
        return_dict_in_generate=True,
    )
    assert out.nfe == 8
    for i, canvas in enumerate(out.history):
        generated = canvas[0, 5:]
        assert not (generated[: i + 1] == MASK).any() and (generated[i + 1 :] == MASK).all()


def test_seed_reproducibility_and_batch_invariance(model):
    x = prompt(3)
    a = model.generate(x, max_new_tokens=8, steps=4, temperature=1.0, strategy="random", transfer="stochastic", seed=7)
    b = model.generate(x, max_new_tokens=8, steps=4, temperature=1.0, strategy="random", transfer="stochastic", seed=7)
    c = model.generate(x, max_new_tokens=8, steps=4, temperature=1.0, strategy="random", transfer="stochastic", seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    full = model.generate(x, max_new_tokens=8, steps=4, block_length=4)
    for row in range(3):  # temperature 0 + non-random strategy: a row does not depend on its batch-mates
        alone = model.generate(x[row : row + 1], max_new_tokens=8, steps=4, block_length=4)
        assert torch.equal(alone[0], full[row])


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_unpadded(model, side):
    short, long = prompt(1, 3, seed=1), prompt(1, 6, seed=2)
    pad = torch.zeros(1, 3, dtype=torch.long)
    padded_short = torch.cat([pad, short], 1) if side == "left" else torch.cat([short, pad], 1)
    mask_row = torch.tensor([[0, 0, 0, 1, 1, 1]]) if side == "left" else torch.tensor([[1, 1, 1, 0, 0, 0]])
    batch = torch.cat([padded_short, long])
    attention_mask = torch.cat([mask_row, torch.ones(1, 6, dtype=torch.long)])
    kwargs = dict(max_new_tokens=8, steps=8, block_length=4)
    out = model.generate(batch, attention_mask=attention_mask, **kwargs)
    assert torch.equal(out[0, 6:], model.generate(short, **kwargs)[0, 3:])
    assert torch.equal(out[1], model.generate(long, **kwargs)[0])
    assert torch.equal(out[0, :6], padded_short[0])  # pads are kept, never generated


def test_infilling_masks_inside_the_prompt(model):
    x = prompt(2, 8)
    x[:, 2] = MASK
    x[1, 5] = MASK
    out = model.generate(x, max_new_tokens=0, output_history=True, return_dict_in_generate=True)
    assert not (out.sequences == MASK).any()
    keep = x != MASK
    assert torch.equal(out.sequences[keep], x[keep])
    assert out.nfe == 2  # default steps: one per masked token (the largest row count)
    both = model.generate(x, max_new_tokens=4)
    assert both.shape == (2, 12) and not (both == MASK).any()


def llada_reference_generate(model, prompt, attention_mask, steps, gen_length, block_length, cfg_scale=0.0):
    """LLaDA's generate() at temperature 0 with low-confidence remasking, re-stated from its documented rules."""
    bsz, plen = prompt.shape
    x = torch.full((bsz, plen + gen_length), MASK, dtype=torch.long)
    x[:, :plen] = prompt
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, torch.ones(bsz, gen_length, dtype=attention_mask.dtype)], 1)
    prompt_index = x != MASK
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    spb = steps // num_blocks
    nfe = 0
    for b in range(num_blocks):
        lo, hi = plen + b * block_length, plen + (b + 1) * block_length
        block_masks = (x[:, lo:hi] == MASK).sum(1)
        schedule = [[int(m) // spb + (1 if i < int(m) % spb else 0) for i in range(spb)] for m in block_masks]
        for i in range(spb):
            mask_index = x == MASK
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = MASK
                am = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
                logits = model(torch.cat([x, un_x]), attention_mask=am).logits
                cond, uncond = logits.chunk(2)
                logits = uncond + (cfg_scale + 1) * (cond - uncond)
            else:
                logits = model(x, attention_mask=attention_mask).logits
            nfe += any(schedule[j][i] for j in range(bsz))  # hf_mdm skips steps that reveal nothing
            x0 = logits.argmax(-1)
            assert not (x0[mask_index] == MASK).any(), "the reference chose [MASK]; pick another seed"
            p = torch.softmax(logits, -1)
            conf = torch.gather(p, -1, x0[..., None]).squeeze(-1)
            conf[:, hi:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, conf, torch.tensor(-float("inf")))
            for j in range(bsz):
                k = schedule[j][i]
                if k:
                    idx = torch.topk(conf[j], k=k).indices
                    x[j, idx] = x0[j, idx]
    return x, nfe


@pytest.mark.parametrize(
    "bsz,steps,gen_length,block_length,cfg",
    [
        (1, 8, 8, 8, 0.0),
        (1, 12, 12, 4, 0.0),
        (1, 15, 12, 4, 0.0),
        (1, 4, 16, 8, 0.0),
        (3, 8, 16, 4, 0.0),
        (2, 6, 12, 4, 1.5),
    ],
)
def test_matches_llada_reference_token_for_token(model, bsz, steps, gen_length, block_length, cfg):
    torch.manual_seed(bsz * 100 + steps)
    x = torch.randint(0, MASK, (bsz, 6))
    attention_mask = None
    if bsz > 1:  # left padding of different lengths
        attention_mask = torch.ones(bsz, 6, dtype=torch.long)
        attention_mask[1, :2] = 0
        x[1, :2] = 0
        if bsz > 2:
            attention_mask[2, :4] = 0
            x[2, :4] = 0
    with torch.no_grad():
        expected, nfe = llada_reference_generate(model, x, attention_mask, steps, gen_length, block_length, cfg)
    out = model.generate(
        x,
        attention_mask=attention_mask,
        max_new_tokens=gen_length,
        steps=steps,
        block_length=block_length,
        cfg_scale=cfg,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert out.nfe == nfe * (2 if cfg else 1)  # LLaDA runs `steps` forwards even when a step reveals nothing


@pytest.mark.parametrize("m0,steps", [(32, 5), (7, 7), (5, 8), (128, 128), (13, 4), (1, 3)])
def test_deterministic_counts_equal_llada_rule(m0, steps):
    counts = deterministic_counts(torch.tensor([m0]), steps, get_schedule("linear"))[0].tolist()
    assert counts == [m0 // steps + (1 if i < m0 % steps else 0) for i in range(steps)]


@pytest.mark.parametrize("schedule", ["cosine", "polynomial", "geometric"])
def test_deterministic_counts_follow_the_schedule(schedule):
    sched = get_schedule(schedule)
    m0, steps = 100, 10
    counts = deterministic_counts(torch.tensor([m0]), steps, sched)[0]
    assert int(counts.sum()) == m0
    t = [1 - i / steps for i in range(steps + 1)]
    alphas = [sched.alpha(v) for v in t]
    total = alphas[-1] - alphas[0]
    floors = [math.floor(m0 * (alphas[i + 1] - alphas[i]) / total + 1e-9) for i in range(steps)]
    extra = m0 - sum(floors)
    assert counts.tolist() == [f + (1 if i < extra else 0) for i, f in enumerate(floors)]


def test_per_step_counts_seen_in_history(model):
    out = model.generate(
        prompt(2), max_new_tokens=12, steps=6, block_length=4, output_history=True, return_dict_in_generate=True
    )
    masked = [int((h[0] == MASK).sum()) for h in out.history]
    revealed = [12 - masked[0]] + [a - b for a, b in zip(masked, masked[1:])]
    assert revealed == [2, 2, 2, 2, 2, 2]  # 3 blocks of 4 tokens, 2 steps each


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_stochastic_reveal_frequency_matches_schedule(schedule):
    """Each still-masked position is revealed at step i with probability (alpha(s) - alpha(t)) / (1 - alpha(t))."""

    class Uniform(torch.nn.Module):  # a network with flat logits: the test is about the transfer rule only
        config = MDMConfig(vocab_size=5, mask_token_id=4, hidden_size=8, num_attention_heads=1)

        def forward(self, input_ids, **kwargs):
            return MaskedLMOutput(logits=torch.zeros(*input_ids.shape, 5))

    steps, length, rows = 5, 40, 200
    out = diffusion_generate(
        Uniform(),
        torch.zeros(rows, 1, dtype=torch.long),
        max_new_tokens=length,
        steps=steps,
        schedule=schedule,
        transfer="stochastic",
        strategy="random",
        output_history=True,
        return_dict_in_generate=True,
        seed=0,
    )
    sched = get_schedule(schedule)
    before = torch.full((rows,), length)
    canvases = list(out.history)
    assert len(canvases) == steps
    for i, canvas in enumerate(canvases):
        after = (canvas[:, 1:] == 4).sum(1)
        t, s = 1 - i / steps, 1 - (i + 1) / steps
        p = (sched.alpha(s) - sched.alpha(t)) / (1 - sched.alpha(t))
        n = int(before.sum())
        observed = int((before - after).sum()) / n
        assert abs(observed - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (i, observed, p)
        before = after


def test_mask_is_never_sampled():
    class LovesMask(torch.nn.Module):
        config = MDMConfig(vocab_size=6, mask_token_id=5, hidden_size=8, num_attention_heads=1)

        def forward(self, input_ids, **kwargs):
            logits = torch.zeros(*input_ids.shape, 6)
            logits[..., 5] = 50.0
            return MaskedLMOutput(logits=logits)

    for temperature in (0.0, 1.0):
        out = diffusion_generate(
            LovesMask(), torch.zeros(4, 2, dtype=torch.long), max_new_tokens=6, temperature=temperature
        )
        assert not (out == 5).any()


class ScriptedModel(torch.nn.Module):
    """Logits that make position j (of the generation region) prefer token script[j]."""

    def __init__(self, script, start, vocab=12, mask=11, eos=3):
        super().__init__()
        self.config = MDMConfig(
            vocab_size=vocab, mask_token_id=mask, eos_token_id=eos, pad_token_id=0, hidden_size=8, num_attention_heads=1
        )
        self.script, self.start = script, start
        self.calls = 0

    def forward(self, input_ids, **kwargs):
        self.calls += 1
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for j, token in enumerate(self.script):
            logits[:, self.start + j, token] = 10.0 - 0.1 * j
        return MaskedLMOutput(logits=logits)


def test_eos_pads_the_rest_and_finished_rows_stop_between_blocks():
    model = ScriptedModel([5, 6, 3, 7, 8, 9, 7, 8], start=2)
    out = diffusion_generate(
        model,
        torch.ones(1, 2, dtype=torch.long),
        max_new_tokens=8,
        steps=8,
        block_length=4,
        return_dict_in_generate=True,
    )
    assert out.sequences[0].tolist() == [1, 1, 5, 6, 3, 0, 0, 0, 0, 0]
    assert out.nfe == 4 and model.calls == 4  # the second block never runs
    assert out.num_generated_tokens.tolist() == [3]
    assert out.unfinished.tolist() == [False]  # padding after EOS is not a missing token
    keep_going = diffusion_generate(
        model, torch.ones(1, 2, dtype=torch.long), max_new_tokens=8, steps=8, block_length=4, stop_at_eos=False
    )
    assert keep_going[0].tolist() == [1, 1, 5, 6, 3, 7, 8, 9, 7, 8]


def test_stopping_criteria_streamer_and_logits_processor(model):
    class StopAfterFirstBlock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 9, dtype=torch.bool)

    out = model.generate(
        prompt(2),
        max_new_tokens=8,
        block_length=4,
        steps=8,
        pad_token_id=0,
        stopping_criteria=StoppingCriteriaList([StopAfterFirstBlock()]),
        return_dict_in_generate=True,
    )
    assert out.nfe == 4 and (out.sequences[:, 9:] == 0).all() and out.num_generated_tokens.tolist() == [4, 4]

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    seq = model.generate(prompt(1), max_new_tokens=8, steps=8, strategy="random", seed=0, streamer=streamer)
    assert streamer.ended and sum(streamer.chunks, []) == seq[0].tolist()
    assert len(streamer.chunks) > 2  # tokens arrive as the left-most prefix becomes final

    class Ban(LogitsProcessor):
        def __call__(self, input_ids, scores):
            scores[:, :10] = -float("inf")
            return scores

    seq = model.generate(prompt(2), max_new_tokens=8, logits_processor=LogitsProcessorList([Ban()]))
    assert (seq[:, 5:] >= 10).all()


def test_top_k_one_equals_greedy(model):
    x = prompt(2)
    # left_to_right: the order does not depend on confidences (which top-k = 1 makes all 1.0)
    greedy = model.generate(x, max_new_tokens=8, steps=4, strategy="left_to_right")
    sampled = model.generate(x, max_new_tokens=8, steps=4, strategy="left_to_right", temperature=1.5, top_k=1, seed=0)
    assert torch.equal(greedy, sampled)


def test_threshold_reveals_confident_tokens_and_respects_step_budget(model):
    x = prompt(2)
    loose = model.generate(
        x, max_new_tokens=12, steps=12, transfer="threshold", threshold=1e-6, return_dict_in_generate=True
    )
    assert loose.nfe == 1  # every proposal clears a tiny threshold: one step
    strict = model.generate(
        x, max_new_tokens=12, steps=3, transfer="threshold", threshold=1.0, return_dict_in_generate=True
    )
    assert strict.nfe == 3 and not (strict.sequences == MASK).any()  # the budget forces 4 tokens a step


def test_awkward_but_legal_settings(model):
    x = prompt(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # honoured as documented: nothing to warn about
        out = model.generate(x, max_new_tokens=10, steps=7, block_length=3, return_dict_in_generate=True)  # 4 blocks
        assert not (out.sequences == MASK).any() and out.nfe == 7
        out = model.generate(x, max_new_tokens=4, steps=20, return_dict_in_generate=True)  # more steps than tokens
        assert not (out.sequences == MASK).any() and out.nfe == 4
    with pytest.warns(UserWarning, match="steps=2 is fewer than the 4 blocks"):
        out = model.generate(x, max_new_tokens=8, steps=2, block_length=2, return_dict_in_generate=True)  # < blocks
    assert not (out.sequences == MASK).any() and out.nfe == 4


def test_fewer_steps_than_blocks_warns_how_many_steps_run(model):
    """Every block takes at least one step, so steps below the number of blocks cannot be honoured: the call says
    so and how many forwards run, instead of changing them silently."""
    with pytest.warns(UserWarning, match=r"steps=3 is fewer than the 4 blocks .* so 4 steps \(forward passes\) run"):
        out = model.generate(prompt(1), max_new_tokens=16, block_length=4, steps=3, return_dict_in_generate=True)
    assert out.nfe == out.steps == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact = model.generate(prompt(1), max_new_tokens=4, block_length=4, steps=3, return_dict_in_generate=True)
    assert exact.nfe == 3


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integer_prompts_of_any_dtype_give_the_int64_tokens(model, dtype):
    x = prompt(2)
    expected = model.generate(x, max_new_tokens=6, steps=3)
    got = model.generate(x.to(dtype), max_new_tokens=6, steps=3)
    assert got.dtype == torch.long and torch.equal(got, expected)


def test_a_transfer_parameter_counts_only_where_its_transfer_runs(model):
    """A transfer's own parameter is a ValueError when the call names it under another transfer (see
    test_bad_input), but not when it comes from below the call with its own transfer, nor from a preset."""
    saved = model.generation_config
    model.generation_config = MaskedDiffusionGenerationConfig(transfer="threshold", threshold=0.9)
    try:
        config = resolve_config(model, None, {"transfer": "deterministic", "max_new_tokens": 4})
        assert config.transfer == "deterministic"  # the saved threshold is the saved transfer's, overridden
        assert resolve_config(model, None, {"threshold": 0.5}).threshold == 0.5
    finally:
        model.generation_config = saved
    block_causal = tiny_mdm(block_size=8)
    for preset in (
        MaskedDiffusionGenerationConfig.llada2(gen_length=8, block_length=8, steps=4),
        MaskedDiffusionGenerationConfig.llada21(gen_length=8, block_length=8),
    ):
        resolve_config(block_causal, preset, {})
    with pytest.raises(ValueError, match="threshold=0.9 is read only by transfer='threshold'.*not by transfer="):
        model.generate(prompt(1), max_new_tokens=4, threshold=0.9)


def test_block_length_of_a_block_causal_model_nests_with_its_blocks():
    """Decoding blocks line up with a block-causal model's attention blocks: its block size by default, a multiple
    (whole attention blocks) or a divisor; a length that cuts across them is a ValueError (see test_bad_input)."""
    model = tiny_mdm(block_size=4)
    assert resolve_config(model, None, {}).block_length == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the block size and its divisors: nothing to say
        for length in (1, 2, 4):
            assert resolve_config(model, None, {"block_length": length}).block_length == length
    with pytest.warns(UserWarning, match=r"block_length=16 spans 4 attention blocks .* computes all 16 positions"):
        out = model.generate(prompt(1), max_new_tokens=16, block_length=16, return_dict_in_generate=True)
    assert out.sequences.shape[1] == prompt(1).shape[1] + 16
    with pytest.raises(ValueError, match=r"block_length=3 .*model.config.block_size=4.*pass block_length=4"):
        model.generate(prompt(1), max_new_tokens=4, block_length=3)


def test_max_time_flags_and_warns_about_rows_left_unfinished(model):
    x = prompt(2)
    with pytest.warns(UserWarning, match=r"max_time=0.0 s\): 12 position\(s\) in 2 row\(s\) were not generated"):
        out = model.generate(x, max_new_tokens=8, block_length=2, max_time=0.0, return_dict_in_generate=True)
    assert out.unfinished.tolist() == [True, True] and out.num_generated_tokens.tolist() == [2, 2]
    assert (out.sequences[:, 7:] == MASK).all()  # no pad id: the missing tokens are still [MASK]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        done = model.generate(x, max_new_tokens=8, block_length=2, max_time=60.0, return_dict_in_generate=True)
    assert done.unfinished.tolist() == [False, False] and not (done.sequences == MASK).any()


def test_split_steps():
    assert split_steps(12, [4, 4, 4]) == [4, 4, 4]
    assert split_steps(7, [4, 4]) == [4, 3]
    assert split_steps(2, [4, 4, 4]) == [1, 1, 1]
    assert split_steps(10, [8, 2]) == [8, 2]
    assert split_steps(None, [3, 0, 2]) == [3, 0, 2]
    assert sum(split_steps(9, [5, 1, 1])) == 9 and min(split_steps(9, [5, 1, 1])) >= 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(steps=0), "steps"),
        (dict(block_length=0), "block_length"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(schedule="nope"), "unknown schedule"),
        (dict(strategy="nope"), "unknown strategy"),
        (dict(transfer="nope"), "unknown transfer"),
        (dict(transfer="threshold"), "threshold"),
        (dict(transfer="threshold", threshold=1.5), "threshold"),
        (dict(threshold=0.0), "threshold"),
        (dict(max_new_tokens=200), "max_position_embeddings"),
        (dict(cfg_scale=-1.0), "cfg_scale"),
        (dict(temperature=-0.5), "temperature"),
        (dict(stepz=3), "unknown generation argument"),
    ],
)
def test_bad_input_raises_value_error(model, kwargs, match):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        model.generate(prompt(1), **kwargs)


def test_bad_input_shapes_and_missing_mask_id(model):
    with pytest.raises(ValueError, match="attention_mask"):
        model.generate(prompt(2), attention_mask=torch.ones(2, 3), max_new_tokens=4)
    with pytest.raises(ValueError, match="2-D"):
        model.generate(torch.tensor([1, 2, 3]), max_new_tokens=4)

    class NoMask(torch.nn.Module):
        def forward(self, input_ids, **kwargs):
            return MaskedLMOutput(logits=torch.zeros(*input_ids.shape, 4))

    with pytest.raises(ValueError, match="mask token id"):
        diffusion_generate(NoMask(), torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2)
    out = diffusion_generate(NoMask(), torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, mask_token_id=3)
    assert out.shape == (1, 4) and not (out == 3).any()


def test_generation_config_object_and_aliases(model):
    config = MaskedDiffusionGenerationConfig(max_new_tokens=6, steps=3, strategy="low_confidence")
    a = model.generate(prompt(1), generation_config=config)
    b = model.generate(prompt(1), max_new_tokens=6, steps=3, strategy="confidence")
    assert torch.equal(a, b)
    c = model.generate(prompt(1), max_new_tokens=6, steps=3, strategy="topk_margin")
    d = model.generate(prompt(1), max_new_tokens=6, steps=3, strategy="margin")
    assert torch.equal(c, d)
