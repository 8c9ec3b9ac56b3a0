"""GRPO for masked diffusion LMs (`hf_mdm.rl`): the log-likelihood estimators against exact values by enumeration
(each averages to its own enumerated expectation; the ELBO's is the any-order expectation over every order and
lies below the exact log-likelihood under one-token-a-step decoding, `hf_mdm.likelihood_law`); a GRPO step's
loss and gradient against a hand computation on a group of 2; the same masks for a rollout in any batch; LoRA leaves
the base unchanged; a killed run resumes to the same step count; the rewards; bad settings as one-line errors."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

pytest.importorskip("trl")

from hf_mdm import MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.generation_config import MaskedDiffusionGenerationConfig  # noqa: E402
from hf_mdm.languages import NGramLanguage  # noqa: E402
from hf_mdm.likelihood_law import RevealLaw, exact_sampler_log_probs  # noqa: E402
from hf_mdm.rl import build_estimator, exact_expectation, gsm8k_correct, language_membership  # noqa: E402
from hf_mdm.rl.estimators import estimator_options, masked_token_log_probs  # noqa: E402
from hf_mdm.rl.language_task import language_prompts, language_tokenizer  # noqa: E402
from hf_mdm.rl.trainer import DiffusionGRPOConfig, grpo_trainer  # noqa: E402
from hf_mdm.training import mdm_config_for  # noqa: E402

V, L = 3, 4
ROLLOUT = {"steps": 2, "transfer": "stochastic", "strategy": "random", "schedule": "linear"}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return MDMForMaskedDiffusion(mdm_config_for(V, L, "tiny")).eval()


def draws(estimator, model, x: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` independent summed estimates for the prompt-free sequence ``x`` (L,)."""
    generators = [torch.Generator().manual_seed(seed) for seed in range(count)]
    with torch.no_grad():
        terms, _ = estimator.per_token(model, x.expand(count, -1).clone(), None, x.numel(), generators)
    return terms.double().sum(1)


@pytest.mark.parametrize(
    "name, options", [("elbo", {"draws": 2}), ("coupled", {}), ("one_step", {}), ("decoding", {"steps": 2})]
)
def test_each_estimator_averages_to_its_enumerated_expectation(model, name, options):
    estimator = build_estimator(name, **options)
    for x in (torch.tensor([0, 1, 2, 0]), torch.tensor([2, 2, 1, 0])):
        values = draws(estimator, model, x, 400)
        exact = exact_expectation(estimator, model, x)
        standard_error = float(values.std()) / math.sqrt(values.numel())
        assert abs(float(values.mean()) - exact) <= 4 * standard_error + 1e-5, (name, x.tolist())
        assert (standard_error == 0) == (name == "one_step")  # without a prompt the one-step estimate is fixed


def test_the_elbo_is_the_any_order_expectation_and_bounds_the_decoding_law(model):
    """The ELBO's enumerated expectation equals the mean over all L! orders of the sum of log p(x_i | x revealed
    before it); it is at most log p(x) under the sampler that reveals one token a step in a uniform order."""
    law = RevealLaw(steps=L, order="random", transfer="deterministic")
    exact = exact_sampler_log_probs(model, law, L, V)
    index = {x: i for i, x in enumerate(itertools.product(range(V), repeat=L))}
    elbo = build_estimator("elbo")
    for x in ((0, 1, 2, 0), (2, 2, 1, 0), (1, 1, 1, 1)):
        sequence = torch.tensor(x)
        orders = []
        for order in itertools.permutations(range(L)):
            total = 0.0
            for k, position in enumerate(order):
                noisy = sequence.clone()
                noisy[list(order[k:])] = model.config.mask_token_id
                with torch.no_grad():
                    total += float(masked_token_log_probs(model, noisy[None], sequence[None], None, 0)[0][0, position])
            orders.append(total)
        expectation = exact_expectation(elbo, model, sequence)
        assert expectation == pytest.approx(sum(orders) / len(orders), abs=1e-5)
        assert expectation <= float(exact[index[x]]) + 1e-9


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_the_decoding_law_estimate_bounds_the_exact_likelihood_law(model, steps):
    """The ``decoding`` estimator's expectation is at most log pi_N(x), the exact log-likelihood under the paper's
    sampler at N steps (equal at N = 1, where there is one grouping)."""
    law = RevealLaw(steps=steps)
    exact = exact_sampler_log_probs(model, law, L, V)
    index = {x: i for i, x in enumerate(itertools.product(range(V), repeat=L))}
    estimator = build_estimator("decoding", steps=steps)
    for x in ((0, 1, 2, 0), (2, 2, 1, 0)):
        expectation = exact_expectation(estimator, model, torch.tensor(x))
        if steps == 1:
            assert expectation == pytest.approx(float(exact[index[x]]), abs=1e-5)  # float32 forwards
        else:
            assert expectation <= float(exact[index[x]]) + 1e-9


@pytest.mark.parametrize("steps, transfer", [(4, "stochastic"), (4, "deterministic")])
def test_the_decoding_estimate_bounds_the_block_sampler(model, steps, transfer):
    """Rollouts in blocks of 2 (L = 4): the ``decoding`` estimator takes the rollouts' settings (block_length among
    them) and its expectation is at most log pi(x), the exact log-likelihood of that block sampler, on every sequence
    of V^L; without the block length (the estimator of before) it exceeded it on about half of them."""
    rollout = MaskedDiffusionGenerationConfig(
        max_new_tokens=L, steps=steps, transfer=transfer, strategy="random", block_length=2, temperature=1.0
    )
    options = estimator_options("decoding", {}, rollout)
    assert options == {"steps": steps, "block_length": 2, "transfer": transfer, "order": "random",
                       "schedule": "linear", "generation_length": L}  # fmt: skip
    estimator, blind = (
        build_estimator("decoding", **options),
        build_estimator("decoding", steps=steps, transfer=transfer),
    )
    exact = exact_sampler_log_probs(model, estimator.law(), L, V)
    gaps, blind_gaps = [], []
    for i, x in enumerate(itertools.product(range(V), repeat=L)):
        gaps.append(exact_expectation(estimator, model, torch.tensor(x)) - float(exact[i]))
        blind_gaps.append(exact_expectation(blind, model, torch.tensor(x)) - float(exact[i]))
    assert max(gaps) <= 1e-5  # float32 forwards
    assert sum(gap > 1e-5 for gap in blind_gaps) > 0.3 * len(gaps)


def test_the_decoding_estimator_refuses_what_it_does_not_model(tmp_path):
    decoding = {"estimator": "decoding"}
    for setting, message in [
        ({"top_k": 2}, "rollout setting top_k=2 changes their law"),
        ({"cfg_scale": 1.0}, "rollout setting cfg_scale=1.0"),
        ({"remdm": "cap", "remdm_eta": 0.1}, "rollout setting remdm"),
        ({"strategy": "confidence"}, "--rollout strategy=random"),
    ]:
        with pytest.raises(ValueError, match=message):
            grpo_config(tmp_path, rollout=ROLLOUT | setting, **decoding)
    with pytest.raises(ValueError, match="estimator option steps=3 contradicts the rollouts' steps=2"):
        grpo_config(tmp_path, estimator_options={"steps": 3}, **decoding)
    with pytest.raises(ValueError, match="estimator 'decoding' has no option 'bogus': its options .* are steps=1, "):
        grpo_config(tmp_path, estimator_options={"bogus": 2}, **decoding)
    block_causal = MDMForMaskedDiffusion(mdm_config_for(V, L, "tiny", block_size=2))
    with pytest.raises(ValueError, match=r"MDMForMaskedDiffusion \(block_size=2\) aligns .* --estimator coupled"):
        build_estimator("decoding", steps=2).check_model(block_causal)


def test_the_elbo_under_several_iterations_needs_the_sequence_ratio(tmp_path):
    """With num_iterations > 1 TRL's ratio spans policy updates; the ELBO's per-token terms are not log-probabilities,
    so only its sequence-level ratio is accepted."""
    with pytest.raises(ValueError, match="importance_sampling_level='sequence'"):
        grpo_config(tmp_path, estimator="elbo", num_iterations=2)
    assert grpo_config(tmp_path, estimator="elbo", num_iterations=2, importance_sampling_level="sequence")
    assert grpo_config(tmp_path, estimator="coupled", num_iterations=2)  # per-token log-probabilities


def grpo_config(tmp_path, **overrides) -> DiffusionGRPOConfig:
    settings = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=L,
        max_steps=1, learning_rate=1e-3, report_to=[], use_cpu=True, rollout=ROLLOUT, estimator="coupled", beta=0.0,
        save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, bf16=False,
    )  # fmt: skip
    return DiffusionGRPOConfig(**(settings | overrides))


def trainer_for(model, tmp_path, rewards, lora=None, **overrides):
    config = grpo_config(tmp_path, **overrides)
    return grpo_trainer(model, rewards, language_prompts(8), config, language_tokenizer(V), lora)


def test_a_grpo_step_is_the_hand_computation_on_a_group_of_two(model, tmp_path):
    """Rewards 1 and 0: advantages (r - mean) / (std + 1e-4); the loss: the sum over tokens of (-A_i + beta KL) r
    with r = exp(logp - logp.detach()) (TRL's KL with its importance correction) over the batch's tokens (TRL's
    dapo); its value and gradient, with the reference a copy of the initial model and the policy moved from it."""
    policy = MDMForMaskedDiffusion(model.config)
    policy.load_state_dict(model.state_dict())
    trainer = trainer_for(policy, tmp_path, lambda completion_ids, **_: [1.0, 0.0][: len(completion_ids)], beta=0.1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before each step
    policy.train()
    batch = trainer._generate_and_score_completions(list(language_prompts(2)))
    ids, mask = batch["completion_ids"], batch["completion_mask"]
    policy.zero_grad()
    loss = trainer.compute_loss(policy, batch)
    loss.backward()
    served = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    rewards = torch.tensor([1.0, 0.0])
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    generators = lambda: [trainer.row_generator(row, torch.ones_like(row)) for row in ids]  # noqa: E731
    policy.zero_grad()
    logp, _ = trainer.estimator.per_token(policy, ids, mask, L, generators())
    with torch.no_grad():
        reference, _ = trainer.estimator.per_token(model, ids, mask, L, generators())
    ratio = torch.exp(logp - logp.detach())
    kl = torch.exp(reference - logp) - (reference - logp) - 1
    hand = ((-advantages[:, None] * ratio + 0.1 * kl * ratio) * mask).sum() / mask.sum()
    hand.backward()
    assert float(loss) == pytest.approx(float(hand), abs=1e-6) and float(kl.sum()) > 0
    for name, grad in served.items():
        assert torch.allclose(grad, dict(policy.named_parameters())[name].grad, atol=1e-6), name


def test_masks_are_drawn_per_step_and_shared_by_old_reference_and_current(model, tmp_path):
    """TRL scores a rollout batch under the old and reference policy when it draws it, and under the current policy
    later (here at the next step, num_iterations=2): all three with the masks of the step the batch was drawn at
    (equal values, the three policies being equal); a batch drawn at another step gets new masks for the same rows."""
    policy = MDMForMaskedDiffusion(model.config)
    policy.load_state_dict(model.state_dict())
    trainer = trainer_for(policy, tmp_path, lambda completion_ids, **_: [1.0] * len(completion_ids), beta=0.1,
                          num_iterations=2)  # fmt: skip
    policy.train()
    batch = trainer._generate_and_score_completions(list(language_prompts(2)))
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].shape[1]
    trainer.state.global_step += 1  # the batch's second iteration
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(policy, ids, mask, width)
    assert torch.equal(current, batch["old_per_token_logps"]) and torch.equal(current, batch["ref_per_token_logps"])
    trainer.state.global_step = 5
    trainer._generate_single_turn(batch["prompt_ids"].tolist(), None, None, 2)  # a batch drawn at step 5
    with torch.no_grad():
        later, _, _ = trainer._get_per_token_logps_and_entropies(policy, ids, mask, width)
    assert not torch.equal(later, current)


def test_a_rollout_gets_the_same_masks_in_any_batch(model, tmp_path):
    trainer = trainer_for(model, tmp_path, language_membership(NGramLanguage.random(vocab_size=V, n=2, seed=0)))
    rows = torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0], [1, 0, 0, 2]])
    with torch.no_grad():
        together, _, _ = trainer._get_per_token_logps_and_entropies(model, rows, torch.ones_like(rows), L)
        alone, _, _ = trainer._get_per_token_logps_and_entropies(model, rows[1:2], torch.ones_like(rows[1:2]), L)
    assert torch.equal(together[1], alone[0]) and not torch.equal(together[0], together[1])


def test_lora_trains_the_adapters_and_leaves_the_base(model, tmp_path):
    language = NGramLanguage.random(vocab_size=V, n=2, seed=0)
    policy = MDMForMaskedDiffusion(model.config)
    policy.load_state_dict(model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = trainer_for(policy, tmp_path, lambda completion_ids, **_: [float(i % 2) for i in range(len(completion_ids))],
                          lora={"r": 4, "alpha": 8}, max_steps=2, beta=0.05)  # fmt: skip
    adapters = {n: p.clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    base = trainer.model.get_base_model().state_dict()
    for key, value in before.items():
        stored = base.get(key, base.get(key.replace(".weight", ".base_layer.weight")))
        assert torch.equal(stored, value), key
    assert any(not torch.equal(p, adapters[n]) for n, p in trainer.model.named_parameters() if n in adapters)
    assert language.vocab_size == V


def test_a_killed_run_resumes_to_the_uninterrupted_run(model, tmp_path):
    """A run killed after step 3 and resumed from its step-2 checkpoint draws the rollouts and masks the
    uninterrupted run drew (seeds from the step, not from counters that restart), ends with its weights exactly, and
    its rollout log holds each step once (the killed run's step 2 cut on resume)."""
    from transformers import TrainerCallback

    from hf_mdm.training import train

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise KeyboardInterrupt

    reward = language_membership(NGramLanguage.random(vocab_size=V, n=2, seed=0))
    settings = dict(max_steps=4, save_strategy="steps", save_steps=2, beta=0.04)

    def run(folder, kill=False):
        policy = MDMForMaskedDiffusion(model.config)
        policy.load_state_dict(model.state_dict())
        trainer = trainer_for(policy, folder, reward, **settings)
        if kill:
            trainer.add_callback(Kill())
            with pytest.raises(KeyboardInterrupt):
                train(trainer)
            return None
        train(trainer)
        return trainer.model.state_dict(), (folder / "rollouts-0.jsonl").read_text().splitlines()

    weights, log = run(tmp_path / "whole")
    run(tmp_path / "cut", kill=True)
    assert sorted(p.name for p in (tmp_path / "cut").glob("checkpoint-*")) == ["checkpoint-2"]
    resumed_weights, resumed_log = run(tmp_path / "cut")
    assert [json.loads(line)["step"] for line in resumed_log] == [0, 1, 2, 3]
    assert resumed_log == log
    assert all(torch.equal(resumed_weights[k], value) for k, value in weights.items())
    assert any(not torch.equal(weights[k], value) for k, value in model.state_dict().items())


def test_the_rewards():
    language = NGramLanguage.random(vocab_size=V, n=2, seed=0)
    inside = language.sample(1, L, torch.Generator().manual_seed(0))[0].tolist()
    candidates = [list(x) for x in itertools.product(range(V), repeat=L)]
    outside = next((x for x in candidates if not bool(language.in_support(torch.tensor([x]))[0])), None)
    reward = language_membership(language)
    assert reward(completion_ids=[inside, [V, 0, 0, 0]]) == [1.0, 0.0]
    if outside is not None:
        assert reward(completion_ids=[outside]) == [0.0]
    texts = ["so 3 + 4 = 7.\n#### 7", "I think it is 12", "#### 8"]
    assert gsm8k_correct(texts, answer=["7", "12", "7"]) == [1.0, 1.0, 0.0]
    assert gsm8k_correct([[{"role": "assistant", "content": "#### 5"}]], answer=["5"]) == [1.0]


def test_bad_settings_are_one_line_errors(model, tmp_path):
    from hf_mdm.rl.rewards import reward_by_name

    reward = language_membership(NGramLanguage.random(vocab_size=V, n=2, seed=0))
    with pytest.raises(ValueError, match="unknown log-likelihood estimator 'exact'"):
        trainer_for(model, tmp_path, reward, estimator="exact")
    with pytest.raises(ValueError, match="estimator 'elbo'"):
        trainer_for(model, tmp_path, reward, estimator="elbo", estimator_options={"samples": 3})
    with pytest.raises(ValueError, match="rollout settings: unknown preset 'fast'"):
        trainer_for(model, tmp_path, reward, rollout={"preset": "fast"})
    with pytest.raises(ValueError, match="steps"):
        trainer_for(model, tmp_path, reward, rollout={"steps": 0})
    with pytest.raises(ValueError, match="rollout settings: preset 'llada'.*block_length"):
        trainer_for(model, tmp_path, reward, rollout={"preset": "llada", "steps": 4})
    preset = trainer_for(model, tmp_path, reward, rollout={"preset": "llada", "steps": 2, "block_length": 2})
    config = preset.rollout_generation_config
    assert (config.max_new_tokens, config.steps, config.block_length, config.temperature) == (L, 2, 2, 1.0)
    with pytest.raises(ValueError, match="module:function"):
        reward_by_name("accuracy")
    short = trainer_for(model, tmp_path, lambda completion_ids, **_: [1.0])
    with pytest.raises(ValueError, match=r"reward '<lambda>' returned 1 values for 2 completions"):
        short.train()
    words = trainer_for(model, tmp_path, lambda completion_ids, **_: ["yes"] * len(completion_ids))
    with pytest.raises(ValueError, match=r"reward '<lambda>' returned 'yes'"):
        words.train()
    with pytest.raises(ValueError, match="cannot import"):
        reward_by_name("no_such_module:reward")


def test_the_trl_fence_swaps_one_function_and_restores_it(monkeypatch):
    """`reference_as_copy` is the one place hf_mdm reaches into TRL's module: inside it TRL's reference builder
    returns a copy of the given model, after it the original is back; a TRL without that function is refused."""
    import trl.trainer.grpo_trainer as grpo_module

    from hf_mdm.rl.trl_fence import reference_as_copy

    original, model = grpo_module.create_model_from_path, torch.nn.Linear(2, 2)
    with reference_as_copy(model):
        copied = grpo_module.create_model_from_path("any/path", dtype="auto")
    assert grpo_module.create_model_from_path is original
    assert copied is not model and torch.equal(copied.weight, model.weight)
    monkeypatch.delattr(grpo_module, "create_model_from_path")
    with pytest.raises(RuntimeError, match="create_model_from_path: install the TRL range"):
        with reference_as_copy(model):
            pass


def test_the_trl_fence_holds_against_the_installed_trl(monkeypatch):
    """Each private hook hf_mdm overrides has, in the installed TRL, the signature the fence records, and every call
    TRL can make of it (its parameters by position or by name) binds to the override; a changed hook is named."""
    import inspect

    from trl import GRPOTrainer

    from hf_mdm.rl.trl_fence import OVERRIDDEN_HOOKS, FencedGRPOTrainer, check_trl, signature_mismatches

    assert signature_mismatches() == []
    for hook in OVERRIDDEN_HOOKS:
        theirs, ours = (
            inspect.signature(getattr(GRPOTrainer, hook)),
            inspect.signature(getattr(FencedGRPOTrainer, hook)),
        )
        ours.bind(**{name: None for name in theirs.parameters})
        required = [p for p in theirs.parameters.values() if p.default is inspect.Parameter.empty]
        ours.bind(*[None] * len(required))

    def changed(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False, tools=None):
        return None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", changed)
    (problem,) = signature_mismatches()
    assert problem.startswith("GRPOTrainer._generate_single_turn(self, prompt_ids, images, multimodal_fields, ")
    with pytest.raises(RuntimeError, match="changed what hf_mdm's GRPO overrides: GRPOTrainer._generate_single_turn"):
        check_trl()
