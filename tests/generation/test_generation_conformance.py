"""generate() as transformers users expect it, on every model class hf_mdm registers: each `GenerationConfig` field
honoured (checked against a step-by-step brute force or a property the field guarantees) or rejected by name."""

import pytest
import torch
from conformance_models import MASK, TINY, VOCAB, build
from transformers import GenerationConfig, WatermarkingConfig
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from hf_mdm.generation import logits_shift_of
from hf_mdm.generation_config import DIFFUSION_FIELDS
from hf_mdm.generation_processors import HONOURED, NEUTRAL

PROMPT = torch.tensor([[3, 4, 5], [6, 7, 8]])
ONE_A_STEP = dict(max_new_tokens=10, steps=10, strategy="left_to_right", temperature=0.0, stop_at_eos=False)


@pytest.fixture(params=list(TINY), ids=lambda c: c.__name__)
def model(request):
    return build(request.param)


def generated(model, **kwargs):
    return model.generate(PROMPT, **{**ONE_A_STEP, **kwargs})[:, PROMPT.shape[1] :]


def column_logits(model, canvas: torch.Tensor, column: int) -> torch.Tensor:
    """(B, V) the model's logits for ``column`` of ``canvas`` (the logits shift of the model applied)."""
    return model(canvas).logits[:, column - logits_shift_of(model)]


def brute_force_left_to_right(model, processor=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy one token a step, left to right, by hand: each column's argmax ([MASK] excluded) after ``processor``
    (which sees the canvas row); the canvas and each column's raw logits."""
    canvas = torch.cat([PROMPT, torch.full((2, ONE_A_STEP["max_new_tokens"]), MASK)], dim=1)
    raw = []
    for column in range(PROMPT.shape[1], canvas.shape[1]):
        logits = column_logits(model, canvas, column)
        raw.append(logits)
        scores = processor(canvas, logits.clone()) if processor is not None else logits.clone()
        scores[:, MASK] = -float("inf")
        canvas[:, column] = scores.argmax(-1)
    return canvas, raw


def test_output_scores_and_logits_are_the_revealing_steps(model):
    out = model.generate(PROMPT, **ONE_A_STEP, return_dict_in_generate=True, output_scores=True, output_logits=True)
    canvas, raw = brute_force_left_to_right(model)
    assert torch.equal(out.sequences, canvas)
    assert len(out.scores) == len(out.logits) == ONE_A_STEP["max_new_tokens"]
    for column, (scores, logits, expected) in enumerate(zip(out.scores, out.logits, raw)):
        assert scores.shape == (2, VOCAB)
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        without_mask = scores.clone()
        without_mask[:, MASK] = -float("inf")
        assert torch.equal(without_mask.argmax(-1), out.sequences[:, PROMPT.shape[1] + column])
    plain = model.generate(PROMPT, **ONE_A_STEP, return_dict_in_generate=True)
    assert plain.scores is None and plain.logits is None


def test_repetition_penalty_matches_transformers_processor_step_by_step(model):
    penalty = RepetitionPenaltyLogitsProcessor(4.0)

    def without_mask_column(canvas, logits):  # [MASK] fills the canvas but is not a token to penalise
        kept = logits[:, MASK].clone()
        logits = penalty(canvas, logits)
        logits[:, MASK] = kept
        return logits

    expected, _ = brute_force_left_to_right(model, without_mask_column)
    assert torch.equal(model.generate(PROMPT, **ONE_A_STEP, repetition_penalty=4.0), expected)
    assert not torch.equal(model.generate(PROMPT, **ONE_A_STEP), expected)  # the penalty changed the tokens


def bigrams(row: list[int]) -> list[tuple[int, int]]:
    return list(zip(row, row[1:]))


def test_no_repeat_ngram_size(model):
    longer = {**ONE_A_STEP, "max_new_tokens": 24, "steps": 24}
    plain = model.generate(PROMPT, **longer).tolist()
    assert any(len(set(bigrams(row))) < len(bigrams(row)) for row in plain)  # the model repeats bigrams by itself
    for strategy in ("left_to_right", "confidence"):  # holds on the returned sequence in any order
        out = model.generate(PROMPT, **{**longer, "strategy": strategy}, no_repeat_ngram_size=2)
        for row in out.tolist():
            assert len(set(bigrams(row))) == len(bigrams(row))


def test_suppress_tokens_and_bad_words(model):
    plain = generated(model)
    common = torch.mode(plain.flatten()).values.item()
    assert common not in generated(model, suppress_tokens=[common]).flatten().tolist()
    assert common not in generated(model, bad_words_ids=[[common]]).flatten().tolist()
    first, second = plain[0, 0].item(), plain[0, 1].item()
    banned = model.generate(PROMPT, **ONE_A_STEP, bad_words_ids=[[first, second]])
    assert (first, second) not in bigrams(banned[0].tolist())
    assert banned[0, PROMPT.shape[1]].item() == first  # a two-token ban leaves the first token free


def test_do_sample_samples_at_temperature_one(model):
    sampled = generated(model, do_sample=True, temperature=None, seed=3)
    assert torch.equal(sampled, generated(model, temperature=1.0, seed=3))
    assert not torch.equal(sampled, generated(model))
    with pytest.raises(ValueError, match="do_sample=True"):
        generated(model, do_sample=True, temperature=0.0)


def test_max_time_stops_between_blocks(model):
    out = model.generate(
        PROMPT,
        max_new_tokens=12,
        steps=12,
        block_length=4,
        transfer="deterministic",  # (the default, but for a family with its own sampler: LLaDA2.1 edits a block longer)
        max_time=0.0,
        pad_token_id=0,
        return_dict_in_generate=True,
    )
    assert out.nfe == 4 and (out.sequences[:, PROMPT.shape[1] + 4 :] == 0).all()


# a value that asks for something for every transformers field the reverse process does not read
ASKING = {
    "num_beams": 2,
    "num_return_sequences": 2,
    "num_beam_groups": 2,
    "diversity_penalty": 0.5,
    "length_penalty": 2.0,
    "early_stopping": True,
    "guidance_scale": 2.0,
    "output_attentions": True,
    "output_hidden_states": True,
    "min_length": 5,
    "min_new_tokens": 5,
    "stop_strings": ["x"],
    "penalty_alpha": 0.6,
    "low_memory": True,
    "encoder_repetition_penalty": 2.0,
    "encoder_no_repeat_ngram_size": 2,
    "forced_bos_token_id": 1,
    "forced_eos_token_id": 1,
    "exponential_decay_length_penalty": (2, 1.5),
    "begin_suppress_tokens": [1],
    "force_words_ids": [[1]],
    "constraints": ["x"],
    "prompt_lookup_num_tokens": 3,
    "max_matching_ngram_size": 2,
    "num_assistant_tokens": 5,
    "token_healing": True,
    "dola_layers": "low",
    "top_h": 0.5,
    "use_mtp": True,
    "watermarking_config": WatermarkingConfig(greenlist_ratio=0.25),
}


def test_every_transformers_field_is_honoured_or_rejected_by_name(model):
    unread = sorted(
        n for n in vars(GenerationConfig()) if not n.startswith("_") and n not in HONOURED and n not in DIFFUSION_FIELDS
    )
    for name in unread:
        value = ASKING.get(name, 3)
        if NEUTRAL.get(name) == value:
            continue
        with pytest.raises(ValueError, match=name):
            generated(model, **{name: value})
    with pytest.raises(ValueError, match="repeat the prompt rows"):
        generated(model, num_return_sequences=2, do_sample=True, temperature=None)


def test_neutral_values_of_unread_fields_are_accepted(model):
    expected = generated(model)
    assert torch.equal(
        generated(
            model, num_beams=1, num_return_sequences=1, repetition_penalty=1.0, output_attentions=False, use_cache=True
        ),
        expected,
    )


def test_reference_and_speculative_refuse_what_they_cannot_do(model):
    with pytest.raises(ValueError, match="repetition_penalty"):
        model.generate(
            PROMPT,
            max_new_tokens=4,
            steps=4,
            transfer="speculative",
            draft_length=2,
            strategy="left_to_right",
            repetition_penalty=2.0,
        )


def test_model_families_declare_their_facts_and_the_sampler_reads_no_model_type(model):
    from pathlib import Path

    import hf_mdm
    from hf_mdm.families import facts_of

    facts = type(model).diffusion_facts
    assert facts_of(model) is facts and facts_of(model.config) == facts  # a config alone finds its family
    assert logits_shift_of(model) == facts.logits_shift
    package = Path(hf_mdm.__file__).parent
    for module in sorted(package.glob("generation*.py")):
        assert "model_type" not in module.read_text(), module.name


def test_a_new_strategy_and_transfer_are_one_registered_class_each(model):
    from hf_mdm.generation_strategy import STRATEGY_REGISTRY, PositionalStrategy, register_strategy
    from hf_mdm.generation_transfer import TRANSFER_REGISTRY, Transfer, register_transfer

    @register_strategy
    class RightToLeft(PositionalStrategy):
        name = "right_to_left_test"

        def positional_scores(self, shape, generator, device):
            return torch.arange(shape[1], device=device, dtype=torch.float32).expand(shape[0], -1)

    @register_transfer
    class Everything(Transfer):
        name = "everything_test"

        def count_rule(self, schedule, num_steps, m0, generator):
            return lambda i, block_mask: block_mask.sum(1)

    try:
        out = model.generate(
            PROMPT,
            max_new_tokens=6,
            steps=6,
            strategy="right_to_left_test",
            stop_at_eos=False,
            output_history=True,
            return_dict_in_generate=True,
        )
        first = out.history[0][:, PROMPT.shape[1] :]
        assert (first[:, -1] != MASK).all() and (first[:, :-1] == MASK).all()  # the rightmost column first
        once = model.generate(
            PROMPT, max_new_tokens=6, steps=6, block_length=3, transfer="everything_test", return_dict_in_generate=True
        )
        assert once.nfe == 2 and (once.sequences != MASK).all()  # one forward per block
    finally:
        STRATEGY_REGISTRY.pop("right_to_left_test")
        TRANSFER_REGISTRY.pop("everything_test")


def test_an_incomplete_strategy_or_transfer_says_what_to_define(model):
    """The kinds of strategy and transfer are abstract bases: a subclass that lacks its kind's hook is refused when
    it is registered or built, naming the hook; a transfer that decides no counts says what to define."""
    from hf_mdm.generation_strategy import ProposalStrategy, register_strategy
    from hf_mdm.generation_transfer import TRANSFER_REGISTRY, AdaptiveTransfer, Transfer, register_transfer

    class NoScore(ProposalStrategy):
        name = "no_score_test"

    with pytest.raises(TypeError, match="score"):
        register_strategy(NoScore)

    class NoCounts(AdaptiveTransfer):
        name = "no_counts_test"

    with pytest.raises(TypeError, match="adaptive_counts"):
        NoCounts()

    @register_transfer
    class Nothing(Transfer):
        name = "nothing_test"

    try:
        with pytest.raises(TypeError, match="define count_table or count_rule"):
            model.generate(PROMPT, max_new_tokens=4, steps=4, transfer="nothing_test")
    finally:
        TRANSFER_REGISTRY.pop("nothing_test")
