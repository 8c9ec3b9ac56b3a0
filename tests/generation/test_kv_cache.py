"""KV caches (Fast-dLLM's prefix and dual block caches) and the entropy-bound transfer, on tiny networks of the
three model classes: exactness with a refresh every forward, cached logits against full forwards, an independent
re-statement of Fast-dLLM's two cached LLaDA loops, batch invariance, memory, the lm-eval model, bad input."""

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sampler_prompts import left_padded_prompts
from tiny_mdm import tiny_dream, tiny_llada, tiny_mdm

from hf_mdm.generation import MaskedDiffusionGenerationConfig, diffusion_generate
from hf_mdm.generation_denoiser import Denoiser, Rows
from hf_mdm.languages import NGramLanguage, OracleDenoiser
from hf_mdm.modeling_blocks import apply_rotary, rotary_cos_sin, split_heads

os.environ.setdefault("HF_MDM_DATA_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "data"))

MASK, VOCAB = 30, 31


@pytest.fixture(scope="module")
def models():
    """The three classes at one size, each LM head sharpened (fewer near-ties among the confidences)."""
    return {
        "mdm": tiny_mdm(sharpen=20, num_key_value_heads=2, max_position_embeddings=128),
        "llada": tiny_llada(sharpen=20),
        "dream": tiny_dream(sharpen=20),
    }


def padded_prompts(length=6, seed=0):
    return left_padded_prompts(MASK, length=length, seed=seed)


SETTINGS = {
    "blocks": {},
    "cfg": dict(cfg_scale=0.5),
    "threshold": dict(transfer="threshold", threshold=0.3, steps=None),
    "entropy_bound": dict(transfer="entropy_bound", entropy_bound=1.5, steps=None),
    "left_to_right": dict(strategy="left_to_right"),
    "sampled": dict(transfer="stochastic", strategy="random", temperature=1.0),
}


@pytest.mark.parametrize("arch", ["mdm", "llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_refresh_every_forward_equals_no_cache(models, arch, cache, setting):
    ids, attention = padded_prompts()
    kwargs = dict(max_new_tokens=24, steps=24, block_length=8, attention_mask=attention, return_dict_in_generate=True)
    kwargs.update(SETTINGS[setting])
    plain = diffusion_generate(models[arch], ids, seed=3, **kwargs)
    cached = diffusion_generate(models[arch], ids, seed=3, kv_cache=cache, kv_cache_refresh=1, **kwargs)
    assert torch.equal(cached.sequences, plain.sequences)
    assert cached.nfe == plain.nfe
    # without a cache, a step runs only the rows that reveal something (the paper's sampler skips the others)
    assert cached.forward_tokens == plain.forward_tokens or (
        setting == "sampled" and cached.forward_tokens > plain.forward_tokens
    )
    approximate = diffusion_generate(models[arch], ids, seed=3, kv_cache=cache, **kwargs)
    assert approximate.forward_tokens < plain.forward_tokens
    if kwargs.get("transfer") not in ("threshold", "entropy_bound"):  # adaptive counts follow the (cached) logits
        assert approximate.nfe == plain.nfe
    assert not (approximate.sequences == MASK).any()


@pytest.mark.parametrize("arch", ["mdm", "llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_logits_equal_a_full_forward_on_the_same_canvas(models, arch, cache):
    """At a block's first step, the cached span's logits (second call, nothing revealed in between) equal the full
    forward's, with left padding, guidance and (Dream) the logits shift at the block's edge."""
    model = models[arch]
    ids, attention = padded_prompts()
    canvas = torch.cat([ids, torch.full((3, 16), MASK)], 1)
    attn = torch.cat([attention, torch.ones(3, 16, dtype=torch.long)], 1).bool()
    rows = Rows(canvas, attn, ~(canvas == MASK))
    denoiser = Denoiser.for_model(model, MASK, cfg_scale=0.5, kv_cache=cache)
    denoiser.begin_block(10, 18)
    keep = torch.arange(10, 18)
    full = denoiser.logits(rows, keep)
    cached = denoiser.logits(rows, keep)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    per_row = torch.tensor([[10, 12], [11, 17], [16, 10]])
    torch.testing.assert_close(
        denoiser.logits(rows, per_row), full[torch.arange(3)[:, None], per_row - 10], atol=1e-5, rtol=1e-5
    )
    span = 22 - 10 + denoiser.shift if cache == "prefix" else 8 + denoiser.shift
    assert denoiser.forward_tokens == 2 * 3 * 22 + 2 * 2 * 3 * span and denoiser.nfe == 6


# ----------------------------------------------------------------------------------------------------------------
# Fast-dLLM's cached LLaDA loops, re-stated (NVlabs/Fast-dLLM llada/generate.py: generate_with_prefix_cache and
# generate_with_dual_cache), with the keys/values handled explicitly as per-layer tensors.


def llada_forward(model, x, positions, past=None, replace=None):
    """LLaDA's forward on ids ``x`` (B, l) at ``positions`` (l,), written out block by block: returns the logits
    and every layer's (keys, values). ``past``: per-layer (keys, values) of earlier positions that the input's
    keys/values are appended to (prefix cache), or of the whole canvas whose columns ``replace`` they overwrite
    (dual cache)."""
    config, transformer = model.config, model.model.transformer
    h = transformer["wte"](x)
    cos, sin = rotary_cos_sin(positions.expand(x.shape[0], -1), config.head_dim, config.rope_theta)
    layers = []
    for i, block in enumerate(transformer["blocks"]):
        a = block.attn_norm(h)
        q = apply_rotary(split_heads(block.q_proj(a), config.head_dim), cos, sin, torch.float32)
        k = apply_rotary(split_heads(block.k_proj(a), config.head_dim), cos, sin, torch.float32)
        v = split_heads(block.v_proj(a), config.head_dim)
        if past is not None and replace is None:
            k, v = torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2)
        elif past is not None:
            fresh_k, fresh_v = k, v
            k, v = past[i][0].clone(), past[i][1].clone()
            k[:, :, replace], v[:, :, replace] = fresh_k, fresh_v
        layers.append((k, v))
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        h = h + block.attn_out(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        f = block.ff_norm(h)
        h = h + block.ff_out(block.act(block.ff_proj(f)) * block.up_proj(f))
    return model.model.compute_logits(transformer["ln_f"](h)), layers


def num_transfer_tokens(block_mask, steps):
    count = block_mask.sum(1, keepdim=True)
    base, remainder = count // steps, count % steps
    out = base.expand(-1, steps).clone()
    for row in range(block_mask.shape[0]):
        out[row, : int(remainder[row])] += 1
    return out


def transfer_index(logits, mask_index, x, count, threshold):
    x0 = logits.argmax(-1)
    p = F.softmax(logits.to(torch.float64), dim=-1).gather(-1, x0[..., None]).squeeze(-1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, p, -float("inf"))
    chosen = torch.zeros_like(x0, dtype=torch.bool)
    counts = mask_index.sum(1) if threshold is not None else count
    for j in range(confidence.shape[0]):
        _, select = torch.topk(confidence[j], k=int(counts[j]))
        chosen[j, select] = True
        if threshold is not None:
            for k in range(1, int(counts[j])):
                if confidence[j, select[k]] < threshold:
                    chosen[j, select[k]] = False
    return x0, chosen


def fast_dllm_generate(model, prompt, gen_length, block_length, steps, threshold, dual):
    x = torch.cat([prompt, torch.full((prompt.shape[0], gen_length), MASK)], 1)
    positions = torch.arange(x.shape[1])
    num_blocks, nfe = gen_length // block_length, 0
    for b in range(num_blocks):
        s, e = prompt.shape[1] + b * block_length, prompt.shape[1] + (b + 1) * block_length
        counts = num_transfer_tokens(x[:, s:e] == MASK, steps // num_blocks)
        logits, past = llada_forward(model, x, positions)
        mask_index = x == MASK
        mask_index[:, e:] = False
        x0, chosen = transfer_index(logits, mask_index, x, counts[:, 0], threshold)
        x[chosen] = x0[chosen]
        past = past if dual else [(k[:, :, :s], v[:, :, :s]) for k, v in past]
        nfe, i = nfe + 1, 1
        while (x[:, s:e] == MASK).any():
            end = e if dual else x.shape[1]
            span = x[:, s:end]
            logits, _ = llada_forward(model, span, positions[s:end], past, positions[s:end] if dual else None)
            mask_index = span == MASK
            mask_index[:, block_length:] = False
            x0, chosen = transfer_index(logits, mask_index, span, counts[:, min(i, counts.shape[1] - 1)], threshold)
            span[chosen] = x0[chosen]
            x[:, s:end] = span
            nfe, i = nfe + 1, i + 1
    return x, nfe


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_fast_dllm_cached_loops_give_our_tokens(models, cache, threshold):
    model = models["llada"]
    prompt = torch.randint(2, MASK, (2, 5), generator=torch.Generator().manual_seed(1))
    expected, expected_nfe = fast_dllm_generate(model, prompt.clone(), 24, 8, 24, threshold, cache == "dual")
    settings = dict(transfer="threshold", threshold=threshold, steps=None) if threshold else dict(steps=24)
    out = diffusion_generate(
        model,
        prompt,
        max_new_tokens=24,
        block_length=8,
        strategy="confidence",
        kv_cache=cache,
        return_dict_in_generate=True,
        **settings,
    )
    assert torch.equal(out.sequences, expected)
    assert out.nfe == expected_nfe
    if threshold:  # parallel decoding: fewer forwards than tokens
        assert out.nfe < 24


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_a_rows_tokens_do_not_depend_on_its_batch_mates(models, cache, arch):
    ids, attention = padded_prompts(seed=4)
    kwargs = dict(max_new_tokens=16, block_length=8, kv_cache=cache, transfer="threshold", threshold=0.5, steps=None)
    batched = diffusion_generate(models[arch], ids, attention_mask=attention, **kwargs)
    for row in range(3):
        keep = attention[row].bool()
        alone = diffusion_generate(models[arch], ids[row : row + 1, keep], **kwargs)
        assert torch.equal(batched[row, ids.shape[1] - int(keep.sum()) :], alone[0]), row


def cache_bytes(cache):
    return sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 4


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_the_cache_holds_one_canvas_and_does_not_grow(models, cache):
    model = models["mdm"]
    ids, attention = padded_prompts()
    canvas = torch.cat([ids, torch.full((3, 26), MASK)], 1)
    rows = Rows(canvas, torch.cat([attention, torch.ones(3, 26, dtype=torch.long)], 1).bool(), ~(canvas == MASK))
    denoiser = Denoiser.for_model(model, MASK, cfg_scale=0.5, kv_cache=cache)
    denoiser.begin_block(6, 14)
    config = model.config
    one_canvas = 2 * 3 * 32 * config.num_key_value_heads * config.head_dim * config.num_hidden_layers * 2 * 4
    sizes = []
    for step in range(8):
        denoiser.logits(rows, torch.arange(6 + step, 14))
        canvas[:, 6 + step] = 5
        sizes.append(cache_bytes(denoiser.block.cache))
    assert sizes == [one_canvas] * 8  # (guided: two branches) x rows x columns x kv heads x head dim x layers x (k, v)
    denoiser.begin_block(14, 22)
    assert denoiser.block.cache is None  # dropped at the block's end


def test_entropy_bound_reveals_the_lowest_score_prefix_within_the_bound(models):
    model = models["mdm"]
    prompt = torch.randint(2, MASK, (1, 4), generator=torch.Generator().manual_seed(2))
    for bound in (0.05, 0.5, 2.0, 50.0):
        out = diffusion_generate(
            model,
            prompt,
            max_new_tokens=12,
            steps=None,
            transfer="entropy_bound",
            entropy_bound=bound,
            output_history=True,
            return_dict_in_generate=True,
        )
        with torch.no_grad():
            logits = model(torch.cat([prompt, torch.full((1, 12), MASK)], 1)).logits[0, 4:]
        probs = logits.softmax(-1)
        entropy = -(probs * torch.log(probs + 1e-10)).sum(-1)
        confidence = probs.masked_fill(torch.arange(VOCAB) == MASK, 0).max(-1).values
        order = confidence.argsort(descending=True)
        expected = max(1, int((entropy[order].cumsum(0) <= bound).sum()))
        revealed = (out.history[0][0, 4:] != MASK).nonzero().flatten()
        assert revealed.numel() == expected, bound
        assert set(revealed.tolist()) == set(order[:expected].tolist())


def test_lm_eval_model_with_dual_cache_runs_a_gsm8k_request(tmp_path):
    from hf_mdm.harness import MaskedDiffusionLM, simple_evaluate
    from hf_mdm.harness.evaluator import build_task_manager
    from hf_mdm.harness.tiny import build_tiny_models

    tiny = build_tiny_models(tmp_path)
    model = MaskedDiffusionLM(
        pretrained=tiny["mdm"],
        device="cpu",
        kv_cache="dual",
        transfer="threshold",
        threshold=0.9,
        steps=None,
        block_length=8,
        max_gen_toks=16,
    )
    results = simple_evaluate(model, tasks=["mdm_gsm8k"], limit=1, task_manager=build_task_manager(["mdm_gsm8k"]))
    (record,) = model.timing.records
    assert results["timing"]["tasks"]["mdm_gsm8k"]["forward_tokens"] == record.forward_tokens
    plain = MaskedDiffusionLM(
        pretrained=tiny["mdm"],
        device="cpu",
        transfer="threshold",
        threshold=0.9,
        steps=None,
        block_length=8,
        max_gen_toks=16,
    )
    simple_evaluate(plain, tasks=["mdm_gsm8k"], limit=1, task_manager=build_task_manager(["mdm_gsm8k"]))
    canvas = plain.timing.records[0].forward_tokens / plain.timing.records[0].nfe  # every forward: the whole canvas
    blocks = (record.forward_tokens - 8 * record.nfe) / (canvas - 8)  # one full forward per block, then the block
    assert blocks in (1, 2) and record.nfe > blocks
    assert "exact_match,strict-match" in results["results"]["mdm_gsm8k"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kv_cache="triple"), "unknown kv_cache"),
        (dict(kv_cache="dual", kv_cache_refresh=0), "kv_cache_refresh"),
        (dict(kv_cache="dual", kv_cache_refresh=2.5), "kv_cache_refresh"),
        (dict(transfer="entropy_bound"), "entropy_bound"),
        (dict(transfer="entropy_bound", entropy_bound=0.0), "entropy_bound"),
        (dict(transfer="entropy_bound", entropy_bound=-1.0), "entropy_bound"),
    ],
)
def test_bad_cache_and_entropy_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MaskedDiffusionGenerationConfig(**kwargs).validate_diffusion()


def test_cache_asked_of_a_model_without_one_is_an_error():
    oracle = OracleDenoiser(NGramLanguage.random(4, 2, 0), mask_token_id=4)
    with pytest.raises(ValueError, match="kv_cache='dual'.*OracleDenoiser.*drop kv_cache"):
        diffusion_generate(oracle, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=4, kv_cache="dual")
    with pytest.raises(ValueError, match="kv_cache.*does not apply to reference='llada'"):
        MaskedDiffusionGenerationConfig.llada(8, 8, 8, kv_cache="dual")
