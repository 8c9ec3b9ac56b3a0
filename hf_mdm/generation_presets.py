"""The published samplers as presets of `MaskedDiffusionGenerationConfig`: LLaDA's and Dream's ``generate()``,
LLaDA2.0's and LLaDA2.1's, diffusers' ``LLaDA2Pipeline`` and transformers' DiffusionGemma ``generate()``, each with
its own argument names and defaults, reproduced token for token (at temperature 0; DiffusionGemma, which always
samples, under the same seed) by hf_mdm's samplers (a mixin of the config class; the semantics of each preset are in
its docstring).
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar

from .generation_reference import reject_foreign_args
from .generation_values import is_integer

# the class a preset builds: the config class that mixes the presets in (`MaskedDiffusionGenerationConfig`)
Config = TypeVar("Config", bound="ReferencePresets")


class ReferencePresets:
    """The classmethods ``llada``, ``dream``, ``llada2``, ``llada2_pipeline``, ``llada21`` and ``diffusion_gemma``
    of `MaskedDiffusionGenerationConfig`."""

    @classmethod
    def llada(
        cls: type[Config],
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
    ) -> Config:
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
        cls: type[Config],
        max_new_tokens: int,
        steps: int,
        eps: float = 1e-3,
        alg: str = "origin",
        alg_temp: Optional[float] = None,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        **kwargs: Any,
    ) -> Config:
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
        cls: type[Config],
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
    ) -> Config:
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
    def llada2_pipeline(
        cls: type[Config],
        gen_length: int = 2048,
        block_length: int = 32,
        num_inference_steps: int = 32,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        threshold: float = 0.7,
        editing_threshold: Optional[float] = 0.5,
        max_post_steps: int = 16,
        minimal_topk: int = 1,
        eos_early_stop: bool = True,
        *,
        eos_token_id: Optional[int] = None,
        mask_token_id: Optional[int] = None,
        **kwargs: Any,
    ) -> Config:
        r"""diffusers' ``LLaDA2Pipeline`` with its ``BlockRefinementScheduler`` (diffusers 0.42), token for token at
        temperature 0, with its argument names and defaults, on the default sampler (batched, streamed, exact block
        cache):

        - the canvas of whole attention blocks of `llada2`, except that the last block's positions past
          ``gen_length`` are generated but never attended to (``hide_block_tail``; LLaDA2's own generate() attends
          to them, so the two differ when the prompt and ``gen_length`` do not end on a block boundary);
        - each block gets ``min(num_inference_steps, gen_length // minimal_topk)`` forwards while masks are left;
          the i-th reveals every masked position above ``threshold`` when there are at least ``share[i]`` of them,
          else the ``share[i]`` most confident (LLaDA2.0's rule, `llada2`);
        - with ``editing_threshold`` > 0, every forward also edits the block's revealed, non-prompt positions whose
          proposal differs and is above ``editing_threshold``, and a block whose masks are gone before its step
          budget runs up to ``max_post_steps + 1`` more forwards, stopping after one that edits nothing
          (``transfer="block_refinement"``, `hf_mdm.generation_editing.BlockRefinementTransfer`); ``None`` or 0:
          no editing (``transfer="llada2"``);
        - ``eos_early_stop``: a row stops at the step that writes an EOS with nothing generated before it still
          masked, and skips the later blocks; without it every block is generated. Tokens after the first EOS
          become padding (the pipeline leaves them, and its decoded text cuts them off).

        The model must attend in blocks of ``block_length`` (its ``config.block_size``), as the pipeline passes only
        a 2-D attention mask. Differences, none of which changes a token at temperature 0 on unpadded prompts: with
        editing off the pipeline runs one more forward per block, whose output it discards (it checks for masks
        before the forward that revealed the last ones), which hf_mdm does not run; a batch runs each row as the
        pipeline runs that prompt alone (the pipeline keeps every row of a batch editing while any row still
        edits, and counts the steps of a block for the batch); [MASK] is never proposed; sampling at temperature
        > 0 uses the same law but not the same random stream. Padded prompts: the pipeline counts positions and
        blocks from the batch's first column, hf_mdm from each row's first token. One difference changes tokens:
        the pipeline's ``eos_early_stop`` looks for the first EOS over the whole sequence, prompt included, so it
        never stops a row whose prompt holds the EOS id (a multi-turn chat) and runs every block and step as
        without it; the preset stops such a row as any other. ``eos_early_stop=False`` gives the pipeline's tokens
        and forwards on such prompts.
        """
        steps = min(num_inference_steps, gen_length // minimal_topk) if minimal_topk >= 1 else num_inference_steps
        if not is_integer(steps) or steps < 1:
            raise ValueError(
                f"steps = min(num_inference_steps, gen_length // minimal_topk) must be >= 1, got {steps!r}: raise "
                f"gen_length or lower minimal_topk"
            )
        shared = _llada2_fields(
            gen_length, block_length, threshold, temperature, top_p, top_k, eos_token_id, mask_token_id
        )
        values = dict(shared, steps=steps, hide_block_tail=True, finish_at_eos=bool(eos_early_stop))
        if editing_threshold is not None and editing_threshold > 0:
            editing = dict(editing_threshold=editing_threshold, max_post_steps=max_post_steps)
            values.update(editing, transfer="block_refinement", eos_early_stop=bool(eos_early_stop))
        else:
            values.update(transfer="llada2", eos_early_stop=bool(eos_early_stop))
        return cls(**{**values, **kwargs})

    @classmethod
    def llada21(
        cls: type[Config],
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
    ) -> Config:
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

    @classmethod
    def diffusion_gemma(
        cls: type[Config],
        max_new_tokens: int = 256,
        max_denoising_steps: int = 48,
        entropy_bound: float = 0.1,
        t_min: float = 0.4,
        t_max: float = 0.8,
        stability_threshold: Optional[int] = 1,
        confidence_threshold: Optional[float] = 0.005,
        **kwargs: Any,
    ) -> Config:
        r"""transformers' DiffusionGemma ``generate()`` (`DiffusionGemmaForBlockDiffusion`, transformers 5.24), token
        for token and with the same decoder forwards, with its argument names and defaults
        (``_get_default_generation_params``; ``entropy_bound`` is its ``EntropyBoundSamplerConfig``'s):

        ``model.generate(input_ids, attention_mask=..., max_new_tokens=..., max_denoising_steps=...,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=...), t_min=..., t_max=..., stability_threshold=...,
        confidence_threshold=..., eos_token_id=..., pad_token_id=...)`` after ``torch.manual_seed(s)`` returns on the
        CPU what ``diffusion_generate(model, input_ids, attention_mask=..., generation_config=
        MaskedDiffusionGenerationConfig.diffusion_gemma(...), seed=s)`` returns (`hf_mdm.generation_uniform`):

        - ``ceil(max_new_tokens / canvas_length)`` canvases, one after the other; the encoder writes the prompt, then
          each appended canvas, into a KV cache; the attention mask (left padding) is passed on as given, positions
          count from the first column;
        - a canvas starts as uniformly random tokens; at each of at most ``max_denoising_steps`` steps the decoder
          reads it, self-conditioned on the previous step's processed logits; the logits are divided by the
          temperature ``t_min + (t_max - t_min) n / N`` (n = N..1 the steps left), a token is drawn at every
          position from their softmax, the drafts at the k lowest-entropy positions with ``sum(entropy) -
          max(entropy) <= entropy_bound`` are kept and every other position is renoised;
        - a row's canvas is done once its argmax is unchanged for ``stability_threshold`` steps and the mean entropy
          of its logits is below ``confidence_threshold`` (its argmax then frozen); a canvas ends when every row is
          done. The canvas appended is the argmax of the last logits, not the canvas;
        - after each canvas, a row that holds an EOS there (or meets a stopping criterion) finishes: with a
          ``pad_token_id`` the tokens after its first EOS and its later canvases become padding; generation ends
          when every row has finished.

        Differences, none of which changes a token: ``confidence_threshold=None`` (or ``stability_threshold=None``),
        transformers' way to turn the adaptive stop off, is ``confidence_threshold=0`` here; the output of
        ``return_dict_in_generate`` is a `MaskedDiffusionGenerateOutput` (``nfe`` the decoder forwards of the batch,
        ``row_nfe`` DiffusionGemma's per-row count, ``tokens_per_forward`` for the batch). The EOS and pad ids come, as
        in transformers, from the call and the generation configs only, never from the model config: a model whose
        generation config names no EOS runs every canvas and pads nothing (a caller's tokenizer, as the harness's
        ``hf_mdm`` model passes, still gives them). hf_mdm's own sampling settings (``steps``, ``transfer``,
        ``temperature``, ...) do not apply (a ValueError if set).

        Other keyword arguments are `MaskedDiffusionGenerationConfig` fields (``eos_token_id``, ``pad_token_id``,
        ``return_dict_in_generate``, ``max_time``, ...).
        """
        adaptive = confidence_threshold is not None and stability_threshold is not None
        values = dict(
            max_new_tokens=max_new_tokens,
            max_denoising_steps=max_denoising_steps,
            entropy_bound=entropy_bound,
            t_min=t_min,
            t_max=t_max,
            stability_threshold=stability_threshold if adaptive else None,
            confidence_threshold=confidence_threshold if adaptive else 0,
        )
        return cls(**{**values, **kwargs})


#: The presets' names: ``MaskedDiffusionGenerationConfig.<name>(...)`` for each.
PRESET_NAMES = tuple(name for name in vars(ReferencePresets) if not name.startswith("_"))


def preset_config(config_class: Any, name: str, length: int, settings: dict) -> Any:
    """``config_class.<name>(...)`` with the ``settings`` the preset names and its length argument (``gen_length``
    / ``max_new_tokens``) set to ``length``; ``settings`` keeps the others, for the caller to apply after. A
    ValueError names the preset when the name is unknown, and the settings to set when it needs ones ``settings``
    lacks (``llada``'s ``steps`` and ``block_length``)."""
    import inspect

    if name not in PRESET_NAMES:
        raise ValueError(f"unknown preset {name!r}: one of {list(PRESET_NAMES)}")
    method = getattr(config_class, name)
    named = inspect.signature(method).parameters
    arguments = {k: settings.pop(k) for k in list(settings) if k in named}
    arguments.update({k: length for k in ("gen_length", "max_new_tokens") if k in named})
    unset = [k for k, p in named.items() if p.default is p.empty and k not in arguments]
    missing = [k for k in unset if named[k].kind not in (named[k].VAR_POSITIONAL, named[k].VAR_KEYWORD)]
    if missing:
        raise ValueError(f"preset {name!r} needs {' and '.join(missing)}: set {'it' if len(missing) == 1 else 'them'} "
                         "beside the preset")  # fmt: skip
    try:
        return method(**arguments)
    except TypeError as err:
        raise ValueError(f"preset {name!r}: {err}") from None


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
