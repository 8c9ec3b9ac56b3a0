"""The reverse process: sampling from a masked diffusion language model.

One implementation serves ``model.generate`` (through `MaskedDiffusionGenerationMixin`) and the free function
`diffusion_generate(model, input_ids, ...)`, which works with any model whose output has ``.logits`` (hf_mdm's own
models, LLaDA and Dream loaded natively or with ``trust_remote_code``, the exact-posterior ``OracleDenoiser``).

`diffusion_generate` reads as its steps, each a call into a piece: resolve the config; check the inputs in one gate;
uniform corruption (DiffusionGemma) runs its own sampler; else the canvas is built; rows run alone or in batched groups
where the call asks for it; else the batch as given runs the sampler's pieces through the loop of its mode
(`generation_mode` -> `LOOPS`), then padding and the output. The pieces live in flat sibling modules, one concept
each (``save_pretrained`` exports them with the model as remote code, so they import only torch, transformers and
each other), by stage:

1. The settings: `hf_mdm.generation_config` (`MaskedDiffusionGenerationConfig`, its validation, the output),
   `hf_mdm.generation_values` (what a number is to the validators), `hf_mdm.generation_presets` (the published
   samplers as presets), `hf_mdm.generation_resolve` (which level sets each field of a call).
2. The inputs, the canvas and its rows: `hf_mdm.generation_canvas` (the one gate of the inputs, the canvas, the loop
   over its blocks, the padding at the end), `hf_mdm.generation_rows` (rows alone or in batched groups:
   ``batch_invariant``, one seed per row), `hf_mdm.generation_random` (the draws: one stream, or one per row).
3. The model call: `hf_mdm.generation_denoiser` (``logits_to_keep``, guidance, logits shift, cache, NFE),
   `hf_mdm.generation_static` (static shapes for a compiled call).
4. A step: `hf_mdm.generation_processors` (transformers' generation fields: processors and warpers),
   `hf_mdm.generation_ngram` (``no_repeat_ngram_size`` in any order), `hf_mdm.generation_strategy` (which positions:
   proposals, scores, choice), `hf_mdm.generation_transfer` (how many: time grid, steps per block, counts).
5. The loops: `hf_mdm.generation_sampler` (the sampler's pieces, the modes of a block's steps and the tokens they
   write), `hf_mdm.generation_editing` (LLaDA2.1's token editing), `hf_mdm.generation_remask` (ReMDM's remasking
   steps), `hf_mdm.generation_speculative` (exact speculative decoding over the canvas).
6. The end: `hf_mdm.generation_stopping` (EOS, stopping criteria, padding after EOS, streaming, the trace of a
   call), `hf_mdm.timer` (the device-synchronised timer behind ``elapsed_s``).
7. Other samplers, token for token: `hf_mdm.generation_reference` (LLaDA's and Dream's), `hf_mdm.generation_uniform`
   (uniform-corruption models: transformers' DiffusionGemma).

Every public name of those modules that users import from here is re-exported.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Union

import torch
from torch.utils._pytree import tree_map_only
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList

from .generation_canvas import (
    Canvas,
    check_inputs,
    check_token_ids,
    fill_last_blocks,
    finish_canvas,
    new_tokens,
    prepare_canvas,
    sample_blocks,
    whole_block_length,
)
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
    run_reference,
)
from .generation_remask import REMDM_VARIANTS, Remasking
from .generation_resolve import resolve_config
from .generation_rows import Seeds, call_generator, generate_rows, require_own_draws, rows_of_call
from .generation_sampler import Sampler
from .generation_stopping import Streamer, Trace, eos_tensor, warn_unfinished, with_max_time
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


def outside_autograd(function: Callable) -> Callable:
    """Run ``function`` under ``torch.inference_mode`` (no autograd records nor version counters: less host work
    for each of a step's small operations and each of the forward's) and hand back its tensors as normal tensors
    (`normal_tensors`), so that they can enter autograd afterwards (a rollout's ids in a training step)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            output = function(*args, **kwargs)
        return normal_tensors(output)

    return run


def normal_tensors(value: Any) -> Any:
    """``value`` with every tensor made in inference mode cloned into a normal one (outside inference mode), through
    whatever torch's pytree walks (model outputs, dicts, lists, tuples); anything else as it is."""
    return tree_map_only(torch.Tensor, lambda t: t.clone() if t.is_inference() else t, value)


@outside_autograd
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
    # 2. the inputs, checked in one gate before anything is built (hf_mdm.generation_canvas.check_inputs)
    uniform = uses_uniform_corruption(model, config, seed)
    check_inputs(model, config, kwargs, input_ids, attention_mask, logits_processor, stopping_criteria, uniform)
    # 3. uniform corruption (random tokens for noise, DiffusionGemma): its own sampler (hf_mdm.generation_uniform)
    if uniform:
        return _uniform_corruption(
            model, input_ids, attention_mask, config, generator, seed, logits_processor, stopping_criteria, streamer
        )
    # 4. the canvas: the prompt, then max_new_tokens [MASK] tokens; padding never attended to nor generated
    mask_id, length = int(config.mask_token_id), new_tokens(config, input_ids)
    canvas = prepare_canvas(input_ids, attention_mask, length, mask_id)
    # 5. rows alone or in batched groups without padding (batch_invariant, one seed per row): a call for each group
    layout, groups = rows_of_call(model, config, seed, generator, input_ids, attention_mask)
    if groups is not None:
        again = functools.partial(diffusion_generate, model, logits_processor=logits_processor)
        return generate_rows(again, layout, groups, config, length, seed, stopping_criteria, streamer)
    generator = call_generator(generator, seed, input_ids.device)  # the batch as given: one stream of draws
    # 6. whole blocks: each row runs to the end of its last attention block (the block tail, cut at the end)
    if config.whole_blocks:
        canvas = fill_last_blocks(canvas, whole_block_length(model, config), mask_id)
    # 7. the batch as given: the sampler's pieces (with hide_block_tail the tail hidden from attention), the reverse
    # process, padding, the output
    sampler = _build_sampler(model, config, canvas, input_ids.shape[1], logits_processor, generator)
    return _run_batch(config, sampler, canvas, streamer, stopping_criteria, input_ids.shape[1])


def _uniform_corruption(
    model, input_ids, attention_mask, config, generator, seed, logits_processor, stopping_criteria, streamer
):
    """3. The uniform-corruption sampler on the batch; with ``batch_invariant`` every row alone (the rows of a batch
    share the canvas draws), its padding dropped."""
    layout, groups = rows_of_call(model, config, seed, generator, input_ids, attention_mask)
    if config.batch_invariant and groups:  # (no groups without the mode: one seed per row is refused here)
        require_own_draws(seed, generator)  # the canvas is drawn
        again = functools.partial(diffusion_generate, model, logits_processor=logits_processor)
        return generate_rows(again, layout, layout.alone(), config, None, seed, stopping_criteria)
    generator = call_generator(generator, seed, input_ids.device)
    return uniform_generate(
        model, input_ids, attention_mask, config, generator, logits_processor, stopping_criteria, streamer
    )


def _build_sampler(model: Any, config: Any, canvas: Canvas, prompt_len: int, logits_processor, generator) -> Sampler:
    """7. The sampler of the call: the model call (guidance, cache, logits shift, compiled forward; with
    ``hide_block_tail`` the block tail hidden from attention), the proposals (processors from the config's fields
    before the user's, then warpers), the strategy, the transfer rule, the schedule and the records."""
    mask_id = int(config.mask_token_id)
    hidden_from = canvas.width if config.hide_block_tail else None
    denoiser = Denoiser.for_model(
        model,
        mask_id,
        config.cfg_scale,
        logits_shift_of(model, config),
        config.kv_cache,
        config.kv_cache_refresh,
        config.block_length,
        compile_options(config),
        hidden_from=hidden_from,
    )
    canvas_processors, context_processors = config_processors(config, mask_id)
    canvas_processors.extend(logits_processor or [])
    warpers = build_warpers(config.temperature, config.top_k, config.top_p)
    warpers.extend(config_warpers(config))
    record = bool(config.return_dict_in_generate) and (bool(config.output_scores) or bool(config.output_logits))
    proposer = Proposer(
        mask_id=mask_id,
        temperature=config.temperature,
        processors=canvas_processors,
        warpers=warpers,
        generator=generator,
        context_processors=context_processors,
        record=record,
        compile_options=compile_options(config),
        ngram=config_ngram(config, mask_id),
    )
    recorder = None
    if record:
        recorder = ScoreRecorder(*canvas.x.shape, prompt_len, bool(config.output_scores), bool(config.output_logits))
    schedule = get_schedule(config.schedule, **(config.schedule_kwargs or {}))
    strategy, transfer = get_strategy(config.strategy), build_transfer(config)
    return Sampler(denoiser, proposer, strategy, transfer, schedule, generator, recorder)


def _run_batch(config, sampler: Sampler, canvas: Canvas, streamer, stopping_criteria, prompt_len: int):
    """7. The reverse process on the batch as given, timed; then the padding, the stream's end and the output."""
    remasking = Remasking.from_config(config, streamer)  # None without remdm
    stopping = with_max_time(stopping_criteria, config.max_time)
    eos_ids = eos_tensor(config, canvas.x.device)
    if config.eos_early_stop and eos_ids is not None:
        sampler.early_stop_eos = eos_ids
    stream = Streamer(streamer, canvas.x, canvas.gen_mask0, sampler.mask_id, canvas.width)
    trace = Trace(stream, keep_history=bool(config.output_history))
    with Stopwatch(canvas.x.device) as watch:
        finished = _reverse_process(config, sampler, remasking, canvas, trace, eos_ids, stopping, prompt_len)
        # masks left in finished rows and tokens after the first EOS become padding (what is missing noted first)
        pad_id = _pad_id(config, eos_ids, sampler.mask_id)
        canvas, num_generated, missing = finish_canvas(canvas, finished, eos_ids, pad_id, sampler.mask_id)
    trace.stream.end(canvas.x)
    if config.max_time is not None:
        warn_unfinished(missing, finished, config.max_time, pad_id, sampler.mask_id)
    if not config.return_dict_in_generate:
        return canvas.x
    return _output(canvas, sampler, trace, num_generated, missing.any(1), watch.seconds, bool(config.output_history))


def _reverse_process(config, sampler: Sampler, remasking, canvas: Canvas, trace: Trace, eos_ids, stopping, prompt_len):
    """The reverse process on ``canvas``, in place, by the loop of the call's mode (`generation_mode`, `LOOPS`);
    returns the (B,) rows that finished early."""
    run = LoopRun(config, sampler, remasking, canvas, trace, eos_ids, stopping, prompt_len)
    return LOOPS[generation_mode(config, sampler)](run)


@dataclasses.dataclass
class LoopRun:
    """What a loop of `LOOPS` runs on: the call's config, sampler, remasking (ReMDM or None), canvas and trace, its
    EOS ids and stopping criteria, the prompt's length."""

    config: MaskedDiffusionGenerationConfig
    sampler: Sampler
    remasking: Any
    canvas: Canvas
    trace: Trace
    eos_ids: Optional[torch.Tensor]
    stopping: Any
    prompt_len: int


def generation_mode(config: MaskedDiffusionGenerationConfig, sampler: Sampler) -> str:
    """The mode of a call: ``"reference"`` (LLaDA's or Dream's sampler, token for token), ``"canvas"`` (a transfer
    with its own loop over the canvas: speculative decoding), else ``"blocks"`` (the block loop; in a block, the
    steps of `hf_mdm.generation_sampler.block_mode`, a transfer's own or ReMDM's)."""
    if config.reference is not None:
        return "reference"
    return "canvas" if sampler.transfer.canvas_loop is not None else "blocks"


def _reference_loop(run: LoopRun) -> torch.Tensor:
    canvas, sampler = run.canvas, run.sampler
    run_reference(ReferenceRun(run.config, sampler.denoiser, canvas, run.prompt_len, sampler.generator, run.trace))
    return torch.zeros(canvas.x.shape[0], dtype=torch.bool, device=canvas.x.device)


def _canvas_loop(run: LoopRun) -> torch.Tensor:
    loop = run.sampler.transfer.canvas_loop
    return loop(run.sampler, run.canvas, run.trace, run.config.block_length, run.eos_ids, run.stopping)


def _block_loop(run: LoopRun) -> torch.Tensor:
    config = run.config
    finishing_eos = run.eos_ids if config.finish_at_eos else None
    return sample_blocks(
        run.sampler, run.canvas, run.trace, config.steps, config.block_length, finishing_eos, run.stopping,
        run.remasking,
    )  # fmt: skip


#: The loop of each mode (`generation_mode`), as transformers maps its generation modes to their decoding loops.
LOOPS: dict[str, Callable[[LoopRun], torch.Tensor]] = {
    "reference": _reference_loop,
    "canvas": _canvas_loop,
    "blocks": _block_loop,
}


def _pad_id(config: MaskedDiffusionGenerationConfig, eos_ids: Optional[torch.Tensor], mask_id: int) -> int:
    """What fills finished rows: ``pad_token_id``, else the first EOS id, else [MASK]."""
    if config.pad_token_id is not None:
        return config.pad_token_id
    return int(eos_ids[0]) if eos_ids is not None else mask_id


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

    def generate(  # diffusion_generate runs it outside autograd (`outside_autograd`)
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
