"""GRPO memory and time per optimizer step: hf_mdm's `DiffusionGRPOTrainer` on a masked diffusion LM against TRL's
own `GRPOTrainer` on an autoregressive Llama of the same size, on the same task (-> ``evaluation/GRPO.md``).

Task: a random bigram language (`hf_mdm.languages.NGramLanguage.random`, ``--vocab`` V tokens, seed 0), completions
of ``--length`` L tokens, reward 1.0 for a completion in the language (`hf_mdm.rl.rewards.language_membership`).
Both models have the dimensions of `hf_mdm.training.model_dims` ``--size``, are random (seed 0), float32, on the CPU:

- ``AR``: ``transformers.LlamaForCausalLM(ar_config_for(V, L, size))`` under ``trl.GRPOTrainer``; its prompt is the
  one BOS token (id V) that the AR baseline reads first, its tokenizer `ar_tokenizer` (the language's words, [BOS],
  and an [EOS] id outside the model's vocabulary, so that no completion stops before L tokens, as the MDM's do not);
  rollouts are transformers' ``generate`` (KV cache, one forward per token);
- ``MDM``: ``MDMForMaskedDiffusion(mdm_config_for(V, L, size))`` under `DiffusionGRPOTrainer`, empty prompts
  (`language_prompts`, `language_tokenizer`); rollouts are hf_mdm's ``generate`` (``--rollout-steps`` forwards over
  the L-token canvas, stochastic transfer, random order, linear schedule), one row per log-likelihood estimator:
  ``one_step``, ``coupled`` and ``elbo`` with ``--draws`` copies; a row with L rollout steps (one token per forward,
  as the AR); and one row of each model with ``beta`` = ``--beta`` (the reference model's forward and the KL term).

Every trainer has the same ``per_device_train_batch_size`` (``--batch`` completions a step), ``num_generations``
(``--generations``), ``max_completion_length`` = L, temperature 1, AdamW at a constant learning rate, no logging,
no checkpoints; ``beta`` 0 unless the row says otherwise.

Each row's trainer lives in its own process (forked from one fresh process that imported the libraries first,
``forkserver``): it first runs one step of a trainer of the same row at the ``--quick`` shape (so that lazy imports
and one-time set-ups are not counted), then builds the measured trainer (the AR's reference, which TRL loads
memory-mapped from the saved policy, read in), reads its peak resident set (``ru_maxrss``) and runs one untimed
warm-up step. Then ``--repeats`` rounds: in each, every row's process runs ``--steps`` optimizer steps in turn (the
order rotating round to round). A step is timed from the Trainer's ``on_step_begin`` to its ``on_step_end``
(generation, rewards, the log-likelihood forwards, backward and the optimizer); generation seconds are the time
inside the trainer's ``_generate_single_turn`` in that step, the rest is the step less its generation, CPU seconds
the process's CPU time in the step (``time.process_time``). Seconds are medians over the timed steps. Memory: the
process's peak resident set at the end less the one read before the first step (what the steps add above the built
trainer: gradients, optimizer states, rollouts, activations).

    python evaluation/bench_grpo.py [--size base] [--vocab 16] [--length 32] [--batch 8] [--generations 4]
        [--rollout-steps 8] [--draws 4] [--beta 0.04] [--steps 2] [--repeats 5] [--threads 1] [--output FILE.md]
        [--quick]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import parse_table_arguments, print_and_write  # noqa: E402

SIZES = dict(size="base", vocab=16, length=32, batch=8, generations=4, rollout_steps=8, draws=4, beta=0.04, steps=2)
QUICK = dict(size="tiny", vocab=4, length=8, batch=4, generations=4, rollout_steps=2, draws=2, beta=0.04, steps=1)
PRELOAD = ["torch", "datasets", "transformers", "trl", "hf_mdm.rl.trainer"]  # imported once, before the forks
PROMPTS = 64  # dataset rows (prompts); a step uses batch / generations of them


def rows_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The table's rows: (name, model, estimator and its options, rollout steps, beta); the AR rows first."""
    steps, full = args.rollout_steps, args.length
    rows = [
        dict(name="AR, TRL", model="ar", beta=0.0),
        dict(name=f"MDM, one_step, {steps} rollout steps", model="mdm", estimator="one_step", steps=steps, beta=0.0),
        dict(name=f"MDM, coupled, {steps} rollout steps", model="mdm", estimator="coupled", steps=steps, beta=0.0),
        dict(
            name=f"MDM, elbo ({args.draws} draws), {steps} rollout steps",
            model="mdm",
            estimator="elbo",
            options={"draws": args.draws},
            steps=steps,
            beta=0.0,
        ),
        dict(name=f"MDM, one_step, {full} rollout steps", model="mdm", estimator="one_step", steps=full, beta=0.0),
        dict(name=f"AR, TRL, beta {args.beta:g}", model="ar", beta=args.beta),
        dict(
            name=f"MDM, one_step, {steps} rollout steps, beta {args.beta:g}",
            model="mdm",
            estimator="one_step",
            steps=steps,
            beta=args.beta,
        ),
    ]
    if args.quick:  # the AR and the three estimators
        rows = rows[:4]
    elif not args.beta:
        rows = rows[:5]
    return rows


def ar_tokenizer(vocab_size: int) -> Any:
    """The AR's tokenizer: token i is the word ``t<i>``, [BOS] is id ``vocab_size`` (the AR baseline's BOS), [EOS]
    is id ``vocab_size + 1``, outside the model's vocabulary (never generated), and the padding (never needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)} | {"[BOS]": vocab_size, "[EOS]": vocab_size + 1}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[EOS]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="[BOS]", eos_token="[EOS]", pad_token="[EOS]", unk_token="[EOS]"
    )


def build_trainer(row: dict[str, Any], shape: dict[str, Any], output_dir: str) -> Any:
    """The row's trainer at ``shape`` (the benchmark's sizes), its model seeded with 0."""
    import datasets

    from hf_mdm.languages import NGramLanguage
    from hf_mdm.rl.rewards import language_membership

    vocab, length = shape["vocab"], shape["length"]
    common = dict(
        output_dir=output_dir, per_device_train_batch_size=shape["batch"], num_generations=shape["generations"],
        max_completion_length=length, max_steps=10**6, beta=row["beta"], learning_rate=1e-5,
        lr_scheduler_type="constant", save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0,
    )  # fmt: skip
    reward = language_membership(NGramLanguage.random(vocab_size=vocab, n=2, seed=0))
    torch.manual_seed(0)
    if row["model"] == "ar":
        from transformers import LlamaForCausalLM
        from trl import GRPOConfig, GRPOTrainer

        from hf_mdm.training import ar_config_for

        # TRL builds the reference (beta > 0) by loading the policy's path again: the policy is saved there
        model = LlamaForCausalLM(ar_config_for(vocab, length, shape["size"]))
        path = tempfile.mkdtemp(prefix="ar-model-", dir=output_dir)
        model.save_pretrained(path)
        model.config._name_or_path = path
        prompts = datasets.Dataset.from_dict({"prompt": ["[BOS]"] * PROMPTS})
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=GRPOConfig(**common), train_dataset=prompts,
            processing_class=ar_tokenizer(vocab),
        )  # fmt: skip
        if trainer.ref_model is not None:  # loaded memory-mapped: its weights read in now, as part of the build
            with torch.no_grad():
                for parameter in trainer.ref_model.parameters():
                    parameter.sum()
        return trainer
    from hf_mdm import MDMForMaskedDiffusion
    from hf_mdm.rl.language_task import language_prompts, language_tokenizer
    from hf_mdm.rl.trainer import DiffusionGRPOConfig, DiffusionGRPOTrainer
    from hf_mdm.training import mdm_config_for

    model = MDMForMaskedDiffusion(mdm_config_for(vocab, length, shape["size"]))
    rollout = {"steps": row["steps"], "transfer": "stochastic", "strategy": "random", "schedule": "linear"}
    config = DiffusionGRPOConfig(
        **common, rollout=rollout, estimator=row["estimator"], estimator_options=dict(row.get("options", {}))
    )
    return DiffusionGRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=language_prompts(PROMPTS),
        processing_class=language_tokenizer(vocab),
    )  # fmt: skip


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _clock_generation(trainer: Any, clock: dict[str, float]) -> None:
    """Adds the seconds of every ``_generate_single_turn`` call of ``trainer`` to ``clock["generation"]``."""
    generate = trainer._generate_single_turn

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            clock["generation"] += time.perf_counter() - start

    trainer._generate_single_turn = timed


def worker(conn: Any, row: dict[str, Any], shape: dict[str, Any], quick: dict[str, Any], threads: int) -> None:
    """One row's process: a warm-up run at the quick shape, the measured trainer built and its memory read; then
    steps on request: each ``conn.recv()`` is a number of steps, answered with each step's (wall, generation, process
    CPU) seconds; ``None`` ends, answered with the memory."""
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamed checkpointing options
    from transformers import PrinterCallback, TrainerCallback
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()

    with tempfile.TemporaryDirectory() as scratch:
        if shape != quick:  # at the quick shape, the measured trainer's warm-up step is this run
            warm = build_trainer(row | {"steps": quick["rollout_steps"]}, quick, scratch)
            warm.args.max_steps = 1
            warm.remove_callback(PrinterCallback)
            warm.train()
            del warm
            gc.collect()
        trainer = build_trainer(row, shape, scratch)
        gc.collect()
        base = peak_mb()
        clock = {"generation": 0.0, "start": 0.0, "cpu": 0.0}
        _clock_generation(trainer, clock)
        wanted = [1]  # the warm-up step first
        timings: list[tuple[float, float, float]] = []

        class Pace(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock["generation"], clock["start"], clock["cpu"] = 0.0, time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kwargs):
                seconds, cpu = time.perf_counter() - clock["start"], time.process_time() - clock["cpu"]
                timings.append((seconds, clock["generation"], cpu))
                wanted[0] -= 1
                if wanted[0] > 0:
                    return
                conn.send(timings[:])
                timings.clear()
                request = conn.recv()
                if request is None:
                    control.should_training_stop = True
                else:
                    wanted[0] = request

        trainer.remove_callback(PrinterCallback)  # the summary printed at the end of train()
        trainer.add_callback(Pace())
        conn.send("ready")
        trainer.train()
        conn.send({"base_mb": base, "peak_mb": peak_mb()})
    conn.close()


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every row in its own process; ``args.repeats`` rounds of ``args.steps`` steps each, the rows in turn."""
    shape = {name: getattr(args, name) for name in SIZES}
    rows = rows_of(args)
    context = multiprocessing.get_context("forkserver")  # each worker forked from one fresh process, imports done
    context.set_forkserver_preload([*PRELOAD, __name__])
    workers = []
    for row in rows:  # one at a time: their builds do not overlap
        parent, child = context.Pipe()
        process = context.Process(target=worker, args=(child, row, shape, QUICK, args.threads), daemon=True)
        process.start()
        child.close()  # the worker's end: a worker that fails ends the pipe (EOFError) instead of a wait
        _receive(parent, row)
        workers.append((parent, process))
    for row, (parent, _) in zip(rows, workers):
        _receive(parent, row)  # the warm-up step is not timed
    for row in rows:
        row["steps_s"], row["generation_s"], row["cpus_s"] = [], [], []
    for round_ in range(args.repeats):
        print(f"round {round_ + 1} of {args.repeats}", file=sys.stderr, flush=True)
        order = list(range(len(rows)))
        order = order[round_ % len(order) :] + order[: round_ % len(order)]
        for i in order:
            parent = workers[i][0]
            parent.send(args.steps)
            for seconds, generation, cpu in _receive(parent, rows[i]):
                rows[i]["steps_s"].append(seconds)
                rows[i]["generation_s"].append(generation)
                rows[i]["cpus_s"].append(cpu)
    for row, (parent, process) in zip(rows, workers):
        parent.send(None)
        row.update(_receive(parent, row))
        process.join()
        row["added_mb"] = row["peak_mb"] - row["base_mb"]
        row["step_s"] = statistics.median(row["steps_s"])
        row["gen_s"] = statistics.median(row["generation_s"])
        row["cpu_s"] = statistics.median(row["cpus_s"])
        row["rest_s"] = statistics.median(s - g for s, g in zip(row["steps_s"], row["generation_s"]))
    return rows


def _receive(conn: Any, row: dict[str, Any]) -> Any:
    try:
        return conn.recv()
    except EOFError:
        raise RuntimeError(f"the process of row {row['name']!r} ended early (its traceback is above)") from None


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference > 0 else "n/a"


def markdown(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    from hf_mdm.training import model_dims

    dims = model_dims(args.size)
    timed = args.repeats * args.steps
    lines = [
        f"# GRPO per optimizer step: hf_mdm's DiffusionGRPOTrainer (MDM) against TRL's GRPOTrainer (AR), CPU, "
        f"{args.threads} thread(s)",
        "",
        f"Setting: model size {args.size!r} (hidden {dims['hidden_size']}, {dims['num_hidden_layers']} layers, MLP "
        f"{dims['intermediate_size']}) for both, float32; a random bigram language of V = {args.vocab} tokens, "
        f"completions of L = {args.length} tokens, reward: membership in the language; "
        f"per_device_train_batch_size {args.batch}, num_generations {args.generations}, AdamW; MDM rollouts "
        f"stochastic transfer, random order, linear schedule. Seconds: medians of {timed} timed steps per row "
        f"({args.repeats} rounds of {args.steps}, the rows interleaved, after a warm-up step); generation is the time "
        f"in `_generate_single_turn`, the rest is the step less it; CPU is the process's CPU time in the step (on a "
        f"shared machine, wall time well above it is time spent waiting for a core). "
        f"Memory: peak resident set added by the steps above the built trainer (a beta row's reference model is part "
        f"of the build: in the peak, not in the memory added), each row in its own process. Ratios against the AR row "
        f"with the same beta. "
        f"torch.set_num_threads({args.threads}); the numbers are from one run on a shared machine.",
        "",
        "| row | beta | s / step | generation s | rest s | vs AR | CPU s / step | vs AR | memory added (MiB) "
        "| vs AR | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ar = next(r for r in rows if r["model"] == "ar" and r["beta"] == row["beta"])
        lines.append(
            f"| {row['name']} | {row['beta']:g} | {row['step_s']:.3f} | {row['gen_s']:.3f} | {row['rest_s']:.3f} | "
            f"{_ratio(row['step_s'], ar['step_s'])} | {row['cpu_s']:.3f} | "
            f"{_ratio(row['cpu_s'], ar['cpu_s'])} | {row['added_mb']:.1f} | "
            f"{_ratio(row['added_mb'], ar['added_mb'])} | {row['peak_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in SIZES.items():
        kind = type(default)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=default)
    args = parse_table_arguments(parser, argv, repeats=5, sizes={}, quick={})
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    return args


def main(argv: Optional[list[str]] = None) -> str:
    args = parse(argv)
    return print_and_write(markdown(args, measure(args)), args.output)


if __name__ == "__main__":
    main()
