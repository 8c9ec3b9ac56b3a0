"""The GRPO log-likelihood estimators (`hf_mdm.rl.estimators`) against the exact log-likelihood of rollouts under
the sampler that drew them: bias and spread, in nats per sequence. Part of ``make bench`` (->
evaluation/RL_ESTIMATORS.md).

Setting: a 2-gram language of 4 tokens at L = 6 (every one of its 4^6 sequences enumerable), a tiny MDM trained on
it; rollouts drawn by the paper's sampler (stochastic transfer, random order, linear schedule, temperature 1) at
N = 2 and N = L. For each rollout y:

- log pi_N(y): its exact log-likelihood under that sampler (`hf_mdm.likelihood_law.exact_sampler_log_probs`:
  every ordered grouping of the positions enumerated);
- each estimator's expectation, by enumerating its masks (`hf_mdm.rl.estimators.exact_expectation`), and the
  spread of one estimate (``--draws`` independent draws);

the table gives, over the rollouts, the mean bias E[estimate] - log pi_N(y), its spread across rollouts, and the
mean standard deviation of one estimate. The estimators target different quantities, so the bias is what each
costs as a stand-in for the rollout's log-likelihood, the ratio GRPO needs.

    python evaluation/rl_estimators.py [--rollouts 24] [--draws 64] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import print_and_write  # noqa: E402

from hf_mdm.experiments.common import sample_mdm, trained_model  # noqa: E402
from hf_mdm.languages import NGramLanguage  # noqa: E402
from hf_mdm.likelihood_law import RevealLaw, exact_sampler_log_probs  # noqa: E402
from hf_mdm.rl import build_estimator, exact_expectation  # noqa: E402

VOCAB, LENGTH = 4, 6
TRAINING = {"size": "tiny", "num_train": 20000, "num_validation": 1000, "batch_size": 128, "max_steps": 400,
            "learning_rate": 3.0e-3, "warmup_steps": 20, "seed": 0}  # fmt: skip


def estimators(steps: int) -> list[tuple[str, Any]]:
    return [
        ("one_step (d1, no prompt)", build_estimator("one_step")),
        ("coupled (DiffuCoder)", build_estimator("coupled")),
        ("elbo, 1 draw", build_estimator("elbo", draws=1)),
        ("elbo, 4 draws", build_estimator("elbo", draws=4)),
        (f"decoding (the sampler's own law, N = {steps})", build_estimator("decoding", steps=steps)),
    ]


def spread(estimator: Any, model: Any, y: torch.Tensor, draws: int) -> float:
    """The standard deviation of one summed estimate for ``y``, over ``draws`` independent draws."""
    generators = [torch.Generator().manual_seed(1000 + d) for d in range(draws)]
    with torch.no_grad():
        terms, _ = estimator.per_token(model, y.expand(draws, -1).clone(), None, y.numel(), generators)
    return float(terms.double().sum(1).std())


def rows_for(model: Any, steps: int, args: argparse.Namespace) -> list[dict]:
    exact = exact_sampler_log_probs(model, RevealLaw(steps), LENGTH, VOCAB)
    index = {x: i for i, x in enumerate(itertools.product(range(VOCAB), repeat=LENGTH))}
    rollouts = sample_mdm(model, args.rollouts, LENGTH, steps, seed=steps)
    out = []
    for name, estimator in estimators(steps):
        biases, sds = [], []
        for y in rollouts:
            biases.append(exact_expectation(estimator, model, y) - float(exact[index[tuple(y.tolist())]]))
            sds.append(spread(estimator, model, y, args.draws))
        out.append({"steps": steps, "estimator": name, "forwards": estimator.forwards, "bias": statistics.fmean(biases),
                    "bias_sd": statistics.stdev(biases), "sd": statistics.fmean(sds)})  # fmt: skip
    return out


def markdown(rows: list[dict], args: argparse.Namespace, nll: float, entropy: float, steps: int) -> str:
    lines = [
        "# GRPO log-likelihood estimators against the exact rollout likelihood",
        "",
        f"Written by `evaluation/rl_estimators.py`: a random 2-gram language of {VOCAB} tokens at L = {LENGTH}, a "
        f"tiny MDM trained on it ({steps} steps; validation NLL {nll:.3f} nats/token against the "
        f"language's entropy {entropy:.3f}); {args.rollouts} rollouts of the paper's sampler at each N; bias: the "
        "estimator's expectation (its masks enumerated) minus the rollout's exact log-likelihood under that sampler, "
        f"in nats per sequence (mean and spread over the rollouts); sd: of one estimate, over {args.draws} draws.",
        "",
        "| sampler N | estimator | forwards | bias (nats) | bias spread over rollouts | sd of one estimate |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['steps']} | {r['estimator']} | {r['forwards']} | {r['bias']:+.3f} | {r['bias_sd']:.3f} | {r['sd']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rollouts", type=int, default=24)
    p.add_argument("--draws", type=int, default=64)
    p.add_argument("--output", default=None)
    p.add_argument("--models", default="results", help="where the trained model is kept (results/models/...)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 20 training steps, 4 rollouts, 8 draws")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    training = dict(TRAINING, max_steps=20, num_train=512, num_validation=64) if args.quick else TRAINING
    if args.quick:
        args.rollouts, args.draws = 4, 8
    language = NGramLanguage.random(vocab_size=VOCAB, n=2, seed=0, prune_threshold=0.0)
    trained = trained_model("mdm", language, LENGTH, {"training": training}, Path(args.models), "rl-estimators")
    model = trained["mdm"].eval()
    rows = [row for steps in (2, LENGTH) for row in rows_for(model, steps, args)]
    entropy = language.expected_nll(LENGTH).value / LENGTH
    return print_and_write(markdown(rows, args, trained["mdm_nll"], entropy, training["max_steps"]), args.output)


if __name__ == "__main__":
    main()
