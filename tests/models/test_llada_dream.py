"""Native LLaDA and Dream: published checkpoint formats load without remote code and compute what the published
architectures compute.

The checkpoints here are written by the tests themselves, in the published formats: a ``config.json`` with the
published keys (tiny sizes) and safetensors with the published parameter names and random weights, built from
shape arithmetic on the config, never from our own ``save_pretrained``. The forward pass is compared with a plain,
float64 implementation of each published architecture written below (embedding, RMSNorm, rotate-half RoPE, explicit
softmax attention with a padding mask, SwiGLU).

``tests/fixtures/*_config.json`` hold the published ``config.json`` of LLaDA-8B (Base and Instruct share it) and of
Dream-v0-Base-7B: every key of the published format, with the published values (Dream's non-architectural
entries ``use_cache`` and ``transformers_version`` as in the Dream-format configs of that release).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from native_checkpoints import ARCHS, random_weights, tiny_config, write_checkpoint
from published_formats import published_config  # noqa: E402
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from hf_mdm.models import DreamConfig, LLaDAConfig, LLaDAModelLM


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, dict[str, torch.Tensor]]]:
    """One tiny published-format checkpoint per architecture (single safetensors file)."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for arch, spec in ARCHS.items():
        config = tiny_config(arch)
        tensors = random_weights(spec["shapes"](config))
        out[arch] = (write_checkpoint(root / arch, config, tensors), tensors)
    return out


@pytest.fixture(scope="module")
def models(checkpoints) -> dict[str, torch.nn.Module]:
    """The tiny checkpoints in float32 (transformers 5 would otherwise follow Dream's ``torch_dtype: bfloat16``)."""
    return {
        arch: AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32).eval()
        for arch, (path, _) in checkpoints.items()
    }


# ----------------------------------------------------------------------------------------------------------------
# Independent reference implementation (float64, explicit softmax)
# ----------------------------------------------------------------------------------------------------------------


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def ref_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate the pair (x[i], x[i + D/2]) of each head by the angle position * theta ** (-2i / D)."""
    half = x.shape[-1] // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    angle = positions.double()[:, None, :, None] * freq
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], dim=-1)


def ref_attention(q, k, v, key_mask):
    """q (B, H, L, D); k, v (B, KV, L, D); key_mask (B, L) bool, True = may be attended."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def ref_block(x, w, positions, key_mask, heads, kv_heads, theta, eps):
    """One pre-norm bidirectional block; ``w`` maps canonical names to float64 tensors."""
    batch, length, _ = x.shape

    def proj(name, inp):
        out = inp @ w[name].T
        return out + w[name + "_bias"] if name + "_bias" in w else out

    def heads_of(t, n):
        return t.view(batch, length, n, -1).transpose(1, 2)

    h = ref_rms_norm(x, w["attn_norm"], eps)
    q = ref_rope(heads_of(proj("q", h), heads), positions, theta)
    k = ref_rope(heads_of(proj("k", h), kv_heads), positions, theta)
    v = heads_of(proj("v", h), kv_heads)
    att = ref_attention(q, k, v, key_mask).transpose(1, 2).reshape(batch, length, -1)
    x = x + att @ w["o"].T
    h = ref_rms_norm(x, w["mlp_norm"], eps)
    return x + (F.silu(h @ w["gate"].T) * (h @ w["up"].T)) @ w["down"].T


LLADA_NAMES = dict(
    attn_norm="attn_norm.weight",
    q="q_proj.weight",
    k="k_proj.weight",
    v="v_proj.weight",
    o="attn_out.weight",
    mlp_norm="ff_norm.weight",
    gate="ff_proj.weight",
    up="up_proj.weight",
    down="ff_out.weight",
)
DREAM_NAMES = dict(
    attn_norm="input_layernorm.weight",
    q="self_attn.q_proj.weight",
    q_bias="self_attn.q_proj.bias",
    k="self_attn.k_proj.weight",
    k_bias="self_attn.k_proj.bias",
    v="self_attn.v_proj.weight",
    v_bias="self_attn.v_proj.bias",
    o="self_attn.o_proj.weight",
    mlp_norm="post_attention_layernorm.weight",
    gate="mlp.gate_proj.weight",
    up="mlp.up_proj.weight",
    down="mlp.down_proj.weight",
)


def reference_logits(arch: str, config: dict, tensors: dict, ids, attention_mask, positions) -> torch.Tensor:
    """Per-position logits (B, L, V) of the published architecture, float64."""
    t = {name: value.double() for name, value in tensors.items()}
    key_mask = attention_mask.bool()
    if arch == "llada":
        prefix, names, n = "model.transformer.blocks.", LLADA_NAMES, config["n_layers"]
        heads, kv_heads = config["n_heads"], config["n_kv_heads"]
        x = t["model.transformer.wte.weight"][ids]
        final_norm, head = t["model.transformer.ln_f.weight"], t["model.transformer.ff_out.weight"]
    else:
        prefix, names, n = "model.layers.", DREAM_NAMES, config["num_hidden_layers"]
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        x = t["model.embed_tokens.weight"][ids]
        final_norm, head = t["model.norm.weight"], t["lm_head.weight"]
    for i in range(n):
        w = {key: t[f"{prefix}{i}.{name}"] for key, name in names.items()}
        x = ref_block(x, w, positions, key_mask, heads, kv_heads, config["rope_theta"], config["rms_norm_eps"])
    return ref_rms_norm(x, final_norm, config["rms_norm_eps"]) @ head.T


def sample_batch(vocab: int, mask_id: int, padding: str, seed: int = 1):
    """ids (3, 10) with some [MASK] tokens, and a (3, 10) attention mask: none, left or right padding."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab - 1, (3, 10), generator=gen)
    ids[:, 6:] = mask_id
    attention_mask = torch.ones_like(ids)
    if padding != "none":
        for row, pads in ((1, 3), (2, 6)):
            cols = slice(0, pads) if padding == "left" else slice(10 - pads, 10)
            attention_mask[row, cols] = 0
            ids[row, cols] = 1
    return ids, attention_mask


# ----------------------------------------------------------------------------------------------------------------
# 1. Published formats load with no missing or unexpected keys, without remote code
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llada", "dream"])
@pytest.mark.parametrize("shards", [1, 3])
def test_published_format_loads_exactly(arch, shards, tmp_path):
    spec = ARCHS[arch]
    config = tiny_config(arch)
    tensors = random_weights(spec["shapes"](config))
    path = write_checkpoint(tmp_path / "ckpt", config, tensors, shards=shards)

    model, info = AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)

    assert type(model) is spec["model_class"]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    assert set(state) == set(tensors)
    for name, value in tensors.items():
        assert torch.equal(state[name], value), name


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_native_class_wins_over_auto_map(arch, checkpoints):
    """The published config.json names remote code in auto_map; the .py files are absent here, so any attempt to use
    them would fail. AutoConfig/AutoModel pick the native classes with and without trust_remote_code."""
    path, _ = checkpoints[arch]
    assert "auto_map" in json.loads((path / "config.json").read_text())
    expected = ARCHS[arch]["model_class"]
    for kwargs in ({}, {"trust_remote_code": True}):
        assert type(AutoConfig.from_pretrained(path, **kwargs)) is expected.config_class
        assert type(AutoModel.from_pretrained(path, **kwargs)) is expected


def test_saved_checkpoint_keeps_published_names_and_keys(models, tmp_path):
    for arch, model in models.items():
        model.save_pretrained(tmp_path / arch)
        saved = load_file(str(tmp_path / arch / "model.safetensors"))
        assert set(saved) == set(model.state_dict())
        config = json.loads((tmp_path / arch / "config.json").read_text())
        assert config["model_type"] == model.config.model_type
        assert config["architectures"] == [type(model).__name__]
        _, info = AutoModelForMaskedLM.from_pretrained(tmp_path / arch, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]


# ----------------------------------------------------------------------------------------------------------------
# 2. Forward pass equals the independent reference, with and without padding
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llada", "dream"])
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_forward_matches_reference(arch, padding, checkpoints, models):
    path, tensors = checkpoints[arch]
    config = tiny_config(arch)
    model = models[arch]
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], padding)
    positions = torch.arange(ids.shape[1]).expand_as(ids)

    with torch.no_grad():
        logits = model(ids, attention_mask=attention_mask).logits
    expected = reference_logits(arch, config, tensors, ids, attention_mask, positions)

    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    real = attention_mask.bool()
    torch.testing.assert_close(logits[real].double(), expected[real], atol=1e-5, rtol=1e-5)


def test_dream_reference_positions_under_padding(checkpoints, models):
    """Dream's reference sampler passes position_ids = cumsum(mask) - 1 when padded: a left-padded row then equals
    the same tokens without padding."""
    config = tiny_config("dream")
    model = models["dream"]
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], "left")
    position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    with torch.no_grad():
        padded = model(ids, attention_mask=attention_mask, position_ids=position_ids).logits
        alone = model(ids[2:, 6:]).logits
    torch.testing.assert_close(padded[2, 6:], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_padding_rows_stay_finite(arch, models):
    """Padding queries, and a row that is all padding, give finite logits (no empty softmax row)."""
    config = tiny_config(arch)
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], "left")
    attention_mask[0] = 0
    with torch.no_grad():
        logits = models[arch](ids, attention_mask=attention_mask).logits
    assert torch.isfinite(logits).all()


def test_logits_shift_is_a_config_constant(models):
    """Dream's shift is declared (for the sampler), not applied: the forward returns lm_head(h_j) at j (checked
    against the reference above); the loss applies it."""
    assert models["dream"].config.logits_shift == 1 and DreamConfig.logits_shift == 1
    assert models["llada"].config.logits_shift == 0
    for arch, model in models.items():
        config = tiny_config(arch)
        ids, _ = sample_batch(config["vocab_size"], config["mask_token_id"], "none")
        labels = torch.full_like(ids, -100)
        labels[:, 6:] = ids[:, 6:].roll(1, dims=0)
        with torch.no_grad():
            out = model(ids, labels=labels)
        logits = out.logits
        if model.config.logits_shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_gradient_checkpointing_gives_the_same_gradients(arch, checkpoints):
    path, _ = checkpoints[arch]
    config = tiny_config(arch)
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], "right")
    labels = torch.where(ids == config["mask_token_id"], ids.roll(1, dims=1), -100)
    grads = []
    for checkpointing in (False, True):
        model = AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32).train()
        if checkpointing:
            # activation_checkpointing_enable: its name since transformers 5.2x; gradient_checkpointing_enable before
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
            blocks = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
            assert blocks and all(block.gradient_checkpointing for block in blocks)
        model(ids, attention_mask=attention_mask, labels=labels).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0])


# ----------------------------------------------------------------------------------------------------------------
# 3. The published configurations at full size (meta device)
# ----------------------------------------------------------------------------------------------------------------

FULL_SIZE = {
    # LLaDA-8B: the published index's total_size, 16,031,162,368 bytes of bfloat16, is 8,015,581,184 parameters.
    "llada": dict(vocab_size=126464, mask_token_id=126336, parameters=8_015_581_184),
    # Dream-v0-7B (Qwen2.5-7B shape): 7,615,616,512 parameters, "7.62B" on the model page. The embedding has
    # 152,064 rows; 151,936 is the default of the published DreamConfig class, not the checkpoint's value.
    "dream": dict(vocab_size=152064, mask_token_id=151666, parameters=7_615_616_512),
}


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_published_config_builds_full_size_model(arch, tmp_path):
    published = published_config(ARCHS[arch]["fixture"])
    (tmp_path / "config.json").write_text(json.dumps(published))
    config = AutoConfig.from_pretrained(tmp_path)

    assert type(config) is ARCHS[arch]["model_class"].config_class
    dropped = {"model_type", "use_cache", "torch_dtype", "transformers_version"}  # generation/base-class keys
    for key, value in published.items():
        if key not in dropped:
            assert getattr(config, key) == value, key
    assert config.vocab_size == FULL_SIZE[arch]["vocab_size"]
    assert config.mask_token_id == FULL_SIZE[arch]["mask_token_id"]

    with torch.device("meta"):
        model = AutoModelForMaskedLM.from_config(config)
    expected = sum(math.prod(shape) for shape in ARCHS[arch]["shapes"](published).values())
    assert expected == FULL_SIZE[arch]["parameters"]
    assert model.num_parameters() == expected
    assert all(p.is_meta for p in model.parameters())


def test_default_configs_are_the_published_ones():
    for arch, config_class in (("llada", LLaDAConfig), ("dream", DreamConfig)):
        published = published_config(ARCHS[arch]["fixture"])
        default = config_class()
        for key in ("vocab_size", "mask_token_id", "eos_token_id", "pad_token_id", "rope_theta", "rms_norm_eps"):
            assert getattr(default, key) == published[key], (arch, key)


def test_unsupported_olmo_variant_is_refused():
    with pytest.raises(ValueError, match="block_type='sequential'"):
        LLaDAModelLM(LLaDAConfig(**(ARCHS["llada"]["tiny"] | {"block_type": "sequential"})))


# ----------------------------------------------------------------------------------------------------------------
# 4. logits_to_keep, bfloat16 and device_map
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_logits_to_keep_slices_and_runs_head_only_there(arch, models):
    model = models[arch]
    config = tiny_config(arch)
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], "left")
    head_inputs = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, args, out: head_inputs.append(args[0].shape))
    index = torch.tensor([0, 4, 7])
    with torch.no_grad():
        full = model(ids, attention_mask=attention_mask).logits
        last = model(ids, attention_mask=attention_mask, logits_to_keep=3).logits
        picked = model(ids, attention_mask=attention_mask, logits_to_keep=index).logits
        per_row = torch.tensor([[9, 2], [5, 5], [0, 7], [3, 1]])[: ids.shape[0]]  # (B, K): positions of each row
        rows = model(ids, attention_mask=attention_mask, logits_to_keep=per_row).logits
    hook.remove()
    assert [shape[1] for shape in head_inputs] == [10, 3, 3, 2]
    assert getattr(model, "supports_per_row_logits_to_keep", False)
    torch.testing.assert_close(last, full[:, -3:], atol=0, rtol=0)
    torch.testing.assert_close(picked, full[:, index], atol=0, rtol=0)
    torch.testing.assert_close(rows, torch.stack([full[b, per_row[b]] for b in range(ids.shape[0])]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_bfloat16_load(arch, checkpoints, models):
    path, _ = checkpoints[arch]
    model = AutoModelForMaskedLM.from_pretrained(path, torch_dtype=torch.bfloat16).eval()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    config = tiny_config(arch)
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], "right")
    with torch.no_grad():
        logits = model(ids, attention_mask=attention_mask).logits
        reference = models[arch](ids, attention_mask=attention_mask).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), reference, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_device_map_auto_splits_and_matches(arch, checkpoints, models, tmp_path):
    """device_map="auto" through accelerate: with too little CPU memory for the whole model, whole blocks
    (``_no_split_modules``) are offloaded to disk, and the logits are unchanged."""
    pytest.importorskip("accelerate")
    path, tensors = checkpoints[arch]
    cpu_bytes = int(0.6 * sum(t.numel() * 4 for t in tensors.values()))
    model = AutoModelForMaskedLM.from_pretrained(
        path, dtype=torch.float32, device_map="auto", max_memory={"cpu": cpu_bytes}, offload_folder=str(tmp_path)
    ).eval()
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}
    config = tiny_config(arch)
    ids, attention_mask = sample_batch(config["vocab_size"], config["mask_token_id"], "left")
    with torch.no_grad():
        logits = model(ids, attention_mask=attention_mask).logits
        reference = models[arch](ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(logits, reference, atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_greedy_generate_from_tiny_checkpoint(arch, models):
    """generate() one token a step, left to right, equals greedy decoding that reads Dream's logits shifted by one."""
    model = models[arch]
    mask_id = model.config.mask_token_id
    prompt = torch.tensor([[5, 9, 17, 3]])
    out = model.generate(prompt, max_new_tokens=6, steps=6, strategy="left_to_right", stop_at_eos=False)
    shift = 1 if arch == "dream" else 0
    assert model.config.logits_shift == shift
    x = torch.cat([prompt, torch.full((1, 6), mask_id)], 1)
    with torch.no_grad():
        for pos in range(4, 10):
            logits = model(x).logits[0, pos - shift]
            logits[mask_id] = -float("inf")
            x[0, pos] = logits.argmax()
    assert torch.equal(out, x)
