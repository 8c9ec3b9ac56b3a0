"""The reverse process: sampling from a masked diffusion language model.

One implementation serves ``model.generate`` (through `MaskedDiffusionGenerationMixin`) and the free function
`diffusion_generate(model, input_ids, ...)`, which works with any model whose output has ``.logits`` (hf_mdm's own
models, LLaDA and Dream loaded natively or with ``trust_remote_code``, the exact-posterior ``OracleDenoiser``).

`diffusion_generate` reads as its steps: resolve the config, build the canvas, run the loop, finalize. The pieces
live in flat sibling modules, one concept each (``save_pretrained`` exports them with the model as remote code,
so they import only torch, transformers and each other):

- `hf_mdm.generation_config`: `MaskedDiffusionGenerationConfig` (fields, validation), the output dataclass;
- `hf_mdm.generation_transfer`: how many positions a step reveals (time grid, steps per block, counts);
- `hf_mdm.generation_strategy`: which positions (proposals, scores, choice);
- `hf_mdm.generation_denoiser`: the one model call (``logits_to_keep``, guidance, logits shift, NFE);
- `hf_mdm.generation_sampler`: the canvas, blocks and the denoising steps of a block;
- `hf_mdm.generation_reveal`: the logits, proposals and tokens at the positions a step reveals;
- `hf_mdm.generation_speculative`: exact speculative decoding of the left-to-right factorisation;
- `hf_mdm.generation_remask`: the remasking samplers (ReMDM), steps of a block that may take tokens back;
- `hf_mdm.generation_rows`: rows generated alone (``batch_invariant``, one seed per row);
- `hf_mdm.generation_stopping`: EOS, stopping criteria, padding after EOS, streaming;
- `hf_mdm.generation_reference`: LLaDA's and Dream's reference samplers, token for token;
- `hf_mdm.generation_uniform`: uniform-corruption models (transformers' DiffusionGemma), token for token;
- `hf_mdm.timer`: the device-synchronised timer behind ``elapsed_s``.

Every public name of those modules that users import from here is re-exported.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Union

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList

from .families import attention_block_size
from .generation_canvas import Canvas, fill_last_blocks, prepare_canvas
from .generation_config import MaskedDiffusionGenerateOutput, MaskedDiffusionGenerationConfig
from .generation_denoiser import Denoiser, compile_options, logits_shift_of
from .generation_processors import ScoreRecorder, config_ngram, config_processors, config_warpers
from .generation_reference import (
    DREAM_ALGS,
    LLADA_EOS_TOKEN_ID,
    LLADA_EOT_TOKEN_ID,
    LLADA_REMASKINGS,
    REFERENCES,
    ReferenceRun,
    reject_inert_reference_args,
    run_reference,
)
from .generation_remask import REMDM_VARIANTS, Remasking
from .generation_resolve import resolve_config
from .generation_rows import RowLayout, Seeds, check_seed, generate_rows, plan_rows, require_own_draws
from .generation_sampler import Sampler, Trace, sample_blocks
from .generation_speculative import SPECULATIVE, speculative_sample
from .generation_stopping import (
    Streamer,
    eos_tensor,
    finalize_eos,
    missing_positions,
    warn_unfinished,
    with_max_time,
)
from .generation_strategy import (
    POSITIONAL_STRATEGIES,
    STRATEGIES,
    STRATEGY_ALIASES,
    Proposer,
    build_warpers,
    canonical_strategy,
    get_strategy,
)
from .generation_transfer import (
    TRANSFERS,
    build_transfer,
    deterministic_counts,
    reveal_probability,
    reveal_steps,
    split_steps,
    time_grid,
)
from .generation_uniform import uniform_generate, uses_uniform_corruption
from .schedules import get_schedule
from .timer import Stopwatch

__all__ = [
    "MaskedDiffusionGenerationConfig",
    "MaskedDiffusionGenerateOutput",
    "MaskedDiffusionGenerationMixin",
    "diffusion_generate",
    "resolve_config",
    "check_token_ids",
    "logits_shift_of",
    "canonical_strategy",
    "time_grid",
    "deterministic_counts",
    "reveal_probability",
    "reveal_steps",
    "split_steps",
    "TRANSFERS",
    "STRATEGIES",
    "POSITIONAL_STRATEGIES",
    "STRATEGY_ALIASES",
    "REMDM_VARIANTS",
    "REFERENCES",
    "LLADA_REMASKINGS",
    "DREAM_ALGS",
    "LLADA_EOS_TOKEN_ID",
    "LLADA_EOT_TOKEN_ID",
]


@torch.no_grad()
def diffusion_generate(
    model: Any,
    input_ids: torch.LongTensor,
    attention_mask: Optional[torch.Tensor] = None,
    generation_config: Optional[GenerationConfig] = None,
    logits_processor: Optional[LogitsProcessorList] = None,
    stopping_criteria: Optional[StoppingCriteriaList] = None,
    streamer: Any = None,
    generator: Optional[torch.Generator] = None,
    seed: Seeds = None,
    **kwargs: Any,
) -> Union[torch.LongTensor, MaskedDiffusionGenerateOutput]:
    r"""Sample from a masked diffusion LM by reverse diffusion (see the module docstring for the algorithm).

    Args:
        model: any module returning an output with ``.logits`` (B, L, V); ``logits_to_keep`` is used when its
            ``forward`` names it. ``model.config`` supplies ``mask_token_id``, ``eos_token_id``, ``pad_token_id``,
            ``logits_shift`` and ``max_position_embeddings`` unless given here.
        input_ids: (B, P) prompt ids, possibly containing [MASK] tokens to infill.
        attention_mask: (B, P), 0 at padding (left or right); padding is never attended to nor generated.
        generation_config: a `MaskedDiffusionGenerationConfig` (a plain `GenerationConfig` is converted, custom
            keys kept); default ``model.generation_config``. ``**kwargs`` override its fields.
        logits_processor, stopping_criteria: as in transformers; processors see ``input_ids`` = the canvas row
            repeated for every scored position and ``scores`` (B*K, V); stopping criteria are checked between blocks
            on the revealed prefix.
        streamer: a transformers streamer (batch size 1), or a list with one per row (None where a row is not
            streamed): receives the prompt, then tokens as the leftmost
            generated prefix becomes final.
        generator / seed: randomness for sampling, stochastic transfer and the random strategy. ``seed`` may be a
            list with one seed per row: each row then draws from its own generator, as it does alone
            (`hf_mdm.generation_rows`: rows run one at a time when the call draws random numbers).

    Returns:
        (B, P + max_new_tokens) LongTensor, or `MaskedDiffusionGenerateOutput` with ``return_dict_in_generate``.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm import MDMConfig, MDMForMaskedDiffusion
    >>> from hf_mdm.generation import diffusion_generate
    >>> model = MDMForMaskedDiffusion(MDMConfig(vocab_size=17, mask_token_id=16, hidden_size=32,
    ...                                         num_attention_heads=2, intermediate_size=64))
    >>> out = diffusion_generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=8, steps=4, block_length=4,
    ...                          return_dict_in_generate=True)
    >>> out.sequences.shape, out.nfe
    (torch.Size([1, 11]), 4)
    ```
    """
    # 1. the config: each field from the highest level that sets it (call, generation config, model, defaults)
    config = resolve_config(model, generation_config, kwargs)
    reject_inert_reference_args(config, kwargs)
    if uses_uniform_corruption(model, config, seed):  # random-token noise (DiffusionGemma): hf_mdm.generation_uniform
        return _generate_uniform(
            model, input_ids, attention_mask, config, generator, seed, logits_processor, stopping_criteria, streamer
        )
    # 2. the canvas: the prompt, then max_new_tokens [MASK] tokens; padding never attended to nor generated
    mask_id, new_tokens = int(config.mask_token_id), _new_tokens(config, input_ids)
    canvas = prepare_canvas(input_ids, attention_mask, new_tokens, mask_id, _max_positions(model))
    _check_inputs(model, config, canvas, input_ids, logits_processor, stopping_criteria)
    check_seed(seed, canvas.x.shape[0], generator)
    layout, groups = _row_groups(model, config, seed, generator, input_ids, attention_mask)
    if groups is not None:
        # batch_invariant, or one seed per row: rows of one length batched without padding, each its own draws
        again = functools.partial(diffusion_generate, model, logits_processor=logits_processor)
        return generate_rows(again, layout, groups, config, new_tokens, seed, stopping_criteria, streamer)
    generator = _generator(generator, seed[0] if isinstance(seed, (list, tuple)) else seed, input_ids)
    output_width = canvas.x.shape[1]
    if config.whole_blocks:
        canvas = _whole_blocks(model, config, canvas, mask_id)
    # 3. the pieces: the model call (guidance, cache, logits shift), proposals, transfer rule, strategy, records
    denoiser = Denoiser.for_model(
        model,
        mask_id,
        config.cfg_scale,
        logits_shift_of(model, config),
        config.kv_cache,
        config.kv_cache_refresh,
        config.block_length,
        compile_options(config),
        hidden_from=output_width if config.hide_block_tail else None,
    )
    sampler = _default_sampler(config, denoiser, logits_processor, generator, canvas, input_ids.shape[1])
    remasking = Remasking.from_config(config, streamer)  # None without remdm
    stopping = with_max_time(stopping_criteria, config.max_time)
    eos_ids = eos_tensor(config, canvas.x.device)
    if config.eos_early_stop and eos_ids is not None:
        sampler.early_stop_eos = eos_ids
    stream = Streamer(streamer, canvas.x, canvas.gen_mask0, mask_id, output_width)
    trace = Trace(stream, keep_history=bool(config.output_history))
    with Stopwatch(canvas.x.device) as watch:
        # 4. the reverse process, block by block (or a reference sampler, or speculative rounds)
        finished = _run(config, sampler, remasking, canvas, trace, eos_ids, stopping, input_ids.shape[1])
        canvas = _cut(canvas, output_width)  # whole blocks: the columns past max_new_tokens go
        # 5. padding: masks left in finished rows and tokens after the first EOS (what is missing noted first)
        missing = missing_positions(canvas.x, canvas.gen_mask0, eos_ids, mask_id)
        pad_id = _pad_id(config, eos_ids, mask_id)
        num_generated = _finalize(canvas, finished, eos_ids, pad_id, mask_id)
    trace.stream.end(canvas.x)
    if config.max_time is not None:
        warn_unfinished(missing, finished, config.max_time, pad_id, mask_id)
    # 6. the output: the canvas, or the canvas with its costs and records
    if not config.return_dict_in_generate:
        return canvas.x
    return _output(canvas, sampler, trace, num_generated, missing.any(1), watch.seconds, bool(config.output_history))


def _generate_uniform(
    model, input_ids, attention_mask, config, generator, seed, logits_processor, stopping_criteria, streamer
):
    """The uniform-corruption sampler on the batch; with ``batch_invariant`` every row alone (its rows share the
    canvas draws), its padding dropped."""
    check_seed(seed, input_ids.shape[0], generator)
    layout, groups = _row_groups(model, config, seed, generator, input_ids, attention_mask)
    if config.batch_invariant and groups:  # (no groups without the mode: one seed per row is refused here)
        require_own_draws(seed, generator)  # the canvas is drawn
        again = functools.partial(diffusion_generate, model, logits_processor=logits_processor)
        return generate_rows(again, layout, layout.alone(), config, None, seed, stopping_criteria)
    generator = _generator(generator, seed, input_ids)
    return uniform_generate(
        model, input_ids, attention_mask, config, generator, logits_processor, stopping_criteria, streamer
    )


def _row_groups(model, config, seed: Seeds, generator, input_ids, attention_mask) -> tuple:
    """The rows' layout and the groups the call runs as (`hf_mdm.generation_rows.plan_rows`), or None: the batch as
    given (so too a batch of one row without padding)."""
    mask_id = -1 if config.mask_token_id is None else int(config.mask_token_id)  # uniform corruption: no [MASK]
    layout = RowLayout(input_ids.long(), attention_mask, mask_id)
    if input_ids.shape[0] == 1 and (attention_mask is None or bool(attention_mask.all())):
        return layout, None
    dtype = next(iter(model.parameters()), torch.empty(0)).dtype if hasattr(model, "parameters") else torch.float32
    return layout, plan_rows(config, seed, generator, layout, input_ids.device, dtype)


def _generator(generator: Optional[torch.Generator], seed: Optional[int], input_ids) -> Optional[torch.Generator]:
    """``generator``, else one seeded with ``seed`` (checked by `check_seed`), else None."""
    if generator is None and seed is not None:
        device = input_ids.device if isinstance(input_ids, torch.Tensor) else "cpu"
        generator = torch.Generator(device=device).manual_seed(int(seed))
    return generator


def _pad_id(config: MaskedDiffusionGenerationConfig, eos_ids: Optional[torch.Tensor], mask_id: int) -> int:
    """What fills finished rows: ``pad_token_id``, else the first EOS id, else [MASK]."""
    if config.pad_token_id is not None:
        return config.pad_token_id
    return int(eos_ids[0]) if eos_ids is not None else mask_id


def _run(config, sampler: Sampler, remasking, canvas: Canvas, trace: Trace, eos_ids, stopping, prompt_len: int):
    """The reverse process on ``canvas``, in place; returns the (B,) rows that finished early."""
    if config.reference is not None:
        run_reference(ReferenceRun(config, sampler.denoiser, canvas, prompt_len, sampler.generator, trace))
        return torch.zeros(canvas.x.shape[0], dtype=torch.bool, device=canvas.x.device)
    if config.transfer == SPECULATIVE:
        return speculative_sample(sampler, canvas, trace, config.draft_length, config.block_length, eos_ids, stopping)
    finishing_eos = eos_ids if config.finish_at_eos else None
    return sample_blocks(sampler, canvas, trace, config.steps, config.block_length, finishing_eos, stopping, remasking)


def _whole_blocks(model: Any, config: MaskedDiffusionGenerationConfig, canvas: Canvas, mask_id: int) -> Canvas:
    """``whole_blocks``: the canvas grown to the end of each row's last attention block (`fill_last_blocks`)."""
    block = config.block_length if config.block_length is not None else attention_block_size(model)
    if block is None or attention_block_size(model) is None:
        raise ValueError(
            "whole_blocks=True needs a block-causal model (config.block_size set, e.g. LLaDA2) and its block_length"
        )
    return fill_last_blocks(canvas, int(block), mask_id)


def _cut(canvas: Canvas, width: int) -> Canvas:
    """The first ``width`` columns of the canvas (unchanged when it has no more)."""
    if canvas.x.shape[1] == width:
        return canvas
    attn = None if canvas.attn is None else canvas.attn[:, :width]
    attn = None if attn is not None and bool(attn.all()) else attn
    return Canvas(canvas.x[:, :width], attn, canvas.gen_mask0[:, :width])


def _output(canvas: Canvas, sampler: Sampler, trace: Trace, num_generated, unfinished, seconds: float, history: bool):
    denoiser, recorder = sampler.denoiser, sampler.recorder
    return MaskedDiffusionGenerateOutput(
        sequences=canvas.x,
        steps=trace.steps,
        nfe=denoiser.nfe,
        forward_rows=denoiser.forward_rows,
        forward_tokens=denoiser.forward_tokens,
        elapsed_s=seconds,
        num_generated_tokens=num_generated,
        unfinished=unfinished,
        tokens_per_forward=float(num_generated.sum()) / max(denoiser.nfe, 1),
        accepted_per_round=trace.accepted_per_round,
        history=tuple(trace.history) if history else None,
        scores=recorder.output("scores", canvas.x.shape[1]) if recorder is not None else None,
        logits=recorder.output("logits", canvas.x.shape[1]) if recorder is not None else None,
    )


def _new_tokens(config: MaskedDiffusionGenerationConfig, input_ids: torch.Tensor) -> int:
    """Masks appended: ``max_new_tokens``, else what ``max_length`` leaves after the prompt, else 0."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    prompt_len = input_ids.shape[1] if input_ids is not None and input_ids.dim() == 2 else 0
    if config.max_length is not None and config.max_length > prompt_len:
        return config.max_length - prompt_len
    return 0


def _check_inputs(model, config, canvas: Canvas, input_ids, logits_processor, stopping_criteria) -> None:
    """ValueErrors for nothing to generate, token ids outside the model's vocabulary and inputs a reference sampler
    cannot take (`prepare_canvas` checked the canvas' length and the attention mask)."""
    if config.max_new_tokens is None and not bool(canvas.gen_mask0.any()):
        raise ValueError(
            f"nothing to generate: input_ids hold no [MASK] (id {config.mask_token_id}) and no length is set "
            f"(max_new_tokens is unset in the call, the generation config and the model's generation config"
            + (f"; max_length={config.max_length} leaves no room after the prompt" if config.max_length else "")
            + "): pass max_new_tokens=..., or set model.generation_config.max_new_tokens"
        )
    check_token_ids(model, config.mask_token_id, input_ids, config.eos_token_id)
    if config.reference is not None and (logits_processor or stopping_criteria):
        raise ValueError(
            f"reference={config.reference!r} reproduces its reference sampler, which has no logits processors nor "
            "stopping criteria: drop logits_processor / stopping_criteria, or use the default sampler"
        )


def check_token_ids(
    model: Any, mask_token_id: int, input_ids: Optional[torch.Tensor] = None, eos_token_id: Any = None
) -> None:
    """ValueErrors for a [MASK] id, EOS ids or prompt ids outside the model's vocabulary (which would otherwise fail
    inside the embedding, or never match a generated token); nothing when the model does not say its vocabulary
    size."""
    vocab_size = _vocab_size(model)
    if vocab_size is None:
        return
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(
            f"mask_token_id={mask_token_id} is outside the model's vocabulary (vocab_size={vocab_size}): pass the "
            "[MASK] id of this model (its config's or tokenizer's mask_token_id)"
        )
    eos_ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    outside = [int(i) for i in eos_ids if not 0 <= int(i) < vocab_size]
    if outside:
        raise ValueError(
            f"eos_token_id {outside} is outside the model's vocabulary (vocab_size={vocab_size}), so generation "
            "would never stop at it: pass this model's EOS id (its tokenizer's eos_token_id), or eos_token_id=None"
        )
    if input_ids is not None and input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(
            f"input_ids hold ids outside the model's vocabulary [0, {vocab_size}): min {int(input_ids.min())}, max "
            f"{int(input_ids.max())}: encode the prompt with this model's tokenizer"
        )


def _max_positions(model: Any) -> Optional[int]:
    """The longest canvas the model takes (``max_position_embeddings`` or ``max_sequence_length``), or None."""
    model_config = getattr(model, "config", None)
    return getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "max_sequence_length", None)


def _vocab_size(model: Any) -> Optional[int]:
    """Rows of the input embedding (else ``config.vocab_size``), or None when the model says neither."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    return int(rows) if rows is not None else getattr(getattr(model, "config", None), "vocab_size", None)


def _default_sampler(
    config, denoiser: Denoiser, logits_processor, generator, canvas: Canvas, prompt_len: int
) -> Sampler:
    """The default sampler of ``config``: processors from the config's fields before the user's, then warpers."""
    canvas_processors, context_processors = config_processors(config, denoiser.mask_id)
    canvas_processors.extend(logits_processor or [])
    warpers = build_warpers(config.temperature, config.top_k, config.top_p)
    warpers.extend(config_warpers(config))
    record = bool(config.return_dict_in_generate) and (bool(config.output_scores) or bool(config.output_logits))
    proposer = Proposer(
        mask_id=denoiser.mask_id,
        temperature=config.temperature,
        processors=canvas_processors,
        warpers=warpers,
        generator=generator,
        context_processors=context_processors,
        record=record,
        compile_options=compile_options(config),
        ngram=config_ngram(config, denoiser.mask_id),
    )
    recorder = None
    if record:
        recorder = ScoreRecorder(*canvas.x.shape, prompt_len, bool(config.output_scores), bool(config.output_logits))
    schedule = get_schedule(config.schedule, **(config.schedule_kwargs or {}))
    return Sampler(
        denoiser, proposer, get_strategy(config.strategy), build_transfer(config), schedule, generator, recorder
    )


def _finalize(canvas: Canvas, finished: torch.Tensor, eos_ids, pad_id: int, mask_id: int) -> torch.Tensor:
    """Masks left in finished rows and tokens after the first EOS become padding; returns generated counts (B,)."""
    unfilled = (canvas.x == mask_id) & canvas.gen_mask0 & finished[:, None]
    canvas.x.masked_fill_(unfilled, pad_id)
    return finalize_eos(canvas.x, canvas.gen_mask0, eos_ids, pad_id, unfilled)


class MaskedDiffusionGenerationMixin:
    """Gives a model ``generate`` by reverse diffusion (see `diffusion_generate`).

    ``from_pretrained`` loads ``generation_config.json`` as a `MaskedDiffusionGenerationConfig` (transformers'
    own loader would read a plain `GenerationConfig` here and drop the diffusion fields).
    """

    generation_config_class = MaskedDiffusionGenerationConfig

    def adjust_generation_fn(
        self,
        generation_config,
        from_auto_class,
        from_pipeline,
        pretrained_model_name_or_path,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Called by ``PreTrainedModel.from_pretrained``: load the checkpoint's generation config, if any."""
        if generation_config is not None:
            self.generation_config = MaskedDiffusionGenerationConfig.from_any(generation_config)
            return
        if pretrained_model_name_or_path is None:
            return
        names = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")
        loading = dict(zip(names, args))
        loading.update({k: kwargs[k] for k in names if k in kwargs})
        try:
            self.generation_config = MaskedDiffusionGenerationConfig.from_pretrained(
                pretrained_model_name_or_path, **{k: v for k, v in loading.items() if v is not None}
            )
        except OSError:  # no generation_config.json: keep the one built from the model config
            pass

    @torch.no_grad()
    def generate(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        generation_config: Optional[GenerationConfig] = None,
        logits_processor: Optional[LogitsProcessorList] = None,
        stopping_criteria: Optional[StoppingCriteriaList] = None,
        streamer: Any = None,
        generator: Optional[torch.Generator] = None,
        seed: Seeds = None,
        **kwargs: Any,
    ) -> Union[torch.LongTensor, MaskedDiffusionGenerateOutput]:
        r"""Generate by reverse diffusion. Arguments as in `hf_mdm.generation.diffusion_generate`.

        Example:

        ```python
        >>> import torch
        >>> from hf_mdm import MDMConfig, MDMForMaskedDiffusion
        >>> model = MDMForMaskedDiffusion(MDMConfig(vocab_size=17, mask_token_id=16, hidden_size=32,
        ...                                         num_attention_heads=2, intermediate_size=64))
        >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, steps=2).shape
        torch.Size([1, 7])
        ```
        """
        return diffusion_generate(
            self,
            input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            streamer=streamer,
            generator=generator,
            seed=seed,
            **kwargs,
        )
