"""Block-causal models in the sampler: decoding blocks aligned to the attention blocks (positions from 0), the
block length and the exact block cache as defaults, the cache's tokens equal to no cache for every sampler, its
positions computed counted by hand, padded rows as alone."""

import math

import pytest
import torch
from conformance_models import build
from tiny_mdm import tiny_mdm

from hf_mdm import MDMConfig
from hf_mdm.generation import diffusion_generate, resolve_config
from hf_mdm.models import DreamModel, LLaDAModelLM

VOCAB, MASK = 17, 16
PROMPTS = torch.tensor([[0, 0, 1, 2, 3], [6, 7, 8, 9, 10]])
PADDING = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])


def mdm(block_size=4, **kw):
    return tiny_mdm(
        block_size, vocab_size=VOCAB, mask_token_id=MASK, num_attention_heads=2, max_position_embeddings=2048, **kw
    )


def test_a_block_causal_model_defaults_to_its_blocks_and_the_exact_cache():
    config = resolve_config(mdm(block_size=4), None, {})
    assert (config.block_length, config.kv_cache) == (4, "prefix")
    bidirectional = resolve_config(mdm(block_size=None), None, {})
    assert (bidirectional.block_length, bidirectional.kv_cache) == (None, None)
    assert resolve_config(mdm(), None, {"kv_cache": "none"}).kv_cache is None
    assert resolve_config(mdm(), None, {"block_length": 8}).block_length == 8
    speculative = resolve_config(mdm(), None, {"transfer": "speculative", "draft_length": 2})
    assert speculative.kv_cache is None and speculative.block_length == 4


SAMPLERS = {
    "paper (stochastic, random)": dict(transfer="stochastic", strategy="random", temperature=1.0),
    "deterministic confidence": dict(strategy="confidence", temperature=0.0),
    "deterministic margin, sampled": dict(strategy="margin", temperature=1.0),
    "deterministic entropy": dict(strategy="entropy", temperature=0.0),
    "left to right": dict(strategy="left_to_right", temperature=0.0),
    "threshold": dict(transfer="threshold", threshold=0.15, strategy="confidence", temperature=0.0),
    "entropy bound": dict(transfer="entropy_bound", entropy_bound=0.5, strategy="confidence", temperature=0.0),
    "remdm cap": dict(remdm="cap", remdm_eta=0.2, temperature=1.0),
    "remdm loop": dict(remdm="loop", remdm_eta=0.2, remdm_t_on=0.55, remdm_t_off=0.05, temperature=1.0),
    "guidance": dict(strategy="confidence", cfg_scale=1.0, temperature=0.0),
    "block 8 over attention blocks of 4": dict(strategy="confidence", block_length=8, temperature=0.0),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_the_exact_cache_gives_the_tokens_of_no_cache(name):
    model = mdm()
    runs = {
        kv: diffusion_generate(
            model,
            PROMPTS,
            attention_mask=PADDING,
            max_new_tokens=11,
            steps=9,
            seed=3,
            kv_cache=kv,
            return_dict_in_generate=True,
            **SAMPLERS[name],
        )
        for kv in ("none", "prefix", "dual")
    }
    for kv in ("prefix", "dual"):
        assert torch.equal(runs[kv].sequences, runs["none"].sequences), kv
        assert runs[kv].nfe == runs["none"].nfe
        assert runs[kv].forward_tokens < runs["none"].forward_tokens
    assert not bool((runs["none"].sequences == MASK).any())


@pytest.mark.parametrize("model_class", [LLaDAModelLM, DreamModel], ids=["LLaDA", "Dream (logits shift)"])
def test_the_exact_cache_on_the_native_families(model_class):
    model = build(model_class, block_size=4)
    runs = [
        diffusion_generate(model, PROMPTS[1:], max_new_tokens=10, steps=10, kv_cache=kv, temperature=0.0)
        for kv in ("none", "prefix")
    ]
    assert torch.equal(*runs)


def test_positions_computed_by_the_exact_cache_counted_by_hand():
    """Prompt of 5, 11 new tokens, attention blocks of 4: blocks of positions [4, 8) (3 to generate), [8, 12) and
    [12, 16) (4 each), one token a step. Without a cache every forward computes the 16 columns; with it: one full
    forward (16), then block [4, 8) (4) twice; each later block's first forward computes it and the block before it
    (8), its others the block (4)."""
    model = mdm()
    prompt = PROMPTS[1:]
    runs = {
        kv: diffusion_generate(
            model, prompt, max_new_tokens=11, steps=11, kv_cache=kv, temperature=0.0, return_dict_in_generate=True
        )
        for kv in ("none", "prefix")
    }
    assert runs["none"].nfe == runs["prefix"].nfe == 11
    assert runs["none"].forward_tokens == 11 * 16
    assert runs["prefix"].forward_tokens == 16 + 2 * 4 + (8 + 3 * 4) + (8 + 3 * 4)


@pytest.mark.parametrize("kv_cache", ["none", "prefix"])
def test_a_padded_row_decodes_as_it_does_alone(kv_cache):
    """Blocks count from a row's first token: the left-padded row keeps its own blocks (one token a step, so the
    other row's blocks cannot change how its steps are spent)."""
    model = mdm()
    kw = dict(max_new_tokens=9, temperature=0.0, strategy="confidence", kv_cache=kv_cache)
    batch = diffusion_generate(model, PROMPTS, attention_mask=PADDING, steps=11, **kw)
    alone = [
        diffusion_generate(model, PROMPTS[:1, 2:], steps=9, **kw),
        diffusion_generate(model, PROMPTS[1:], steps=9, **kw),
    ]
    assert torch.equal(batch[0, 2:], alone[0][0]) and torch.equal(batch[1], alone[1][0])


def test_speculative_decoding_keeps_the_left_to_right_tokens():
    model = mdm()
    greedy = diffusion_generate(
        model, PROMPTS[1:], max_new_tokens=11, steps=11, strategy="left_to_right", temperature=0.0
    )
    speculative = diffusion_generate(
        model, PROMPTS[1:], max_new_tokens=11, transfer="speculative", draft_length=3, temperature=0.0
    )
    assert torch.equal(speculative, greedy)


def test_a_block_never_sees_later_blocks_through_the_sampler():
    """Decoding the first block with anything after it gives the same tokens: the model is block-causal."""
    model = mdm()
    short = diffusion_generate(model, PROMPTS[1:], max_new_tokens=3, steps=3, temperature=0.0)
    long = diffusion_generate(model, PROMPTS[1:], max_new_tokens=11, steps=11, temperature=0.0)
    assert torch.equal(long[:, :8], short)


def test_the_one_forward_loss_equals_the_loss_block_by_block():
    """BD3-LM's objective: block j is denoised from its noisy copy and the clean blocks before it. One forward of x_t
    and x_0 side by side gives the loss of separate forwards, one per block, of [x_0 before the block, x_t block]."""
    from hf_mdm.training import BlockDiffusionCollator

    block = 3
    model = mdm(block_size=block)
    torch.manual_seed(1)
    data = torch.randint(0, VOCAB - 1, (4, 10)).tolist()  # 10 = 3 + 3 + 3 + 1: a short last block
    batch = BlockDiffusionCollator(mask_token_id=MASK, block_size=block, seed=0)(data)
    assert batch["t"].shape == (4, 4)
    one = model(**batch).loss
    clean, noisy, labels, t = batch["clean_ids"], batch["input_ids"], batch["labels"], batch["t"]
    total = torch.zeros(())
    for j, start in enumerate(range(0, 10, block)):
        end = min(start + block, 10)
        logits = model(torch.cat([clean[:, :start], noisy[:, start:end]], 1)).logits[:, start:]
        ce = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), labels[:, start:end], ignore_index=-100, reduction="none"
        )
        total = total + (ce / t[:, j : j + 1]).sum()  # the linear schedule's ELBO weight 1/t
    torch.testing.assert_close(one, total / clean.numel())


def test_the_collator_noises_each_block_at_its_own_time():
    from hf_mdm.training import BlockDiffusionCollator

    collator = BlockDiffusionCollator(mask_token_id=MASK, block_size=50, seed=0, t_range=(0.3, 0.8))
    batch = collator([[1] * 200] * 64)
    t = batch["t"]
    assert t.shape == (64, 4) and float(t.min()) >= 0.3 and float(t.max()) <= 0.8
    masked = (batch["input_ids"] == MASK).view(64, 4, 50).float().mean(-1)  # per block, the masked fraction ~ t
    assert float((masked - t).abs().mean()) < 0.06
    assert torch.equal(batch["clean_ids"], torch.ones(64, 200, dtype=torch.long))
    with pytest.raises(ValueError, match="t_range"):
        BlockDiffusionCollator(mask_token_id=MASK, block_size=4, t_range=(0.9, 0.1))


def test_block_diffusion_training_lowers_the_loss(tmp_path):
    from datasets import Dataset
    from transformers import TrainingArguments

    from hf_mdm.training import build_trainer

    torch.manual_seed(0)
    rows = [[i % 4, (i + 1) % 4, (i + 2) % 4, (i + 3) % 4] * 2 for i in range(64)]  # a cyclic language over 4 tokens
    data = Dataset.from_dict({"input_ids": rows})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=60,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=10,
        disable_tqdm=True,
    )
    trainer = build_trainer("mdm", data, data, vocab_size=4, length=8, args=args, block_size=2)
    assert trainer.model.config.block_size == 2
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    assert trainer.evaluate()["eval_loss"] < 0.5 * before


def _exact_block_ser(length: int, block: int, steps: int) -> float:
    """The SER of the paper's sampler run block by block on the chain language, by enumeration: every assignment of
    reveal steps (uniform on 1..s in each block), and at each step every outcome of the positions it reveals, each
    drawn from its exact posterior marginal given the visible tokens (computed from all 16**L sequences)."""
    import itertools

    from hf_mdm.languages import ChainLanguage

    everything = torch.cartesian_prod(*[torch.arange(16)] * length).reshape(-1, length)
    prob = ChainLanguage().log_prob(everything).double().exp()
    support = {tuple(row) for row in everything[prob > 0].tolist()}
    memo: dict = {}

    def marginal(visible: tuple, i: int) -> list[tuple[int, float]] | None:
        """The posterior of position i given the visible tokens; None when they are already impossible."""
        if (visible, i) not in memo:
            keep = torch.ones(len(everything), dtype=torch.bool)
            for j, token in visible:
                keep &= everything[:, j] == token
            weights = torch.zeros(16, dtype=torch.float64).index_add_(0, everything[keep, i], prob[keep])
            total = float(weights.sum())
            memo[visible, i] = (
                None if total == 0 else [(t, float(weights[t]) / total) for t in weights.nonzero().flatten().tolist()]
            )
        return memo[visible, i]

    def valid(schedule: list, visible: dict) -> float:
        if not schedule:
            return float(tuple(visible[j] for j in range(length)) in support)
        revealed, total = schedule[0], 0.0
        marginals = [marginal(tuple(sorted(visible.items())), i) for i in revealed]
        if any(m is None for m in marginals):
            return 0.0  # an impossible pair is already visible: the sequence is invalid whatever comes next
        for outcome in itertools.product(*marginals):
            p = math.prod(weight for _, weight in outcome)
            total += p * valid(schedule[1:], {**visible, **dict(zip(revealed, (t for t, _ in outcome)))})
        return total

    ser, patterns = 0.0, list(itertools.product(range(steps), repeat=length))
    for pattern in patterns:
        schedule = [
            [i for i in range(start, min(start + block, length)) if pattern[i] == step]
            for start in range(0, length, block)
            for step in range(steps)
        ]
        ser += (1.0 - valid([group for group in schedule if group], {})) / len(patterns)
    return ser


@pytest.mark.parametrize(
    ("length", "block", "steps"), [(4, 2, 2), (4, 4, 2), (3, 2, 1), (4, 1, 1), (3, 3, 3), (3, 2, 2)]
)
def test_the_chain_closed_form_equals_enumeration(length, block, steps):
    from hf_mdm.languages import ChainLanguage

    predicted = ChainLanguage.predicted_block_ser(length, block, steps)
    assert predicted == pytest.approx(_exact_block_ser(length, block, steps), abs=1e-12)
    if block == length:
        assert predicted == pytest.approx(ChainLanguage.predicted_ser(length, steps))


def test_positions_computed_with_the_exact_cache_by_hand():
    from hf_mdm.experiments.blocks import positions_per_token

    # L = 8 in blocks of 2, 3 forwards each: 4 blocks x 3 canvases x 2 positions, plus 3 recomputed blocks of 2
    assert positions_per_token(8, 2, canvases=12) == (24 + 6) / 8
    assert positions_per_token(8, 8, canvases=5) == 5  # one block: the bidirectional model's forwards


def test_interleaved_medians_alternate_the_runs_and_drop_the_warm_up(monkeypatch):
    from hf_mdm import timer

    order, clock = [], iter(range(1000))
    monkeypatch.setattr(timer.time, "perf_counter", lambda: float(next(clock)))
    runs = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    seconds = timer.interleaved_medians(runs, repeats=3, device="cpu", warmup=2)
    assert order == ["a", "b"] * 5  # two warm-up rounds, then three timed ones, a and b in turn
    assert seconds == {"a": 1.0, "b": 1.0}  # each call spans one tick of the fake clock
    with pytest.raises(ValueError, match="repeats"):
        timer.interleaved_medians(runs, repeats=0, device="cpu")


def _point(model, ser, low, high, forwards, language="hmm"):
    return {
        "language": language,
        "length": 16,
        "model": model,
        "block_size": 4,
        "steps": 16,
        "ser": ser,
        "ser_ci_low": low,
        "ser_ci_high": high,
        "forwards_per_token": forwards,
        "positions_per_token": 2 * forwards,
        "num_samples": 256,
        "gen_ppl_increase": 0.0,
        "gen_ppl_ci_low": 0.0,
        "gen_ppl_ci_high": 0.0,
    }


def test_trained_findings_claim_only_what_the_intervals_support():
    from hf_mdm.experiments.blocks_trained import AR, trained_findings

    ar = {**_point(AR, 0.10, 0.07, 0.14, 1.0), "gen_ppl_increase": math.inf}  # out of support: no sentence
    overlapping = [
        _point("block diffusion (b = 4)", s, lo, hi, f)
        for s, lo, hi, f in [(0.5, 0.4, 0.6, 0.25), (0.12, 0.09, 0.16, 0.5)]
    ]
    text = trained_findings([ar, *overlapping], [])
    assert "its interval overlapping AR's (no difference resolved), from 0.500 sequential forwards / token" in text
    apart = [
        _point("block diffusion (b = 4)", s, lo, hi, f)
        for s, lo, hi, f in [(0.5, 0.4, 0.6, 0.25), (0.3, 0.2, 0.4, 1.0)]
    ]
    text = trained_findings([ar, *apart], [])
    assert "overlapping" not in text and "no setting measured reaches AR's SER; the lowest is 0.300" in text
    finite = trained_findings([_point(AR, 0.1, 0.07, 0.14, 1.0), *apart], [])
    assert "- hmm, generative perplexity: AR's 0.000 [0.000, 0.000] (256 samples)." in finite


def test_the_time_verdict_names_the_lengths_where_it_was_faster():
    from hf_mdm.experiments.blocks_trained import AR, trained_findings

    def timing(ratios):
        rows = []
        for length, ratio in ratios.items():
            rows += [
                {"length": length, "model": AR, "seconds": 1.0},
                {"length": length, "model": "bd", "seconds": 1 / ratio},
            ]
        return rows

    assert "faster than AR in every round only at L = 128, 512 (" in trained_findings(
        [], timing({32: 0.5, 128: 1.5, 512: 3.0})
    )
    assert "faster than AR in every round only at L = 32, 128 (" in trained_findings(
        [], timing({32: 2.0, 128: 1.5, 512: 0.9})
    )
    assert "faster than AR at every L measured" in trained_findings([], timing({32: 1.1, 128: 1.5}))


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("span", [False, True])
def test_the_broadcast_mask_equals_transformers_vmap_mask(implementation, span):
    from transformers.masking_utils import create_bidirectional_mask

    from hf_mdm.modeling_blocks import block_causal_mask_function, broadcast_mask

    config = MDMConfig(
        vocab_size=8, hidden_size=8, num_attention_heads=2, num_key_value_heads=2, mask_token_id=7, block_size=3
    )
    config._attn_implementation = implementation
    padding = torch.ones(2, 10, dtype=torch.long)
    padding[1, :3] = 0
    positions = (padding.cumsum(-1) - 1).clamp(min=0)
    columns = torch.tensor([4, 5, 6, 7]) if span else None
    embeds = torch.zeros(2, 4 if span else 10, 8)
    overlay = block_causal_mask_function(positions // 3, columns)
    expected = create_bidirectional_mask(
        config=config, inputs_embeds=embeds, attention_mask=padding, and_mask_function=overlay
    )
    assert torch.equal(broadcast_mask(config, embeds, padding, overlay), expected)
