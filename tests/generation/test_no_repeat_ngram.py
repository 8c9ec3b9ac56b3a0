"""``no_repeat_ngram_size`` holds on the returned sequence in any reveal order (`hf_mdm.generation_ngram`): the bans
against brute force, and generate's output under every order, transfer, step count, padding, cache and ReMDM."""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny_mdm import tiny_mdm

from hf_mdm import MaskedDiffusionGenerationConfig
from hf_mdm.generation_ngram import NoRepeatNGram

MASK = 9


def repeats(row: list[int], n: int, first_generated: int) -> list[tuple[int, ...]]:
    """The n-grams through a generated column (at or after ``first_generated``) that occur twice in ``row``."""
    grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
    return [g for i, g in enumerate(grams) if i + n > first_generated and grams.count(g) > 1]


def brute_force_bans(row: list[int], col: int, n: int, vocab: int) -> set[int]:
    """Tokens t such that writing t at ``col`` (read as [MASK] before) makes some n-gram through ``col`` whose
    positions all hold tokens occur twice among the complete n-grams of the row; empty when every token would."""
    row = list(row)
    row[col] = MASK
    banned = set()
    for t in range(vocab):
        if t == MASK:
            continue
        filled = row[:col] + [t] + row[col + 1 :]
        grams = [tuple(filled[i : i + n]) for i in range(len(filled) - n + 1)]
        complete = [g for g in grams if MASK not in g]
        through = [tuple(filled[i : i + n]) for i in range(max(0, col - n + 1), min(col, len(row) - n) + 1)]
        if any(MASK not in g and complete.count(g) > 1 for g in through):
            banned.add(t)
    return set() if len(banned) == vocab - 1 else banned


@pytest.mark.parametrize("n", [1, 2, 3])
def test_bans_equal_brute_force_on_random_canvases(n):
    vocab, length = MASK + 1, 9
    generator = torch.Generator().manual_seed(n)
    ngram = NoRepeatNGram(n, MASK)
    checked = 0
    for _ in range(60):
        canvas = torch.randint(0, 4, (1, length), generator=generator)  # few tokens: many repeats
        canvas[torch.rand((1, length), generator=generator) < 0.35] = MASK
        for col in range(length):
            logits = torch.zeros((1, vocab))
            ngram.ban(logits, canvas, torch.tensor([col]), torch.tensor([0]))
            got = set((logits[0] == -float("inf")).nonzero().flatten().tolist())
            assert got == brute_force_bans(canvas[0].tolist(), col, n, vocab), (canvas.tolist(), col)
            checked += bool(got)
    assert checked > 20  # the cases ban something


def test_one_call_decides_a_rows_positions_in_turn():
    """Two adjacent masks proposed in one call, both preferring 2, beside an existing (2, 2): the first takes 2, and
    the second, seeing it, may not (alone it would: its left neighbour was a mask)."""
    ngram = NoRepeatNGram(2, MASK)
    canvas = torch.tensor([[2, 2, 1, MASK, MASK, 3]])  # (2, 2) exists
    logits = torch.full((2, MASK + 1), -5.0)
    logits[:, 2] = 5.0
    tokens = ngram.propose(logits, canvas, torch.tensor([0, 0]), torch.tensor([3, 4]), lambda lg: lg.argmax(-1))
    row = canvas[0].tolist()
    row[3:5] = tokens.tolist()
    assert not repeats(row, 2, 3) and tokens[0] == 2 and tokens[1] != 2  # the second saw the first's 2


SAMPLERS = [
    dict(strategy=strategy, transfer=transfer, temperature=temperature)
    for strategy, transfer, temperature in itertools.product(
        ["confidence", "random", "left_to_right", "margin", "entropy"], ["deterministic", "stochastic"], [0.0, 1.0]
    )
] + [
    dict(transfer="threshold", threshold=0.3),
    dict(transfer="entropy_bound", entropy_bound=2.0),
    dict(remdm="cap", remdm_eta=0.3, temperature=1.0),
    dict(remdm="loop", temperature=1.0),
    dict(kv_cache="dual"),
]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_generate_returns_no_repeated_ngram(sampler):
    model = tiny_mdm(vocab_size=64, mask_token_id=63)
    prompt = torch.tensor([[1, 2, 3, 1, 4], [5, 6, 7, 8, 9]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    failures = []
    for n, steps, seed in itertools.product([2, 3], [2, 16], [0]):
        out = model.generate(
            prompt, attention_mask=attention_mask, max_new_tokens=16, steps=steps, block_length=8, seed=seed,
            no_repeat_ngram_size=n, **sampler,
        )  # fmt: skip
        for b, row in enumerate(out.tolist()):
            kept = [t for t, a in zip(row, attention_mask[b].tolist() + [1] * 16) if a]
            failures += [(n, steps, seed, b, g) for g in repeats(kept, n, len(kept) - 16)]
    assert failures == []


def test_editing_blocks_return_no_repeated_ngram():
    model = tiny_mdm(block_size=8, vocab_size=64, mask_token_id=63)
    config = MaskedDiffusionGenerationConfig.llada21(max_new_tokens=16, threshold=0.3, editing_threshold=0.2)
    for n, seed in itertools.product([2, 3], range(3)):
        out = model.generate(
            torch.tensor([[1, 2, 3, 1, 4]]), generation_config=config, no_repeat_ngram_size=n, seed=seed
        )
        assert repeats(out[0].tolist(), n, 5) == []


def test_without_it_the_model_repeats():
    """The tiny model repeats bigrams by itself under these settings, so the tests above constrain something."""
    model = tiny_mdm(vocab_size=64, mask_token_id=63)
    out = model.generate(torch.tensor([[1, 2, 3, 1, 4]]), max_new_tokens=16, steps=5, block_length=8)
    assert repeats(out[0].tolist(), 2, 5)
