"""The published samplers as presets of `MaskedDiffusionGenerationConfig`: LLaDA's and Dream's ``generate()``,
LLaDA2.0's and LLaDA2.1's, each with its own argument names and defaults, reproduced token for token at temperature
0 on the default sampler (a mixin of the config class; the semantics of each preset are in its docstring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .generation_reference import reject_foreign_args
from .generation_values import is_integer

if TYPE_CHECKING:  # the class these presets build
    from .generation_config import MaskedDiffusionGenerationConfig


class ReferencePresets:
    """The classmethods ``llada``, ``dream``, ``llada2`` and ``llada21`` of `MaskedDiffusionGenerationConfig`."""

    @classmethod
    def llada(
        cls,
        gen_length: int,
        steps: int,
        block_length: int,
        temperature: float = 0.0,
        cfg_scale: float = 0.0,
        remasking: str = "low_confidence",
        logits_eos_inf: bool = False,
        confidence_eos_eot_inf: bool = False,
        *,
        mask_id: Optional[int] = None,
        eos_token_id: Optional[int] = None,
        eot_token_id: Optional[int] = None,
        **kwargs: Any,
    ) -> "MaskedDiffusionGenerationConfig":
        r"""LLaDA's ``generate()`` (ML-GSAI/LLaDA generate.py), token for token at fp32, with its argument names.

        ``model.generate(prompt, attention_mask=..., generation_config=MaskedDiffusionGenerationConfig.llada(...))``
        (or `diffusion_generate`) then returns what ``generate(model, prompt, attention_mask, steps, gen_length,
        block_length, temperature, cfg_scale, remasking, mask_id, logits_eos_inf, confidence_eos_eot_inf)`` returns,
        given the same ``torch.manual_seed`` (or pass ``generator=``), for LLaDA or any model with the same output:

        - canvas: the prompt (left padding; pads != [MASK]) then ``gen_length`` masks; the attention mask (extended
          with ones) is passed on every forward when the prompt is padded;
        - ``gen_length % block_length == 0`` and ``steps % (gen_length // block_length) == 0`` are required
          (ValueError, where LLaDA asserts); each block gets ``steps // num_blocks`` steps. A block's schedule comes
          from each row's mask count M in the block at its start: ``M // spb`` per step plus one on the first
          ``M % spb`` steps;
        - each step: logits of the whole canvas in the model dtype (classifier-free guidance: one call on
          ``[x, x with every prompt position, pads included, masked]``, ``u + (cfg_scale + 1)(c - u)``);
          ``logits_eos_inf`` sets the EOS logit to -inf; the proposal x0 is the argmax (first index on ties) at
          ``temperature`` 0, else the Gumbel-max ``argmax(exp(l) / (-log U) ** temperature)`` in float64 with
          ``U`` a (B, L, V) float64 uniform draw. [MASK] can be proposed (it then stays masked);
        - ``confidence_eos_eot_inf`` reproduces LLaDA's aliasing: after x0 is chosen, at temperature 0 both the EOS
          and the EoT logits become -inf, at temperature > 0 only the EoT logit (LLaDA's EOS write lands in the
          float64 copy); a position whose x0 is EOS/EoT thus gets confidence 0 (unmasked last, still possible);
        - confidence: ``remasking="low_confidence"``: the softmax of those logits, in the model dtype, at x0;
          ``"random"``: ``torch.rand((B, L))`` (float32), drawn after the Gumbel noise. Positions at or after the
          block end and positions not masked get -inf; masked positions before the block (prompt masks, or masks
          that got [MASK] proposed) stay candidates, as in LLaDA;
        - each row reveals the scheduled count by ``torch.topk`` on its full-length confidence vector (LLaDA calls
          it per row, here one call covers the rows: the same indices on CPU, ties included; a block is fully
          masked in every row at its start, so all rows share the schedule). Revealed tokens stay.

        Differences from LLaDA, none of which changes a token: (1) LLaDA's classifier-free guidance without an
        attention mask raises NameError (it reads ``attention_mask_``, only set when a mask is given): here it runs
        without a mask; (2) a step where no row reveals anything (only when ``steps > gen_length``) skips the forward
        but still draws the Gumbel / random-remasking numbers LLaDA draws, so later steps see the same random stream;
        ``nfe`` counts the forwards run (two per step with guidance; LLaDA's NFE is ``steps``), while ``steps`` and
        ``history`` (one canvas per step) count all of LLaDA's steps; (3) EOS comes from ``eos_token_id``
        (default: the model config's, 126081 for LLaDA-8B; the first id of a list) and EoT from ``eot_token_id``
        (default: the model config's ``eot_token_id``, else 126348 as for LLaDA-8B-Instruct) instead of LLaDA's
        constants; (4) ``mask_id`` defaults to the model config's ``mask_token_id``. As in LLaDA the output is the
        full canvas: ``stop_at_eos`` is False (set it to True to pad after the first EOS; the sampling itself is
        unchanged).

        Other keyword arguments are `MaskedDiffusionGenerationConfig` fields (``return_dict_in_generate``,
        ``output_history``, ``pad_token_id``, ...).
        """
        reject_foreign_args("llada", kwargs)
        values = dict(
            reference="llada",
            max_new_tokens=gen_length,
            steps=steps,
            block_length=block_length,
            temperature=temperature,
            cfg_scale=cfg_scale,
            remasking=remasking,
            logits_eos_inf=logits_eos_inf,
            confidence_eos_eot_inf=confidence_eos_eot_inf,
            mask_token_id=mask_id,
            eos_token_id=eos_token_id,
            eot_token_id=eot_token_id,
            stop_at_eos=False,
        )
        return cls(**{**values, **kwargs})

    @classmethod
    def dream(
        cls,
        max_new_tokens: int,
        steps: int,
        eps: float = 1e-3,
        alg: str = "origin",
        alg_temp: Optional[float] = None,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        **kwargs: Any,
    ) -> "MaskedDiffusionGenerationConfig":
        r"""Dream's ``diffusion_generate()`` (the Hub's generation_utils.py of Dream-v0), token for token at fp32,
        with its argument names.

        ``model.generate(input_ids, attention_mask=..., generation_config=MaskedDiffusionGenerationConfig.dream(...))``
        (or `diffusion_generate`) returns what ``model.diffusion_generate(input_ids, attention_mask=...,
        max_new_tokens=..., steps=..., eps=..., alg=..., alg_temp=..., temperature=..., top_p=..., top_k=...)``
        returns, given the same ``torch.manual_seed`` (or pass ``generator=``):

        - canvas: the prompt then ``max_new_tokens`` masks; every [MASK] is generated (prompt masks too);
        - padding (an attention mask with a 0): positions ``cumsum(mask) - 1`` with pads at 1, and the boolean
          (B, 1, L, L) mask ``m_i & m_j`` (pads neither attend nor are attended to); otherwise no mask and
          positions 0..L-1;
        - times ``torch.linspace(1, eps, steps + 1)`` in float32 on the canvas' device; step i goes from
          ``t = ts[i]`` to ``s = ts[i + 1]``; logits of the whole canvas, shifted by the model's ``logits_shift``
          (1 for Dream: the token at j is read from the logits at j - 1);
        - proposals (Dream's ``sample_tokens``, on the masked positions in row-major order): logits / temperature
          if temperature > 0; top_p (sorted cumulative softmax > top_p removed, the first token over the threshold
          kept, removed logits set to ``finfo.min``); top_k (logits below the k-th largest set to ``finfo.min``);
          softmax in the model dtype; temperature 0: ``probs.max(-1)`` (confidence and token); temperature > 0: a
          draw from ``Categorical(probs)`` (``torch.multinomial`` of the renormalised probabilities, with Dream's
          fallback to ``probs.max`` when torch.distributions rejects them) and its probability. top_p / top_k apply
          at temperature 0 too. [MASK] can be proposed (it then stays masked);
        - ``alg="origin"``: ``torch.rand(n_masked_total) < 1 - s / t`` (1 at the last step) selects the positions
          revealed (drawn at temperature 0 too), then the selected positions are sampled;
          ``"maskgit_plus"`` (confidence), ``"topk_margin"`` (top-1 minus top-2 probability), ``"entropy"``
          (``sum p log(p + 1e-10)``): every row reveals ``n = int(nm * (1 - s / t))`` positions, ``int(nm)`` at the
          last step, with ``nm`` the float32 *batch-average* mask count, chosen by ``torch.topk`` on the (B, L)
          confidences (-inf where not masked) or, with ``alg_temp`` > 0, by
          ``torch.multinomial(softmax(confidence / alg_temp), n)`` without replacement.

        Differences from Dream, none of which changes a token: a step with ``n == 0`` at temperature 0 (non-origin
        algs; e.g. step 0 when ``steps == max_new_tokens``) skips the forward, which draws no random number there:
        ``nfe`` counts the forwards run (Dream's NFE is ``steps``), ``steps`` and ``history`` (one canvas per step, as
        Dream's ``output_history``) count all of Dream's steps. Dream's sampler has no classifier-free guidance (the CFG
        of Dream's lm-eval wrapper reads an undefined attribute); here ``cfg_scale`` > 0 guides as LLaDA does
        (prompt and pads masked in the unconditional input, ``u + (cfg_scale + 1)(c - u)``), and ``cfg_scale`` 0 is
        exactly Dream. As in Dream the output is the full canvas: ``stop_at_eos`` is False. ``max_new_tokens`` is
        required (Dream's default ``max_length=20`` is not reproduced).

        Other keyword arguments are `MaskedDiffusionGenerationConfig` fields (``return_dict_in_generate``,
        ``output_history``, ``mask_token_id``, ``cfg_scale``, ...).
        """
        reject_foreign_args("dream", kwargs)
        values = dict(
            reference="dream",
            max_new_tokens=max_new_tokens,
            steps=steps,
            eps=eps,
            alg=alg,
            alg_temp=alg_temp,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_at_eos=False,
        )
        return cls(**{**values, **kwargs})

    @classmethod
    def llada2(
        cls,
        gen_length: int = 2048,
        block_length: int = 32,
        steps: int = 32,
        threshold: float = 0.95,
        minimal_topk: int = 1,
        eos_early_stop: bool = False,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        *,
        eos_id: Optional[int] = None,
        mask_id: Optional[int] = None,
        **kwargs: Any,
    ) -> "MaskedDiffusionGenerationConfig":
        r"""LLaDA2.0's ``generate()`` (the published modeling_llada2_moe.py), token for token at temperature 0 and
        with the same number of forwards, with its argument names and defaults, on the default sampler (so also
        batched, streamed, and with the exact block cache, ``kv_cache="prefix"``, the default for a block-causal
        model; ``kv_cache="none"`` recomputes the whole prefix every forward, as the published code does):

        - the canvas is whole attention blocks of ``block_length`` positions counted from the prompt's first token
          (``whole_blocks``): the prompt may end inside a block, which is then the first one generated, and the
          last block runs past ``gen_length`` (generated, then cut off);
        - each block gets at most ``min(steps, gen_length // minimal_topk)`` forwards; step i reveals every masked
          position of the block whose proposal's probability is above ``threshold`` when there are at least
          ``share[i]`` of them, with ``share`` the even split of ``block_length`` over the steps (``block_length //
          steps`` each, one more on the first ``block_length % steps``), else the ``share[i]`` most confident
          (``transfer="llada2"``, `hf_mdm.generation_transfer.LLaDA2Transfer`);
        - proposals: the argmax at ``temperature`` 0, else a draw after ``top_k`` then ``top_p``; confidence = its
          softmax probability over the whole vocabulary;
        - a row stops after the block in which an EOS appears (``eos_id``, default the model config's
          ``eos_token_id``: 156892 for LLaDA2), or with ``eos_early_stop`` at the step that reveals an EOS with
          nothing generated before it still masked; tokens after the first EOS become padding.

        The output is the prompt and ``gen_length`` generated columns (the published code returns the generated
        tokens up to and including the first EOS). Differences, none of which changes a token at temperature 0 on
        rows without EOS in the prompt: [MASK] is never proposed (the published argmax may pick it, which leaves the
        position masked); the published ``eos_early_stop`` looks for the first EOS from the start of the canvas,
        prompt included (a prompt holding EOS returns nothing), here from the first generated position; sampling at
        temperature > 0 uses the same law but not the same random stream. ``mask_id`` defaults to the model
        config's ``mask_token_id`` (156895 for LLaDA2).

        Other keyword arguments are `MaskedDiffusionGenerationConfig` fields (``kv_cache``, ``return_dict_in_generate``,
        ``pad_token_id``, ...).
        """
        steps = min(steps, gen_length // minimal_topk) if minimal_topk >= 1 else steps
        if not is_integer(steps) or steps < 1:
            raise ValueError(
                f"steps = min(steps, gen_length // minimal_topk) must be >= 1, got {steps!r} (gen_length={gen_length}, "
                f"minimal_topk={minimal_topk}): raise gen_length or lower minimal_topk"
            )
        shared = _llada2_fields(gen_length, block_length, threshold, temperature, top_p, top_k, eos_id, mask_id)
        values = dict(shared, steps=steps, transfer="llada2", eos_early_stop=eos_early_stop)
        return cls(**{**values, **kwargs})

    @classmethod
    def llada21(
        cls,
        gen_length: int = 2048,
        block_length: int = 32,
        steps: int = 32,
        threshold: float = 0.95,
        editing_threshold: float = 0.9,
        max_post_steps: int = 16,
        num_to_transfer: int = 1,
        minimal_topk: int = 1,
        eos_early_stop: bool = False,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        *,
        eos_id: Optional[int] = None,
        mask_id: Optional[int] = None,
        **kwargs: Any,
    ) -> "MaskedDiffusionGenerationConfig":
        r"""LLaDA2.1's ``generate()`` (the published modeling_llada21_moe.py), token for token at temperature 0 and
        with the same number of forwards, with its argument names and defaults, on the default sampler (batched,
        streamed, exact block cache as in `llada2`):

        - the canvas of whole attention blocks of `llada2`;
        - a block runs until it is done, with no step budget (``steps`` and ``minimal_topk`` are accepted and, as
          in the published code, not used): each forward reveals the masked positions above ``threshold`` (at
          least ``num_to_transfer``, the most confident), and edits every revealed, non-prompt position of the
          block whose proposal differs and is above ``editing_threshold``; the block ends after a forward that
          started with no mask and edited nothing, or ``max_post_steps`` forwards after its last mask
          (``transfer="llada21_editing"``, `hf_mdm.generation_editing`);
        - every block is generated unless ``eos_early_stop``, which stops a row after the first block that ends
          with an EOS in its output; tokens after the first EOS become padding in either case.

        Differences as for `llada2` ([MASK] never proposed; the random stream at temperature > 0).
        """
        shared = _llada2_fields(gen_length, block_length, threshold, temperature, top_p, top_k, eos_id, mask_id)
        values = dict(
            shared,
            transfer="llada21_editing",
            editing_threshold=editing_threshold,
            max_post_steps=max_post_steps,
            num_to_transfer=num_to_transfer,
            finish_at_eos=bool(eos_early_stop),
        )
        return cls(**{**values, **kwargs})


def _llada2_fields(
    gen_length: int,
    block_length: int,
    threshold: float,
    temperature: float,
    top_p: Optional[float],
    top_k: Optional[int],
    eos_id: Optional[int],
    mask_id: Optional[int],
) -> dict[str, Any]:
    """The settings LLaDA2.0's and LLaDA2.1's ``generate()`` share: a canvas of whole attention blocks, confidence
    order, the reveal threshold, the proposals' sampling and the stop at EOS."""
    return dict(
        max_new_tokens=gen_length,
        block_length=block_length,
        strategy="confidence",
        threshold=threshold,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_id,
        mask_token_id=mask_id,
        whole_blocks=True,
        stop_at_eos=True,
    )
