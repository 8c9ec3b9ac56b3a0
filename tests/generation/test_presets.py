"""Reference presets: ``MaskedDiffusionGenerationConfig.llada(...)`` and ``.dream(...)`` reproduce LLaDA's
``generate()`` and Dream's ``diffusion_generate()`` token for token (fp32).

The two references are re-stated below from ``shared/notes/reference-samplers.md``, as plain loops over blocks, steps
and rows, with the whole-tensor random draws the references make (so that the same ``torch.manual_seed`` gives the
same numbers). They run on tiny checkpoints in the published formats (written by the helpers of
``test_llada_dream.py``), and on stub networks whose logits make the transfer counts visible.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from native_checkpoints import ARCHS, random_weights, tiny_config, write_checkpoint
from transformers import AutoModelForMaskedLM, LogitsProcessorList
from transformers.modeling_outputs import MaskedLMOutput

from hf_mdm.generation import MaskedDiffusionGenerationConfig, diffusion_generate

INF = float("inf")


# ----------------------------------------------------------------------------------------------------------------
# The references, re-stated from the notes
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def llada_reference(
    model,
    prompt,
    attention_mask,
    steps,
    gen_length,
    block_length,
    temperature=0.0,
    cfg_scale=0.0,
    remasking="low_confidence",
    logits_eos_inf=False,
    confidence_eos_eot_inf=False,
    eos=None,
    eot=None,
):
    """LLaDA's generate(); returns (canvas, number of forward calls)."""
    mask_id = model.config.mask_token_id
    bsz, plen = prompt.shape
    x = torch.full((bsz, plen + gen_length), mask_id, dtype=torch.long)
    x[:, :plen] = prompt
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, torch.ones(bsz, gen_length, dtype=attention_mask.dtype)], 1)
    prompt_index = x != mask_id
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    spb = steps // num_blocks
    calls = 0
    for b in range(num_blocks):
        start, end = plen + b * block_length, plen + (b + 1) * block_length
        block_masks = [int((x[j, start:end] == mask_id).sum()) for j in range(bsz)]
        schedule = [[m // spb + (1 if i < m % spb else 0) for i in range(spb)] for m in block_masks]
        for i in range(spb):
            mask_index = x == mask_id
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                # LLaDA raises NameError here without an attention mask; the evident fix: no mask
                both = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
                cond, uncond = model(torch.cat([x, un_x]), attention_mask=both).logits.chunk(2)
                logits = uncond + (cfg_scale + 1) * (cond - uncond)
            else:
                logits = model(x, attention_mask=attention_mask).logits
            calls += 1
            if logits_eos_inf:
                logits[:, :, eos] = -INF
            if temperature == 0:
                noisy = logits  # LLaDA's add_gumbel_noise returns its argument itself
            else:
                as_double = logits.to(torch.float64)
                uniform = torch.rand_like(as_double)
                noisy = as_double.exp() / (-torch.log(uniform)) ** temperature
            x0 = noisy.argmax(-1)
            if confidence_eos_eot_inf:
                noisy[:, :, eos] = -INF  # reaches `logits` only when they are the same tensor (temperature 0)
                logits[:, :, eot] = -INF
            if remasking == "low_confidence":
                conf = torch.gather(torch.softmax(logits, -1), -1, x0[..., None]).squeeze(-1)
            else:
                conf = torch.rand((bsz, x.shape[1]))
            conf[:, end:] = -INF
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, conf, torch.tensor(-INF, dtype=conf.dtype))
            for j in range(bsz):
                idx = torch.topk(conf[j], k=schedule[j][i]).indices
                x[j, idx] = x0[j, idx]
    return x, calls


def dream_sample_tokens(logits, temperature, top_p, top_k, margin=False, entropy=False):
    """Dream's sample_tokens: (confidence, token) per row of logits (N, V)."""
    if temperature > 0:
        logits = logits / temperature
    lowest = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        mass = F.softmax(sorted_logits, -1).cumsum(-1)
        remove_sorted = torch.zeros_like(mass, dtype=torch.bool)
        remove_sorted[:, 1:] = mass[:, :-1] > top_p  # the first token over the threshold stays
        remove = torch.zeros_like(remove_sorted)
        for row in range(logits.shape[0]):
            remove[row, order[row]] = remove_sorted[row]
        logits = logits.masked_fill(remove, lowest)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = torch.where(logits < kth, torch.full_like(logits, lowest), logits)
    probs = F.softmax(logits, -1)
    if temperature > 0:
        try:
            x0 = torch.distributions.Categorical(probs=probs).sample()
            conf = probs.gather(-1, x0[:, None]).squeeze(-1)
        except Exception:
            conf, x0 = probs.max(-1)
    else:
        conf, x0 = probs.max(-1)
    if margin:
        ranked = probs.sort(-1, descending=True).values
        conf = ranked[:, 0] - ranked[:, 1]
    if entropy:
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    return conf, x0


@torch.no_grad()
def dream_reference(
    model,
    input_ids,
    attention_mask,
    max_new_tokens,
    steps,
    eps=1e-3,
    alg="origin",
    alg_temp=None,
    temperature=0.0,
    top_p=None,
    top_k=None,
):
    """Dream's diffusion_generate(); returns (canvas, history, the count n of each step: None for origin)."""
    mask_id = model.config.mask_token_id
    bsz, plen = input_ids.shape
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    kwargs = {}
    if attention_mask is not None and bool((attention_mask == 0).any()):
        mask = F.pad(attention_mask, (0, max_new_tokens), value=1)
        positions = mask.long().cumsum(-1) - 1
        positions[mask == 0] = 1
        real = mask.bool()
        kwargs = dict(attention_mask=real[:, None, None, :] & real[:, None, :, None], position_ids=positions)
    times = torch.linspace(1, eps, steps + 1)
    history, counts = [], []
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(x, **kwargs).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
        mask_logits = logits[mask_index]
        t, s = times[i], times[i + 1]
        if alg == "origin":
            p = 1 - s / t if i < steps - 1 else 1
            x0 = torch.full((mask_logits.shape[0],), mask_id, dtype=torch.long)
            chosen = torch.rand(x0.shape[0]) < p
            x0[chosen] = dream_sample_tokens(mask_logits[chosen], temperature, top_p, top_k)[1]
            x[mask_index] = x0
            counts.append(None)
        else:
            conf, x0 = dream_sample_tokens(
                mask_logits, temperature, top_p, top_k, margin=alg == "topk_margin", entropy=alg == "entropy"
            )
            average = mask_index.sum() / bsz
            n = int(average * (1 - s / t)) if i < steps - 1 else int(average)
            counts.append(n)
            full = torch.full(x.shape, -INF, dtype=logits.dtype)
            full[mask_index] = conf
            if n > 0:
                if alg_temp is None or alg_temp == 0:
                    idx = torch.topk(full, n).indices
                else:
                    idx = torch.multinomial(F.softmax(full / alg_temp, -1), n)
                proposal = torch.full_like(x, mask_id)
                proposal[mask_index] = x0
                for j in range(bsz):
                    x[j, idx[j]] = proposal[j, idx[j]]
        history.append(x.clone())
    return x, history, counts


# ----------------------------------------------------------------------------------------------------------------
# Tiny published-format checkpoints
# ----------------------------------------------------------------------------------------------------------------


class Boosted(torch.nn.Module):
    """A model whose logits for some tokens are raised, so that EOS / EoT are often proposed."""

    def __init__(self, model, tokens, amount):
        super().__init__()
        self.model, self.config = model, model.config
        self.tokens, self.amount = tokens, amount

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        logits = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits.clone()
        logits[..., self.tokens] += self.amount
        return MaskedLMOutput(logits=logits)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("presets")
    out = {}
    for arch, spec in ARCHS.items():
        config = tiny_config(arch)
        path = write_checkpoint(root / arch, config, random_weights(spec["shapes"](config), seed=3))
        out[arch] = AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32).eval()
    return out


def prompts(arch, bsz, length=6, seed=0):
    """(B, length) prompt ids and a left-padding attention mask (None for one row)."""
    config = tiny_config(arch)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, config["vocab_size"] - 1, (bsz, length), generator=gen)
    if bsz == 1:
        return ids, None
    attention_mask = torch.ones(bsz, length, dtype=torch.long)
    attention_mask[1, :2] = 0
    ids[1, :2] = config["pad_token_id"]
    return ids, attention_mask


# ----------------------------------------------------------------------------------------------------------------
# LLaDA
# ----------------------------------------------------------------------------------------------------------------

EOT = 7  # the tiny vocabulary has no <|eot_id|>: any id other than EOS (1) and [MASK] (95)

LLADA_CASES = [
    # bsz, gen_length, block_length, steps, temperature, cfg, remasking, logits_eos_inf, confidence_eos_eot_inf
    (1, 12, 12, 12, 0.0, 0.0, "low_confidence", False, False),
    (2, 16, 4, 8, 0.0, 0.0, "low_confidence", False, False),
    (2, 16, 8, 6, 0.9, 0.0, "low_confidence", False, False),
    (1, 12, 4, 9, 1.3, 0.0, "random", False, False),
    (2, 12, 6, 6, 0.0, 0.0, "random", False, False),
    (2, 8, 4, 8, 0.0, 1.5, "low_confidence", False, False),
    (1, 8, 8, 4, 0.7, 0.5, "low_confidence", False, False),  # CFG without attention mask (LLaDA: NameError)
    (2, 12, 4, 6, 0.0, 0.0, "low_confidence", True, False),
    (2, 12, 4, 6, 0.0, 0.0, "low_confidence", False, True),
    (2, 12, 12, 12, 0.8, 0.0, "low_confidence", False, True),
    (1, 8, 4, 4, 0.6, 0.0, "low_confidence", True, True),
    (2, 8, 4, 16, 0.5, 0.0, "random", False, False),  # more steps than tokens: steps that reveal nothing
    (1, 8, 4, 12, 0.0, 0.0, "low_confidence", False, False),
]


@pytest.mark.parametrize("case", LLADA_CASES, ids=[str(i) for i in range(len(LLADA_CASES))])
def test_llada_preset_matches_reference(models, case):
    bsz, gen_length, block_length, steps, temperature, cfg, remasking, eos_inf, eos_eot_inf = case
    model = models["llada"]
    eos = model.config.eos_token_id
    if eos_inf or eos_eot_inf:
        model = Boosted(model, [eos, EOT], 2.5)
    ids, attention_mask = prompts("llada", bsz, seed=len(LLADA_CASES) + steps)
    seed = 1000 + steps
    torch.manual_seed(seed)
    expected, calls = llada_reference(
        model,
        ids,
        attention_mask,
        steps,
        gen_length,
        block_length,
        temperature,
        cfg,
        remasking,
        eos_inf,
        eos_eot_inf,
        eos=eos,
        eot=EOT,
    )
    config = MaskedDiffusionGenerationConfig.llada(
        gen_length,
        steps,
        block_length,
        temperature=temperature,
        cfg_scale=cfg,
        remasking=remasking,
        logits_eos_inf=eos_inf,
        confidence_eos_eot_inf=eos_eot_inf,
        eot_token_id=EOT,
        return_dict_in_generate=True,
        output_history=True,
    )
    torch.manual_seed(seed)
    out = diffusion_generate(model, ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(out.sequences, expected)
    assert calls == steps and out.steps == steps and len(out.history) == steps
    revealing = steps if steps <= gen_length else gen_length  # spb > block length: the trailing steps reveal 0
    assert out.nfe == revealing * (2 if cfg else 1)
    if eos_inf:
        assert not (out.sequences[:, ids.shape[1] :] == eos).any()
    if eos_eot_inf and not eos_inf:  # the boosted EOS / EoT are proposed and, with confidence 0, unmasked last
        assert torch.isin(out.sequences[:, ids.shape[1] :], torch.tensor([eos, EOT])).any()


def test_llada_preset_keeps_earlier_masks_as_candidates(models):
    """A [MASK] inside the prompt is no block's: LLaDA reveals it whenever its confidence ranks in a block's top k."""
    model = models["llada"]
    ids, attention_mask = prompts("llada", 2, seed=8)
    ids[:, 3] = model.config.mask_token_id
    config = MaskedDiffusionGenerationConfig.llada(12, 6, 4, return_dict_in_generate=True, output_history=True)
    expected, _ = llada_reference(model, ids, attention_mask, 6, 12, 4)
    out = model.generate(ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(out.sequences, expected)
    assert (out.sequences[:, 3] != model.config.mask_token_id).all()  # the prompt masks were filled too


def test_llada_preset_through_model_generate_and_save_load(models, tmp_path):
    model = models["llada"]
    ids, attention_mask = prompts("llada", 2, seed=5)
    preset = MaskedDiffusionGenerationConfig.llada(8, 4, 4, temperature=0.5, remasking="random")
    torch.manual_seed(3)
    expected, _ = llada_reference(model, ids, attention_mask, 4, 8, 4, 0.5, remasking="random")
    torch.manual_seed(3)
    assert torch.equal(model.generate(ids, attention_mask=attention_mask, generation_config=preset), expected)
    assert torch.equal(
        model.generate(ids, attention_mask=attention_mask, generation_config=preset, seed=11),
        model.generate(ids, attention_mask=attention_mask, generation_config=preset, seed=11),
    )

    preset.save_pretrained(tmp_path)
    loaded = MaskedDiffusionGenerationConfig.from_pretrained(tmp_path)
    fields = ("reference", "max_new_tokens", "steps", "block_length", "temperature", "remasking", "stop_at_eos")
    assert [getattr(loaded, f) for f in fields] == ["llada", 8, 4, 4, 0.5, "random", False]
    torch.manual_seed(3)
    assert torch.equal(model.generate(ids, attention_mask=attention_mask, generation_config=loaded), expected)


# ----------------------------------------------------------------------------------------------------------------
# Dream
# ----------------------------------------------------------------------------------------------------------------

DREAM_CASES = [
    # bsz, max_new_tokens, steps, eps, alg, alg_temp, temperature, top_p, top_k
    *[
        (bsz, 12, 12, 1e-3, alg, None, 0.0, None, None)
        for bsz in (1, 2)
        for alg in ("origin", "maskgit_plus", "topk_margin", "entropy")
    ],
    *[(2, 10, 5, 1e-3, alg, None, 0.8, 0.9, None) for alg in ("origin", "maskgit_plus", "topk_margin", "entropy")],
    (1, 10, 4, 1e-3, "origin", None, 1.0, None, 5),
    (2, 12, 6, 1e-2, "maskgit_plus", 0.5, 0.0, None, None),
    (2, 12, 8, 1e-3, "entropy", 0.2, 0.7, 0.95, 20),
    (1, 8, 8, 0.0, "topk_margin", None, 0.0, 0.8, 3),
    (2, 8, 4, 1e-3, "origin", None, 1.0, 0.03, None),  # top_p where keeping the first token over it matters
    (2, 8, 4, 1e-3, "maskgit_plus", None, 1.2, 0.05, 50),
    (2, 9, 16, 1e-3, "maskgit_plus", None, 0.5, None, None),  # more steps than tokens
]


@pytest.mark.parametrize("case", DREAM_CASES, ids=[str(i) for i in range(len(DREAM_CASES))])
def test_dream_preset_matches_reference(models, case):
    bsz, max_new_tokens, steps, eps, alg, alg_temp, temperature, top_p, top_k = case
    model = models["dream"]
    ids, attention_mask = prompts("dream", bsz, seed=steps)
    seed = 7 + steps + bsz
    torch.manual_seed(seed)
    expected, history, counts = dream_reference(
        model, ids, attention_mask, max_new_tokens, steps, eps, alg, alg_temp, temperature, top_p, top_k
    )
    config = MaskedDiffusionGenerationConfig.dream(
        max_new_tokens,
        steps,
        eps=eps,
        alg=alg,
        alg_temp=alg_temp,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        return_dict_in_generate=True,
        output_history=True,
    )
    torch.manual_seed(seed)
    out = model.generate(ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(out.sequences, expected)
    assert out.steps == steps and len(out.history) == steps
    assert all(torch.equal(a, b) for a, b in zip(out.history, history))
    # a forward is skipped only where nothing is revealed and nothing drawn (n == 0 at temperature 0)
    skipped = sum(1 for n in counts if n == 0) if temperature == 0 else 0
    assert out.nfe == steps - skipped


def test_dream_preset_is_batch_average_and_keeps_pads(models):
    """A row with extra masks in its prompt shifts the batch-average count for both rows, as in Dream."""
    model = models["dream"]
    ids, attention_mask = prompts("dream", 2, seed=9)
    ids[0, 3] = model.config.mask_token_id
    ids[0, 5] = model.config.mask_token_id
    config = MaskedDiffusionGenerationConfig.dream(10, 5, alg="maskgit_plus", return_dict_in_generate=True)
    expected, _, _ = dream_reference(model, ids, attention_mask, 10, 5, alg="maskgit_plus")
    out = model.generate(ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(out.sequences, expected)
    assert torch.equal(out.sequences[1, :2], ids[1, :2])  # pads are never touched


class Guided(torch.nn.Module):
    """Classifier-free guidance written into the network: the unconditional input masks the first ``prompt_len``
    columns (prompt and pads)."""

    def __init__(self, model, prompt_len, scale):
        super().__init__()
        self.model, self.config, self.prompt_len, self.scale = model, model.config, prompt_len, scale

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        uncond = input_ids.clone()
        uncond[:, : self.prompt_len] = self.config.mask_token_id
        both = {
            k: torch.cat([v, v])
            for k, v in (("attention_mask", attention_mask), ("position_ids", position_ids))
            if v is not None
        }
        cond, un = self.model(torch.cat([input_ids, uncond]), **both).logits.chunk(2)
        return MaskedLMOutput(logits=un + (self.scale + 1) * (cond - un))


@pytest.mark.parametrize("alg,temperature", [("maskgit_plus", 0.0), ("origin", 0.9)])
def test_dream_preset_with_guidance(models, alg, temperature):
    """Dream's sampler has no CFG; the preset's cfg_scale guides as LLaDA does, the rest of the step unchanged."""
    model = models["dream"]
    ids, attention_mask = prompts("dream", 2, seed=12)
    torch.manual_seed(5)
    expected, _, _ = dream_reference(
        Guided(model, ids.shape[1], 1.5), ids, attention_mask, 8, 4, alg=alg, temperature=temperature
    )
    config = MaskedDiffusionGenerationConfig.dream(
        8, 4, alg=alg, temperature=temperature, cfg_scale=1.5, return_dict_in_generate=True
    )
    torch.manual_seed(5)
    out = model.generate(ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(out.sequences, expected) and out.nfe == 2 * 4


def test_dream_preset_save_load_and_free_function(models, tmp_path):
    model = models["dream"]
    ids, attention_mask = prompts("dream", 2, seed=4)
    preset = MaskedDiffusionGenerationConfig.dream(8, 4, alg="entropy", alg_temp=0.3, temperature=0.6, top_p=0.9)
    preset.save_pretrained(tmp_path)
    loaded = MaskedDiffusionGenerationConfig.from_pretrained(tmp_path)
    fields = ("reference", "max_new_tokens", "steps", "eps", "alg", "alg_temp", "temperature", "top_p", "top_k")
    assert [getattr(loaded, f) for f in fields] == ["dream", 8, 4, 1e-3, "entropy", 0.3, 0.6, 0.9, None]
    outputs = []
    for config in (preset, loaded):
        torch.manual_seed(21)
        outputs.append(diffusion_generate(model, ids, attention_mask=attention_mask, generation_config=config))
    torch.manual_seed(21)
    expected, _, _ = dream_reference(model, ids, attention_mask, 8, 4, 1e-3, "entropy", 0.3, 0.6, 0.9)
    assert torch.equal(outputs[0], expected) and torch.equal(outputs[1], expected)


def test_dream_checkpoint_with_published_generation_config(tmp_path):
    """Dream's published generation_config.json holds its sampler's keys (alg, eps, ...): the checkpoint loads, its
    default config keeps them inert (no preset selected), and the preset can still be asked for explicitly."""
    config = tiny_config("dream")
    path = write_checkpoint(tmp_path / "dream", config, random_weights(ARCHS["dream"]["shapes"](config), seed=3))
    published = {
        "_from_model_config": True,
        "alg": "origin",
        "alg_temp": None,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "eps": 0.001,
        "mask_token_id": None,
        "output_history": False,
        "pad_token_id": 1,
        "steps": 512,
        "temperature": 0.0,
        "top_k": None,
        "top_p": None,
        "transformers_version": "4.46.2",
    }
    (path / "generation_config.json").write_text(json.dumps(published))
    model = AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32).eval()
    assert model.generation_config.reference is None and model.generation_config.alg == "origin"
    ids, attention_mask = prompts("dream", 2, seed=2)
    out = model.generate(ids, attention_mask=attention_mask, max_new_tokens=6, return_dict_in_generate=True)
    assert out.nfe == 6 and not (out.sequences == config["mask_token_id"]).any()  # the default sampler ran
    torch.manual_seed(1)
    expected, _, _ = dream_reference(model, ids, attention_mask, 6, 3, temperature=0.5)
    torch.manual_seed(1)
    preset = MaskedDiffusionGenerationConfig.dream(6, 3, temperature=0.5)
    assert torch.equal(model.generate(ids, attention_mask=attention_mask, generation_config=preset), expected)


# ----------------------------------------------------------------------------------------------------------------
# Transfer counts on a grid, through the presets
# ----------------------------------------------------------------------------------------------------------------


class Ranked(torch.nn.Module):
    """Stub network: every position proposes token 2 + (j % 5), with a confidence that falls with the position j, so
    a step reveals the leftmost masked positions; the counts are read from the history."""

    def __init__(self, mask_id=9):
        super().__init__()
        self.config = SimpleNamespace(mask_token_id=mask_id, eos_token_id=None, pad_token_id=None, logits_shift=0)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        bsz, length = input_ids.shape
        logits = torch.zeros(bsz, length, 10)
        j = torch.arange(length)
        logits[:, j, 2 + j % 5] = 8.0 - 4.0 * j / length
        return MaskedLMOutput(logits=logits)


def revealed_per_step(history, start_masked, mask_id, row=0):
    counts, before = [], start_masked
    for canvas in history:
        now = int((canvas[row] == mask_id).sum())
        counts.append(before - now)
        before = now
    return counts


def llada_counts(gen_length, block_length, steps):
    """LLaDA's rule: per block of M = block_length masks and spb = steps // blocks steps, M // spb per step plus one
    on the first M % spb."""
    spb = steps // (gen_length // block_length)
    block = [block_length // spb + (1 if i < block_length % spb else 0) for i in range(spb)]
    return block * (gen_length // block_length)


def dream_counts(masks, steps, eps, dtype=torch.float32):
    """Dream's rule for a batch whose rows all hold ``masks`` masks: n_i = int(m (1 - s/t)), int(m) at the end."""
    times = torch.linspace(1, eps, steps + 1, dtype=dtype)
    counts, left = [], masks
    for i in range(steps):
        m = torch.tensor(left, dtype=dtype)
        n = int(m) if i == steps - 1 else int(m * (1 - times[i + 1] / times[i]))
        counts.append(n)
        left -= n
    return counts


@pytest.mark.parametrize(
    "gen_length,block_length,steps",
    [(8, 8, 8), (12, 12, 5), (32, 32, 5), (16, 4, 8), (16, 4, 12), (12, 6, 14), (10, 5, 4), (9, 3, 9), (8, 2, 16)],
)
def test_llada_transfer_counts(gen_length, block_length, steps):
    model = Ranked()
    config = MaskedDiffusionGenerationConfig.llada(
        gen_length, steps, block_length, output_history=True, return_dict_in_generate=True
    )
    out = diffusion_generate(model, torch.ones(2, 3, dtype=torch.long), generation_config=config)
    expected = llada_counts(gen_length, block_length, steps)
    assert revealed_per_step(out.history, gen_length, 9) == expected == revealed_per_step(out.history, gen_length, 9, 1)
    assert out.nfe == sum(1 for n in expected if n)


DREAM_GRID = [
    (masks, steps, eps)
    for masks in (8, 16, 32, 64, 128)
    for steps in sorted({masks, masks // 2, masks // 4})
    for eps in (0.0, 1e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5)
]


def test_dream_count_rule_float32_differs_from_float64():
    """The grid holds settings where float64 arithmetic would give other counts: the presets must follow float32."""
    differing = [g for g in DREAM_GRID if dream_counts(*g) != dream_counts(*g, dtype=torch.float64)]
    assert len(DREAM_GRID) == 135 and len(differing) >= 10
    assert dream_counts(32, 32, 1e-3) == [0] + [1] * 30 + [2]  # steps == tokens: [0, 1, ..., 1, 2]
    assert dream_counts(64, 32, 1e-3) == [1] + [2] * 30 + [3]  # k tokens a step: [k - 1, k, ..., k, k + 1]
    assert dream_counts(32, 32, 0.0)[4] == 0  # float32 rounding, even with eps = 0


@pytest.mark.parametrize("masks", [8, 16, 32, 64, 128])
def test_dream_transfer_counts_follow_float32(masks):
    model = Ranked()
    for _, steps, eps in (g for g in DREAM_GRID if g[0] == masks):
        config = MaskedDiffusionGenerationConfig.dream(
            masks, steps, eps=eps, alg="maskgit_plus", output_history=True, return_dict_in_generate=True
        )
        out = diffusion_generate(model, torch.ones(2, 2, dtype=torch.long), generation_config=config)
        expected = dream_counts(masks, steps, eps)
        assert revealed_per_step(out.history, masks, 9) == expected, (masks, steps, eps)
        assert revealed_per_step(out.history, masks, 9, row=1) == expected
        assert out.nfe == sum(1 for n in expected if n)
        assert not (out.sequences == 9).any()


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: MaskedDiffusionGenerationConfig.llada(10, 4, 3), "gen_length % block_length"),
        (lambda: MaskedDiffusionGenerationConfig.llada(12, 5, 4), "multiple of the number of blocks"),
        (lambda: MaskedDiffusionGenerationConfig.llada(8, 4, 4, remasking="entropy"), "remasking"),
        (lambda: MaskedDiffusionGenerationConfig.llada(8, 4, 4, top_k=5), "top_k"),
        (lambda: MaskedDiffusionGenerationConfig.llada(8, 4, 4, strategy="margin"), "strategy"),
        (lambda: MaskedDiffusionGenerationConfig.llada(8, 4, 4, alg="entropy"), "dream"),
        (lambda: MaskedDiffusionGenerationConfig.llada(0, 4, 4), "gen_length"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 4, alg="confidence"), "alg"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 4, eps=1.0), "eps"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 4, block_length=4), "block_length"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 4, transfer="threshold", threshold=0.5), "transfer"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 0), "steps"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 4, top_k=0), "top_k"),
        (lambda: MaskedDiffusionGenerationConfig.dream(8, 4, remasking="random"), "llada"),
        (lambda: MaskedDiffusionGenerationConfig(reference="mdlm"), "unknown reference"),
    ],
)
def test_preset_validation(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_preset_runtime_errors(models):
    ids, _ = prompts("llada", 1)
    flags = MaskedDiffusionGenerationConfig.llada(4, 4, 4, confidence_eos_eot_inf=True)
    with pytest.raises(ValueError, match="eot_token_id=126348"):  # LLaDA-8B's EoT is outside the tiny vocabulary
        models["llada"].generate(ids, generation_config=flags)
    with pytest.raises(ValueError, match="logits_processor"):
        models["llada"].generate(
            ids,
            generation_config=MaskedDiffusionGenerationConfig.llada(4, 4, 4),
            logits_processor=LogitsProcessorList([lambda i, s: s]),
        )
    with pytest.raises(ValueError, match="strategy"):
        models["dream"].generate(ids, generation_config=MaskedDiffusionGenerationConfig.dream(4, 4), strategy="random")


def test_default_config_is_untouched_by_presets():
    default = MaskedDiffusionGenerationConfig()
    assert default.reference is None and default.alg is None and default.remasking is None
    assert default.stop_at_eos and default.transfer == "deterministic"
    preset = MaskedDiffusionGenerationConfig.llada(8, 8, 8)
    assert preset.reference == "llada" and not preset.stop_at_eos and preset.to_dict()["reference"] == "llada"
