"""Log-likelihood of a continuation under a masked diffusion LM: the Monte Carlo ELBO, and the greedy check.

An MDM has no exact log-likelihood; its ELBO is a lower bound (the training objective). For a continuation of T
tokens after a context, LLaDA's estimator (``get_log_likelihood``) draws ``mc_num`` masked copies: copy j masks
m_j of the T tokens, with m_j stratified over 1..T (m_j = k + j T / mc_num wrapped into 1..T, k uniform), and
adds each masked token's log-probability weighted by T / m_j; the estimate is minus the mean. `ELBOEstimator`
computes it for many requests at once (rows of all requests batched together), with random numbers seeded by each
request's tokens, so a request's estimate does not depend on its batch or on the process that scores it.

`left_to_right_log_probs` is exact: the log-likelihood of whole sequences under one stated decoding law of the
model, one token a step from left to right at temperature 1 (for an autoregressive model, its own law), so it can be
set beside an autoregressive model's exact NLL, where the ELBO, a bound, cannot.

`greedy_matches` is LLaDA's ``suffix_greedy_prediction``: the continuation, fully masked and revealed one token per
step (most confident first, temperature 0), must come out exactly (lm-eval's ``is_greedy``).

The model is reached only through `hf_mdm.generation_denoiser.Denoiser` (guidance, logits shift,
``logits_to_keep``) and `hf_mdm.generation.diffusion_generate`; lm-eval's ``loglikelihood`` calls this module
(`hf_mdm.harness`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .generation import MaskedDiffusionGenerationConfig, diffusion_generate
from .generation_denoiser import Denoiser, Rows
from .tokens import left_pad

Pair = tuple[list[int], list[int]]  # (context ids, continuation ids)


def stable_seed(seed: int, context: Sequence[int], continuation: Sequence[int]) -> int:
    """A 63-bit seed from ``seed`` and a request's tokens (the same on every machine and process)."""
    digest = hashlib.sha256(json.dumps([seed, list(context), list(continuation)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class MaskedCopy:
    """One Monte Carlo sample: request ``request``'s ids with the continuation positions ``masked`` masked; its
    terms are weighted by 1 / ``ratio`` (ratio = masked count / continuation length)."""

    request: int
    ids: torch.Tensor
    masked: torch.Tensor
    prompt_length: int
    ratio: float


@dataclass
class ELBOEstimator:
    """The Monte Carlo ELBO of continuations given their contexts (see the module docstring).

    ``pad_token_id`` fills right padding (never attended to); ``device`` is where the batches run.
    """

    denoiser: Denoiser
    mc_num: int = 128
    seed: int = 1234
    pad_token_id: int = 0
    device: Any = "cpu"

    @property
    def forwards_per_request(self) -> int:
        """Forward passes that one request's estimate costs (guidance counts two)."""
        return self.mc_num * (2 if self.denoiser.guided else 1)

    def loglikelihoods(self, pairs: Sequence[Pair], batch_size: int) -> list[float]:
        """ELBO estimate of each (context, continuation) pair; ``batch_size`` masked copies per forward pass."""
        copies = [copy for index, pair in enumerate(pairs) for copy in self.masked_copies(index, *pair)]
        copies.sort(key=lambda copy: -copy.ids.numel())
        loss = [0.0] * len(pairs)
        for start in range(0, len(copies), batch_size):
            batch = copies[start : start + batch_size]
            for copy, value in zip(batch, self.masked_nll(batch)):
                loss[copy.request] += value / copy.ratio
        return [-total / self.mc_num for total in loss]

    def masked_copies(self, index: int, context: list[int], continuation: list[int]) -> list[MaskedCopy]:
        """The ``mc_num`` masked copies of request ``index``, with stratified mask counts."""
        length = len(continuation)
        generator = torch.Generator().manual_seed(stable_seed(self.seed, context, continuation))
        k = int(torch.randint(1, length + 1, (), generator=generator))
        counts = torch.round(torch.linspace(float(k), k + (self.mc_num - 1) * length / self.mc_num, self.mc_num)).long()
        counts = (counts - 1) % length + 1
        ids = torch.tensor(context + continuation, dtype=torch.long)
        copies = []
        for count in counts.tolist():
            positions = torch.randperm(length, generator=generator)[:count] + len(context)
            copies.append(MaskedCopy(index, ids, positions.sort().values, len(context), count / length))
        return copies

    @torch.no_grad()
    def masked_nll(self, batch: Sequence[MaskedCopy]) -> list[float]:
        """Sum of -log p(x_i | noisy x) over the masked positions of each copy (right-padded batch)."""
        rows = self._noisy_rows(batch)
        columns = torch.cat([copy.masked for copy in batch]).unique().to(self.device)
        logits = self.denoiser.logits(rows, columns)
        lookup = torch.full((rows.x.shape[1],), -1, dtype=torch.long, device=self.device)
        lookup[columns] = torch.arange(columns.numel(), device=self.device)
        losses = []
        for r, copy in enumerate(batch):
            masked = copy.masked.to(self.device)
            row_logits = logits[r, lookup[masked]].float()
            targets = copy.ids.to(self.device)[masked]
            losses.append(float(F.cross_entropy(row_logits, targets, reduction="sum")))
        return losses

    def _noisy_rows(self, batch: Sequence[MaskedCopy]) -> Rows:
        width = max(copy.ids.numel() for copy in batch)
        noisy = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        prompt = torch.zeros((len(batch), width), dtype=torch.bool)
        for r, copy in enumerate(batch):
            n = copy.ids.numel()
            noisy[r, :n] = copy.ids
            noisy[r, copy.masked] = self.denoiser.mask_id
            attention[r, :n] = 1
            prompt[r, : copy.prompt_length] = True
        return Rows(noisy.to(self.device), attention.to(self.device), prompt.to(self.device))


def greedy_matches(
    model: Any,
    pairs: Sequence[Pair],
    config: MaskedDiffusionGenerationConfig,
    batch_size: int,
    pad_token_id: int,
    device: Any,
) -> list[bool]:
    """LLaDA's ``suffix_greedy_prediction`` for each (context, continuation): True where the continuation, fully
    masked and revealed one token per step, most confident first, at temperature 0, comes out exactly. ``config``
    supplies the token ids, logits shift and guidance; left padding with ``pad_token_id``."""
    matches = []
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        rows = [context + [config.mask_token_id] * len(continuation) for context, continuation in batch]
        ids, attention = (tensor.to(device) for tensor in left_pad(rows, pad_token_id))
        width = ids.shape[1]
        greedy = MaskedDiffusionGenerationConfig(
            mask_token_id=config.mask_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            logits_shift=config.logits_shift,
            cfg_scale=config.cfg_scale,
            max_new_tokens=0,
            steps=max(len(c) for _, c in batch),
            strategy="confidence",
            transfer="deterministic",
            temperature=0.0,
            stop_at_eos=False,
            schedule="linear",
            block_length=width,
            return_dict_in_generate=False,
            kv_cache_refresh=1,  # exact even under a saved kv_cache (a full forward every step)
        )  # (every field it reads is set: the model's generation config fills only unset ones)
        output = diffusion_generate(model, ids, attention_mask=attention, generation_config=greedy)
        for row, (_, continuation) in zip(output.tolist(), batch):
            matches.append(row[width - len(continuation) :] == continuation)
    return matches


def left_to_right_log_probs(model: Any, sequences: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """(n,) float64: the exact log p(x) of each row of ``sequences`` (n, L) under decoding one token a step from
    left to right at temperature 1 from the empty prompt: sum_i log p_theta(x_i | x_<i, [MASK] at i..L-1), p_theta
    the softmax of the logits with [MASK] removed (what `diffusion_generate` draws from
    with ``transfer="deterministic"``, ``strategy="left_to_right"``, ``steps=L``), read at the position the family's
    logits shift names (hidden state i - shift, at least 0). One canvas per position, ``batch_size`` canvases a
    forward; block-causal models attend as their config says."""
    from .generation_denoiser import logits_shift_of

    n, length = sequences.shape
    mask_id, shift = int(model.config.mask_token_id), logits_shift_of(model)
    device = next(iter(model.parameters()), torch.empty(0)).device  # an oracle has no parameters: the CPU
    positions = torch.arange(length)
    canvases = sequences[:, None, :].expand(n, length, length).clone()  # canvas i of row r: x_<i, then [MASK]
    canvases[:, positions[:, None] <= positions[None, :]] = mask_id
    canvases, read = canvases.reshape(n * length, length), (positions - shift).clamp(min=0).repeat(n)
    parts = []
    with torch.no_grad():
        for start in range(0, canvases.shape[0], batch_size):
            x = canvases[start : start + batch_size].to(device)
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits.double()
            rows = torch.arange(x.shape[0], device=device)
            picked = logits[rows, read[start : start + batch_size].to(device)]
            picked[:, mask_id] = -math.inf
            parts.append(torch.log_softmax(picked, dim=-1).cpu())
    log_p = torch.cat(parts).gather(1, sequences.reshape(-1, 1)).squeeze(1)
    return log_p.reshape(n, length).sum(1)
