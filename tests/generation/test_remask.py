"""ReMDM remasking (``remdm``): step laws against the formulas, eta = 0 against the paper's sampler, where remasking
may act, the count of forwards, and the model classes (hf_mdm's, native LLaDA and Dream, the oracle).

Statistical checks: every binomial or normal check rejects at a two-sided false-alarm rate of 1e-4; a test runs at
most 120 of them (10 steps x 6 positions x reveal and remask), so (Bonferroni) its false-alarm rate is below 1.2e-2.
Seeds are fixed, so a run is reproducible.
"""

import math

import pytest
import torch
from sampler_prompts import left_padded_prompts
from tiny_mdm import tiny_dream, tiny_llada, tiny_mdm

from hf_mdm.generation import diffusion_generate
from hf_mdm.generation_canvas import block_spans, prepare_canvas
from hf_mdm.generation_remask import LoopSchedule
from hf_mdm.languages import NGramLanguage, OracleDenoiser
from hf_mdm.schedules import get_schedule

ALPHA = 1e-4  # two-sided false-alarm rate of one check
MASK, VOCAB = 30, 31
VARIANTS = {
    "cap": dict(remdm="cap", remdm_eta=0.3),
    "rescale": dict(remdm="rescale", remdm_eta=0.6),
    "conf": dict(remdm="conf"),
    "loop": dict(remdm="loop", remdm_eta=0.5, remdm_t_on=0.7, remdm_t_off=0.3),
}
PLAIN = dict(transfer="stochastic", strategy="random")


@pytest.fixture(scope="module")
def oracle():
    return OracleDenoiser(NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1))


@pytest.fixture(scope="module")
def models():
    return {
        "mdm": tiny_mdm(num_hidden_layers=1, max_position_embeddings=64),
        "llada": tiny_llada(layers=1),
        "dream": tiny_dream(layers=1),
    }


def padded_prompts(length=4, seed=0):
    return left_padded_prompts(MASK, length=length, seed=seed)


# -- the formulas, written out ---------------------------------------------------------------------------------------


def step_laws(variant: str, eta: float, num_steps: int, t_on=None, t_off=None):
    """Per step i of the linear schedule (alpha(t) = 1 - t): sigma_i (for conf, the eta sigma_max shared by the
    softmax) and the reveal probability of a masked position, from the issue's formulas."""
    out = []
    for i in range(num_steps):
        t, s = 1 - i / num_steps, 1 - (i + 1) / num_steps
        alpha = (
            (lambda u: 1 - u)
            if variant != "loop"
            else (lambda u: 1 - (u if u >= t_on else t_on if u >= t_off else u * t_on / t_off))
        )
        a_t, a_s = alpha(t), alpha(s)
        sigma_max = 1.0 if a_t == 0 else min(1.0, (1 - a_s) / a_t)
        sigma = {"cap": min(eta, sigma_max), "rescale": eta * sigma_max, "conf": eta * sigma_max}.get(variant)
        if variant == "loop":
            sigma = eta if (t <= t_on + 1e-12 and s >= t_off - 1e-12) else 0.0
        masked_sigma = 0.0 if variant == "conf" else sigma
        reveal = 1.0 if i == num_steps - 1 else (a_s - (1 - masked_sigma) * a_t) / (1 - a_t)
        out.append((sigma if i < num_steps - 1 else 0.0, reveal))
    return out


def binomial_p_value(k: int, n: int, p: float) -> float:
    """Exact two-sided p-value of k successes in n Bernoulli(p) trials (the outcomes no likelier than k)."""
    if p in (0.0, 1.0):
        return 1.0 if k == n * p else 0.0
    pmf = (
        torch.distributions.Binomial(n, torch.tensor(p, dtype=torch.float64))
        .log_prob(torch.arange(n + 1, dtype=torch.float64))
        .exp()
    )
    return float(pmf[pmf <= pmf[k] * (1 + 1e-9)].sum())


def normal_p_value(observed: float, mean: float, variance: float) -> float:
    """Two-sided p-value of a sum of independent Bernoulli trials (normal approximation; hundreds of events)."""
    return math.erfc(abs(observed - mean) / math.sqrt(2 * variance))


# -- (a) the step laws -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_step_marginals_match_the_formulas(oracle, variant):
    """Over 3000 rows, at every step and position, the remask frequency of a revealed token and the reveal frequency
    of a masked position match sigma_t and (alpha_s - (1 - sigma_t) alpha_t) / (1 - alpha_t) (binomial tests); for
    conf, the least confident revealed token of a row and the others are each remasked at the rate the softmax gives
    them."""
    settings, num_steps, length = VARIANTS[variant], 10, 6
    out = diffusion_generate(
        oracle,
        torch.zeros(3000, 0, dtype=torch.long),
        max_new_tokens=length,
        steps=num_steps,
        temperature=1.0,
        seed=11,
        output_history=True,
        return_dict_in_generate=True,
        **settings,
    )
    canvases = [torch.full((3000, length), oracle.config.mask_token_id)] + list(out.history)
    assert len(canvases) == num_steps + 1  # every step changed some row
    laws = step_laws(
        variant, settings.get("remdm_eta", 1.0), num_steps, settings.get("remdm_t_on"), settings.get("remdm_t_off")
    )
    confidence = torch.zeros(3000, length, dtype=torch.float64)
    conf_groups = torch.zeros(2, 3)  # (least confident, others) x (remasked, expected, variance)
    for i, (before, after) in enumerate(zip(canvases[:-1], canvases[1:])):
        masked, masked_after = before == oracle.config.mask_token_id, after == oracle.config.mask_token_id
        revealed_now, remasked = masked & ~masked_after, ~masked & masked_after
        sigma, reveal = laws[i]
        for position in range(length):  # each position's frequencies, at each step
            n, k = int(masked[:, position].sum()), int(revealed_now[:, position].sum())
            assert binomial_p_value(k, n, reveal) > ALPHA, (i, position, k, n, reveal)
            n, k = int((~masked[:, position]).sum()), int(remasked[:, position].sum())
            assert variant == "conf" or binomial_p_value(k, n, sigma) > ALPHA, (i, position, k, n, sigma)
        if variant == "conf":
            conf_groups += conf_remask_counts(confidence, ~masked, remasked, sigma)
            probs = oracle(before).logits.double().softmax(-1)
            confidence = torch.where(revealed_now, probs.gather(-1, after[..., None])[..., 0], confidence)
    assert not (canvases[-1] == oracle.config.mask_token_id).any()
    if variant == "conf":
        for observed, mean, variance in conf_groups.tolist():
            assert mean > 50 and normal_p_value(observed, mean, variance) > ALPHA, (observed, mean)


def conf_remask_counts(confidence, revealed, remasked, budget):
    """(2, 3): for the least confident revealed token of each row and for the others, the remasks observed, their
    expectation and variance under sigma_i = budget * softmax over the row's revealed tokens of -confidence."""
    weights = torch.softmax((-confidence).masked_fill(~revealed, -math.inf), dim=1).nan_to_num(0.0)
    sigma = budget * weights
    least = torch.zeros_like(revealed)
    rows = revealed.any(1)
    least[rows, (-confidence).masked_fill(~revealed, -math.inf)[rows].argmax(1)] = True
    out = torch.zeros(2, 3)
    for g, group in enumerate((least & revealed, ~least & revealed)):
        out[g] = torch.tensor(
            [float(remasked[group].sum()), float(sigma[group].sum()), float((sigma * (1 - sigma))[group].sum())]
        )
    return out


# -- (b) eta = 0 is the paper's sampler ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_eta_zero_is_the_plain_sampler_token_for_token(oracle, models, variant):
    """With eta = 0 nothing is remasked, and the random draws are the paper's sampler's: the same tokens and forwards
    under the same seed (loop: the plain sampler on the loop's alpha, which holds alpha(t_on) on the window)."""
    settings = {**VARIANTS[variant], "remdm_eta": 0.0}
    plain = dict(PLAIN)
    if variant == "loop":
        plain["schedule"] = LoopSchedule(get_schedule("cosine"), settings["remdm_t_on"], settings["remdm_t_off"])
    ids, attention = padded_prompts()
    runs = [(oracle, torch.zeros(16, 0, dtype=torch.long), None), (models["mdm"], ids, attention)]
    for model, prompt, mask in runs:
        for seed in range(3):
            common = dict(
                attention_mask=mask,
                max_new_tokens=11,
                steps=7,
                block_length=4,
                temperature=1.0,
                top_k=20,
                seed=seed,
                return_dict_in_generate=True,
            )
            ours = diffusion_generate(model, prompt, schedule="cosine", **settings, **common)
            paper = diffusion_generate(model, prompt, **{"schedule": "cosine", **plain}, **common)
            assert torch.equal(ours.sequences, paper.sequences) and ours.nfe == paper.nfe, (variant, seed)


def test_remasking_changes_the_law(oracle):
    """The comparison above can fail: with eta > 0 the same seed gives other tokens and more forwards."""
    prompt = torch.zeros(64, 0, dtype=torch.long)
    plain = diffusion_generate(
        oracle, prompt, max_new_tokens=8, steps=8, temperature=1.0, seed=0, return_dict_in_generate=True, **PLAIN
    )
    for settings in VARIANTS.values():
        ours = diffusion_generate(
            oracle, prompt, max_new_tokens=8, steps=8, temperature=1.0, seed=0, return_dict_in_generate=True, **settings
        )
        assert not torch.equal(ours.sequences, plain.sequences)


# -- (c) where remasking acts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_remasking_stays_in_the_current_block_and_off_the_prompt(models, variant):
    """Between consecutive canvases of output_history, every change (reveal or remask) is at a generated position of
    one block, blocks go left to right, the prompt and padding never change, and remasks do happen."""
    ids, attention = padded_prompts()
    prompt = torch.cat([ids[:, :2], torch.full((3, 1), MASK), ids[:, 3:]], 1)  # a mask inside the prompt: infilled
    settings = {**VARIANTS[variant], "remdm_eta": 1.0 if variant != "loop" else 0.4}
    out = diffusion_generate(
        models["mdm"],
        prompt,
        attention_mask=attention,
        max_new_tokens=9,
        block_length=4,
        steps=30,
        temperature=1.0,
        seed=3,
        output_history=True,
        return_dict_in_generate=True,
        **settings,
    )
    gen_mask = prepare_canvas(prompt, attention, 9, MASK).gen_mask0
    spans = block_spans(gen_mask, 4)
    canvases = [torch.cat([prompt, torch.full((3, 9), MASK)], 1)] + list(out.history)
    current, remasks = 0, 0
    for before, after in zip(canvases[:-1], canvases[1:]):
        changed = before != after
        assert not (changed & ~gen_mask).any()
        columns = changed.any(0).nonzero().flatten()
        block = next(b for b, (start, end) in enumerate(spans) if start <= int(columns[0]) < end)
        assert block >= current and int(columns[-1]) < spans[block][1]
        current = block
        remasks += int((changed & (after == MASK)).sum())
    assert remasks > 0 and current == len(spans) - 1
    kept = attention.bool()
    kept[:, 2] = False
    assert not (out.sequences == MASK).any() and torch.equal(out.sequences[:, :4][kept], ids[kept])


# -- (d) forwards ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg_scale", [0.0, 0.5])
def test_nfe_counts_every_forward(models, cfg_scale):
    model, calls = models["mdm"], []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        ids, attention = padded_prompts()
        for settings in VARIANTS.values():
            calls.clear()
            out = diffusion_generate(
                model,
                ids,
                attention_mask=attention,
                max_new_tokens=8,
                steps=10,
                block_length=4,
                temperature=1.0,
                cfg_scale=cfg_scale,
                seed=0,
                return_dict_in_generate=True,
                **settings,
            )
            assert out.nfe == len(calls) * (2 if cfg_scale else 1) and len(calls) <= out.steps
    finally:
        handle.remove()


# -- (f) model classes, padding, caches ------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llada", "dream", "mdm"])
def test_native_models_with_left_padding(models, arch):
    """A left-padded batch on each model class: prompt and pads kept, no mask left, reproducible under a seed; the
    block cache with a refresh at every forward gives the tokens of no cache."""
    ids, attention = padded_prompts()
    settings = dict(
        attention_mask=attention,
        max_new_tokens=8,
        block_length=4,
        temperature=1.0,
        seed=5,
        remdm="rescale",
        remdm_eta=0.8,
        return_dict_in_generate=True,
        output_history=True,
    )
    out = diffusion_generate(models[arch], ids, **settings)
    seq = out.sequences
    assert seq.shape == (3, 12) and not (seq[:, 4:] == MASK).any() and torch.equal(seq[:, :4], ids)
    assert any(((a == MASK) & (b != MASK)).any() for b, a in zip(out.history[:-1], out.history[1:]))  # remasks
    assert torch.equal(diffusion_generate(models[arch], ids, **settings).sequences, seq)
    cached = diffusion_generate(models[arch], ids, kv_cache="dual", kv_cache_refresh=1, **settings)
    assert torch.equal(cached.sequences, seq) and cached.nfe == out.nfe


def test_loop_schedule_holds_alpha_on_the_window():
    loop = LoopSchedule(get_schedule("linear"), 0.6, 0.2)
    t = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2, 0.1, 0.0], dtype=torch.float64)
    torch.testing.assert_close(loop.alpha(t), torch.tensor([0.0, 0.2, 0.4, 0.4, 0.4, 0.7, 1.0], dtype=torch.float64))
    torch.testing.assert_close(
        loop.weight(torch.tensor([0.8, 0.4, 0.1], dtype=torch.float64)),
        torch.tensor([1 / 0.8, 0.0, 3 / 0.3], dtype=torch.float64),
    )  # -alpha' / (1 - alpha)


def test_lm_eval_model_remasks_and_eta_zero_is_the_papers_sampler(tmp_path):
    """Real lm-eval GSM8K requests through the `hf_mdm` model: `remdm=cap, remdm_eta=0` answers as the paper's
    sampler does (same seed, same forwards), and eta > 0 remasks (another answer, more forwards)."""
    from hf_mdm.harness import MaskedDiffusionLM, simple_evaluate
    from hf_mdm.harness.evaluator import build_task_manager
    from hf_mdm.harness.tiny import build_tiny_models

    tiny = build_tiny_models(tmp_path)
    answers, nfe = {}, {}
    for name, settings in (
        ("cap 0", dict(remdm="cap", remdm_eta=0.0)),
        ("paper", dict(transfer="stochastic", strategy="random")),
        ("cap 0.2", dict(remdm="cap", remdm_eta=0.2)),
    ):
        model = MaskedDiffusionLM(
            pretrained=tiny["mdm"], device="cpu", max_gen_toks=16, temperature=1.0, steps=16, **settings
        )
        results = simple_evaluate(
            model, tasks=["mdm_gsm8k"], limit=1, log_samples=True, task_manager=build_task_manager(["mdm_gsm8k"])
        )
        answers[name], nfe[name] = results["samples"]["mdm_gsm8k"][0]["resps"], model.timing.records[0].nfe
    assert (answers["cap 0"], nfe["cap 0"]) == (answers["paper"], nfe["paper"])
    assert answers["cap 0.2"] != answers["paper"] and nfe["cap 0.2"] > nfe["paper"]


def test_published_loop_schedule_holds_alpha_on():
    """ReMDM-loop as published (alpha_on 0.9, window [0.05, 0.55]): for the linear schedule alpha is
    0.9 (1 - t) / 0.45 before the window, 0.9 on it, 0.9 + 0.1 (1 - t / 0.05) after; the weight is -alpha'/(1-alpha)."""
    from hf_mdm.generation_remask import REMDM_LOOP_PUBLISHED

    on, off, a = (REMDM_LOOP_PUBLISHED[k] for k in ("remdm_t_on", "remdm_t_off", "remdm_alpha_on"))
    loop = LoopSchedule(get_schedule("linear"), on, off, a)
    t = torch.tensor([1.0, 0.8, 0.55, 0.3, 0.05, 0.025, 0.0], dtype=torch.float64)
    hand = [0.0, 0.9 * 0.2 / 0.45, 0.9, 0.9, 0.9, 0.95, 1.0]
    torch.testing.assert_close(loop.alpha(t), torch.tensor(hand, dtype=torch.float64))
    for tt in (0.8, 0.3, 0.02):  # finite differences of alpha against the weight
        h = 1e-6
        slope = (loop.alpha(tt + h) - loop.alpha(tt - h)) / (2 * h)
        assert loop.weight(tt) == pytest.approx(-slope / (1 - loop.alpha(tt)), rel=1e-5, abs=1e-9)


def test_published_loop_runs_and_validates():
    from hf_mdm.generation_remask import REMDM_LOOP_PUBLISHED
    from hf_mdm.languages import ChainLanguage, OracleDenoiser

    oracle = OracleDenoiser(ChainLanguage())
    empty = torch.zeros(64, 0, dtype=torch.long)
    out = diffusion_generate(
        oracle,
        empty,
        max_new_tokens=16,
        steps=32,
        remdm="loop",
        seed=0,
        stop_at_eos=False,
        output_history=True,
        return_dict_in_generate=True,
        temperature=1.0,
        **REMDM_LOOP_PUBLISHED,
    )
    assert not (out.sequences == 16).any()
    history = torch.stack(out.history)
    assert bool(((history[:-1] != 16) & (history[1:] == 16)).any())  # some token was taken back on the window
    # unset, the window, alpha_on and eta are the published ones: the same call, the same tokens
    published = dict(max_new_tokens=16, steps=32, remdm="loop", seed=0, stop_at_eos=False, temperature=1.0)
    by_default = diffusion_generate(oracle, empty[:4], **published)
    assert torch.equal(by_default, diffusion_generate(oracle, empty[:4], **published, **REMDM_LOOP_PUBLISHED))
    assert not torch.equal(by_default, diffusion_generate(oracle, empty[:4], **{**published, "remdm_eta": 0.0}))
    with pytest.raises(ValueError, match=r"remdm_alpha_on=1.5"):
        diffusion_generate(
            oracle, empty, max_new_tokens=4, remdm="loop", **{**REMDM_LOOP_PUBLISHED, "remdm_alpha_on": 1.5}
        )
    with pytest.raises(ValueError, match=r"alpha_on=0.9: eta <= \(1 - alpha_on\) / alpha_on"):
        diffusion_generate(oracle, empty, max_new_tokens=4, remdm="loop", **{**REMDM_LOOP_PUBLISHED, "remdm_eta": 0.2})
    with pytest.raises(ValueError, match="read only by remdm='loop'"):
        diffusion_generate(oracle, empty, max_new_tokens=4, remdm="cap", remdm_eta=0.1, remdm_alpha_on=0.9)
