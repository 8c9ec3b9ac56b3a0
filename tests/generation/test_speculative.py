"""Exact speculative decoding (``transfer="speculative"``): at temperature 0 the tokens of left-to-right decoding on
the three model classes, in fewer forwards, with the rounds of an independent re-statement; at temperature > 0 the
law of whole sequences and the accepted drafts per round against exact enumeration (the oracle on a tiny n-gram
language, and tiny networks); blocks, EOS, padding, infilling, stopping criteria, seeds."""

import itertools
import math
from collections import defaultdict
from functools import lru_cache

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.generation import diffusion_generate
from hf_mdm.languages import NGramLanguage, OracleDenoiser
from hf_mdm.models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM

MASK, VOCAB = 30, 31


def sharpen(model, head):
    with torch.no_grad():  # a sharper random network: fewer near-ties among the logits
        head.weight.mul_(20)
    return model.eval()


def build(arch: str, vocab: int = VOCAB, mask: int = MASK, seed: int = 0):
    torch.manual_seed(seed)
    if arch == "mdm":
        model = MDMForMaskedDiffusion(
            MDMConfig(
                vocab_size=vocab,
                mask_token_id=mask,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        )
        return sharpen(model, model.lm_head)
    if arch == "llada":
        model = LLaDAModelLM(
            LLaDAConfig(
                d_model=32,
                n_heads=4,
                n_kv_heads=2,
                n_layers=2,
                mlp_hidden_size=64,
                vocab_size=vocab,
                embedding_size=vocab,
                mask_token_id=mask,
                eos_token_id=1,
                pad_token_id=1,
                weight_tying=False,
            )
        )
        return sharpen(model, model.model.transformer["ff_out"])
    model = DreamModel(
        DreamConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            mask_token_id=mask,
            pad_token_id=0,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    return sharpen(model, model.lm_head)


@pytest.fixture(scope="module")
def models():
    return {arch: build(arch) for arch in ("mdm", "llada", "dream")}


def padded_prompts(side: str):
    ids = torch.randint(2, MASK, (3, 5), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    if side == "left":
        attention[1, :2] = 0
        attention[2, :1] = 0
    else:
        attention[1, 3:] = 0
    return ids, attention


def left_to_right(model, ids, **kwargs):
    return diffusion_generate(model, ids, strategy="left_to_right", steps=None, return_dict_in_generate=True, **kwargs)


def speculative(model, ids, k, **kwargs):
    return diffusion_generate(
        model, ids, transfer="speculative", draft_length=k, return_dict_in_generate=True, **kwargs
    )


# -- temperature 0: the tokens of left-to-right decoding ---------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mdm", "llada", "dream"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_greedy_tokens_equal_left_to_right_in_fewer_forwards(models, arch, side):
    ids, attention = padded_prompts(side)
    kwargs = dict(attention_mask=attention, max_new_tokens=12, stop_at_eos=False)
    reference = left_to_right(models[arch], ids, **kwargs)
    assert reference.nfe == 12
    for k in (1, 3, 6):
        out = speculative(models[arch], ids, k, **kwargs)
        assert torch.equal(out.sequences, reference.sequences), (arch, side, k)
        assert out.nfe < reference.nfe and out.steps == out.nfe
        rounds_of_rows = 12 / (1 + out.accepted_per_round)  # every row generates 12 = rounds + accepted drafts
        assert torch.allclose(rounds_of_rows, rounds_of_rows.round()) and round(float(rounds_of_rows.max())) == out.nfe


def greedy_rounds(model, prompt: torch.Tensor, new: int, k: int, shift: int):
    """Speculative decoding at temperature 0 re-stated on full forwards of one row: (rounds, canvases, accepted)."""

    def argmax_at(canvas):
        with torch.no_grad():
            logits = model(canvas[None]).logits[0].double()
        logits = torch.cat([logits[:1], logits[:-1]]) if shift else logits
        logits[:, MASK] = -math.inf
        return logits.argmax(-1)

    x = torch.cat([prompt[0], torch.full((new,), MASK)])
    start, done, held, rounds, canvases, accepted = prompt.shape[1], 0, None, 0, 0, []
    while done < new:
        m = 0 if held is None else min(k, new - done - 1)
        drafts = held[start + done : start + done + m] if m else []
        canvases += m + 1
        rounds += 1
        a = 0
        while a < m and int(argmax_at(x)[start + done]) == int(drafts[a]):
            x[start + done] = drafts[a]  # the canvas revealing a + 1 drafts: its target is the next position
            done, a = done + 1, a + 1
        held = argmax_at(x)  # the canvas of the accepted prefix: its target, and the drafts of the next round
        x[start + done] = held[start + done]
        done += 1
        accepted.append(a)
    return x, rounds, canvases, sum(accepted) / rounds


@pytest.mark.parametrize("arch", ["mdm", "llada", "dream"])
def test_greedy_rounds_match_a_restatement(models, arch):
    """The drafts come from the marginals of the canvas of the accepted prefix (with Dream's logits shift too): the
    rounds, the canvases computed and the accepted drafts are those of an independent re-statement."""
    ids = torch.tensor([[5, 9, 17, 3]])
    shift = 1 if arch == "dream" else 0
    for k in (2, 4):
        x, rounds, canvases, accepted = greedy_rounds(models[arch], ids, 10, k, shift)
        out = speculative(models[arch], ids, k, max_new_tokens=10, stop_at_eos=False)
        assert torch.equal(out.sequences[0], x)
        assert (out.nfe, out.forward_rows) == (rounds, canvases)
        assert out.forward_tokens == canvases * 14
        assert out.accepted_per_round.tolist() == pytest.approx([accepted])


def test_blocks_rounds_stay_inside_a_block_and_tokens_equal(models):
    model, ids = models["mdm"], padded_prompts("left")[0]
    reference = left_to_right(model, ids, max_new_tokens=12, block_length=5, stop_at_eos=False)
    out = speculative(model, ids, 4, max_new_tokens=12, block_length=5, stop_at_eos=False, output_history=True)
    assert torch.equal(out.sequences, reference.sequences)
    before = torch.cat([ids, torch.full((3, 12), MASK)], 1)
    for canvas in out.history:
        revealed = ((before == MASK) & (canvas != MASK)).nonzero()[:, 1]
        blocks = set(((revealed - 5) // 5).tolist())
        assert len(blocks) == 1, "a round revealed positions of two blocks"
        before = canvas
    assert len(out.history) == out.nfe
    columns = speculative(model, ids, 4, max_new_tokens=12, block_length=1, stop_at_eos=False)  # nothing to draft
    assert torch.equal(columns.sequences, reference.sequences) and columns.nfe == columns.forward_rows / 3 == 12


def test_eos_stopping_criteria_and_infilling_as_left_to_right(models):
    model, ids = models["mdm"], padded_prompts("left")[0]
    plain = left_to_right(model, ids, max_new_tokens=12, stop_at_eos=False).sequences
    eos = int(plain[0, 9])  # a token row 0 generates: rows stop at it
    kwargs = dict(max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    reference, out = left_to_right(model, ids, **kwargs), speculative(model, ids, 3, **kwargs)
    assert torch.equal(out.sequences, reference.sequences) and (out.sequences[0, 10:] == 0).all()
    assert torch.equal(out.num_generated_tokens, reference.num_generated_tokens)

    class StopAfterFirstBlock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 9, dtype=torch.bool)

    kwargs = dict(
        max_new_tokens=12,
        block_length=4,
        pad_token_id=0,
        stop_at_eos=False,
        stopping_criteria=StoppingCriteriaList([StopAfterFirstBlock()]),
    )
    reference, out = left_to_right(model, ids, **kwargs), speculative(model, ids, 3, **kwargs)
    assert torch.equal(out.sequences, reference.sequences) and (out.sequences[:, 9:] == 0).all()
    holes = ids.clone()
    holes[:, 1] = MASK
    holes[2, 3] = MASK
    reference, out = left_to_right(model, holes, max_new_tokens=6), speculative(model, holes, 3, max_new_tokens=6)
    assert torch.equal(out.sequences, reference.sequences) and not (out.sequences == MASK).any()


def test_logits_processors_act_on_targets_and_drafts(models):
    """A user processor sees each canvas row; banning the token left-to-right decoding prefers changes both alike."""
    model, ids = models["dream"], padded_prompts("left")[0]
    banned = int(
        left_to_right(model, ids, max_new_tokens=8, stop_at_eos=False).sequences[:, 5:].flatten().mode().values
    )

    class Ban(LogitsProcessor):
        def __call__(self, input_ids, scores):
            assert input_ids.shape == (scores.shape[0], 13)
            return scores.index_fill(1, torch.tensor([banned]), -math.inf)

    kwargs = dict(max_new_tokens=8, stop_at_eos=False, logits_processor=LogitsProcessorList([Ban()]))
    reference, out = left_to_right(model, ids, **kwargs), speculative(model, ids, 3, **kwargs)
    assert torch.equal(out.sequences, reference.sequences) and not (out.sequences[:, 5:] == banned).any()


def test_seed_and_generator_reproduce(models):
    model, ids = models["mdm"], padded_prompts("left")[0]
    kwargs = dict(max_new_tokens=10, temperature=1.0, top_k=5)
    a, b = speculative(model, ids, 3, seed=1, **kwargs), speculative(model, ids, 3, seed=1, **kwargs)
    c = speculative(model, ids, 3, generator=torch.Generator().manual_seed(1), **kwargs)
    d = speculative(model, ids, 3, seed=2, **kwargs)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.sequences, c.sequences)
    assert not torch.equal(a.sequences, d.sequences)


# -- temperature > 0: exact law, against enumeration -----------------------------------------------------------------


def exact_laws(model, vocab: int, length: int, temperature: float, top_k=None, shift: int = 0):
    """law(prefix, j): the processed law of position j given ``prefix`` revealed and the rest masked, from one
    forward of the model on every prefix's canvas (tokens 0..vocab-1; the model's [MASK] is id ``vocab``)."""
    prefixes = [p for m in range(length) for p in itertools.product(range(vocab), repeat=m)]
    x = torch.full((len(prefixes), length), vocab)
    for row, prefix in enumerate(prefixes):
        x[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
    with torch.no_grad():
        logits = model(x).logits.double() / temperature
    logits = torch.cat([logits[:, :1], logits[:, :-1]], 1) if shift else logits
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, -1)[..., :vocab]
    probs = probs / probs.sum(-1, keepdim=True)
    table = dict(zip(prefixes, probs.unbind(0)))
    return lambda prefix, j: table[tuple(prefix)][j]


def left_to_right_joint(law, vocab: int, length: int) -> torch.Tensor:
    """(vocab ** length,) probability of every sequence (base-vocab index) under the left-to-right factorisation."""
    joint = torch.ones(1, dtype=torch.float64)
    for i in range(length):
        prefixes = list(itertools.product(range(vocab), repeat=i))
        joint = (joint[:, None] * torch.stack([law(p, i) for p in prefixes])).flatten()
    return joint


def speculative_process(law, vocab: int, length: int, k: int):
    """The exact law of speculative decoding with draft length ``k`` by enumeration of every round's outcomes:
    ({sequence: probability}, E[accepted drafts / rounds] of a row). A round from a prefix x_<n drafts m = min(k,
    length - n - 1) positions from q_j = law(x_<n-1, j); drafts y are all kept with probability prod min(q, p);
    after a rejection the token z comes with probability max(0, p(z) - q(z)), after m kept drafts with p(z)."""

    @lru_cache(maxsize=None)
    def future(prefix):  # {(final sequence, accepted, rounds): probability} of the rounds still to come
        n = len(prefix)
        if n == length:
            return {(prefix, 0, 0): 1.0}
        m = min(k, length - n - 1) if n else 0
        outcomes = defaultdict(float)

        def walk(path, prob, a):
            p = law(prefix + path, n + a)
            q = law(prefix[:-1], n + a) if a < m else torch.zeros_like(p)
            for z in range(vocab):
                mass = prob * float((p[z] - q[z]).clamp(min=0))
                for (seq, acc, rounds), rest in future(prefix + path + (z,)).items() if mass > 0 else ():
                    outcomes[(seq, acc + a, rounds + 1)] += mass * rest
            for y in range(vocab) if a < m else ():
                kept = prob * float(torch.minimum(p[y], q[y]))
                if kept > 0:
                    walk(path + (y,), kept, a + 1)

        walk((), 1.0, 0)
        return dict(outcomes)

    sequences, ratio = defaultdict(float), 0.0
    for (seq, acc, rounds), prob in future(()).items():
        sequences[seq] += prob
        ratio += prob * acc / rounds
    return sequences, ratio


def chi_square_within(counts: torch.Tensor, probs: torch.Tensor, z: float = 4.265) -> tuple[float, float]:
    """Pearson's statistic of ``counts`` against ``probs`` (cells expecting < 5 pooled) and its rejection threshold
    at false-alarm rate 1e-5 (z = the normal 1 - 1e-5 quantile, Wilson-Hilferty's chi-square approximation)."""
    expected = probs * counts.sum()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum()[None]]).double()
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def check_against_enumeration(model, vocab, length, k, num, shift=0, **sampling):
    """Samples ``num`` rows and compares the law of whole sequences (chi-square, false-alarm 1e-5) and the mean
    accepted drafts per round (4.5 standard errors, two-sided false-alarm 7e-6) with the exact enumeration."""
    law = exact_laws(model, vocab, length, sampling.get("temperature", 1.0), sampling.get("top_k"), shift)
    joint = left_to_right_joint(law, vocab, length)
    sequences, expected_ratio = speculative_process(law, vocab, length, k)
    index = lambda seq: sum(t * vocab ** (length - 1 - i) for i, t in enumerate(seq))  # noqa: E731
    process = torch.zeros_like(joint)
    for seq, prob in sequences.items():
        process[index(seq)] = prob
    torch.testing.assert_close(process, joint, atol=1e-9, rtol=0)  # the theorem, on the enumerated rounds
    out = speculative(
        model,
        torch.zeros(num, 0, dtype=torch.long),
        k,
        max_new_tokens=length,
        stop_at_eos=False,
        seed=0,
        mask_token_id=vocab,
        **sampling,
    )
    seqs = out.sequences
    codes = (seqs * vocab ** torch.arange(length - 1, -1, -1)).sum(1)
    counts = torch.bincount(codes, minlength=vocab**length)
    assert int(counts[joint == 0].sum()) == 0, "a sequence outside the left-to-right support"
    stat, threshold = chi_square_within(counts, joint)
    assert stat < threshold, (stat, threshold)
    ratio = out.accepted_per_round.double()
    tolerance = 4.5 * float(ratio.std()) / math.sqrt(num)
    assert abs(float(ratio.mean()) - expected_ratio) < tolerance, (float(ratio.mean()), expected_ratio, tolerance)
    return joint, expected_ratio, out


def test_oracle_law_and_acceptance_equal_enumeration():
    """The oracle on a 2-gram language of 3 tokens, length 5: the left-to-right joint of the oracle is the
    language's own law; speculative samples follow it, and accept drafts at the enumerated rate."""
    language = NGramLanguage.random(vocab_size=3, n=2, seed=3, concentration=1.0, prune_threshold=0.05)
    oracle = OracleDenoiser(language)
    every = torch.tensor(list(itertools.product(range(3), repeat=5)))
    language_joint = language.log_prob(every).exp()
    for k in (2, 4):
        joint, ratio, out = check_against_enumeration(oracle, 3, 5, k, num=20000, temperature=1.0)
        torch.testing.assert_close(joint, language_joint, atol=1e-6, rtol=0)
        assert 0.3 < ratio < 3  # drafts are neither always nor never kept: the test can tell q from p
        assert bool(language.in_support(out.sequences).all())


@pytest.mark.parametrize("arch, sampling", [("mdm", dict(temperature=1.0)), ("dream", dict(temperature=0.7, top_k=2))])
def test_network_law_and_acceptance_equal_enumeration(arch, sampling):
    """A tiny network of 3 tokens (+ [MASK]), length 4, with Dream's logits shift and top-k: the same checks."""
    model = build(arch, vocab=4, mask=3, seed=1)
    with torch.no_grad():  # a random network, tempered so that its conditionals differ from its marginals
        model.lm_head.weight.mul_(0.1)
    check_against_enumeration(model, 3, 4, 2, num=12000, shift=1 if arch == "dream" else 0, **sampling)


def test_lm_eval_model_decodes_speculatively_with_left_to_right_answers(tmp_path):
    """A real lm-eval GSM8K request through the `hf_mdm` model with `transfer=speculative`: the answer of
    left-to-right decoding (one token a step, temperature 0) in fewer sequential forwards, and the timing records
    the rows it computed."""
    from hf_mdm.harness import MaskedDiffusionLM, simple_evaluate
    from hf_mdm.harness.evaluator import build_task_manager
    from hf_mdm.harness.tiny import build_tiny_models

    tiny = build_tiny_models(tmp_path)
    answers, records = {}, {}
    for name, settings in (
        ("speculative", dict(transfer="speculative", draft_length=4)),
        ("left_to_right", dict(strategy="left_to_right", steps=None)),
    ):
        model = MaskedDiffusionLM(pretrained=tiny["mdm"], device="cpu", max_gen_toks=16, **settings)
        results = simple_evaluate(
            model, tasks=["mdm_gsm8k"], limit=1, log_samples=True, task_manager=build_task_manager(["mdm_gsm8k"])
        )
        answers[name] = results["samples"]["mdm_gsm8k"][0]["resps"]
        (records[name],) = model.timing.records
    assert answers["speculative"] == answers["left_to_right"]
    assert records["speculative"].nfe < records["left_to_right"].nfe
    per_forward = {name: r.forward_tokens / r.nfe for name, r in records.items()}
    assert per_forward["speculative"] > per_forward["left_to_right"]  # several canvases a round, one a step
