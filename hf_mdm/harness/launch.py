"""Multi-process runs: a run started by ``accelerate launch --num_processes N`` that got one process says so.

Without a config file, ``accelerate launch`` starts several processes only with ``--multi_gpu`` (set for you when
it sees several GPUs); otherwise it starts the script once, with ``MASTER_ADDR`` / ``MASTER_PORT`` set for the
processes it did not start and no ``WORLD_SIZE``. On a CPU machine ``accelerate launch --num_processes 2 ...``
would thus evaluate everything in one process, silently. `check_launch` refuses that before any work, with the
command that does shard: ``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N ...`` on CPUs.
At the end of a run `close_process_group` lets the processes finish together.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

__all__ = ["SHARDED_LAUNCH", "check_launch", "close_process_group"]

SHARDED_LAUNCH = "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N"
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_LAUNCHED_BY_ACCELERATE = "ACCELERATE_MIXED_PRECISION"  # set by every accelerate launcher


def check_launch(environ: Optional[Mapping[str, str]] = None, accelerator: Optional[bool] = None) -> None:
    """A ValueError when ``accelerate launch`` was asked for several processes but started this one alone, or
    started several on a machine without an accelerator and without ``ACCELERATE_USE_CPU=1`` (each would then run
    everything as the only process); ``accelerator`` (default: whether torch sees a GPU) is for tests."""
    environ = os.environ if environ is None else environ
    _check_cpu_processes(environ, accelerator)
    launched = _LAUNCHED_BY_ACCELERATE in environ and "MASTER_PORT" in environ and "MASTER_ADDR" in environ
    if launched and not any(name in environ for name in _WORLD_SIZE_VARIABLES):
        raise ValueError(
            "accelerate launch was asked for several processes (--num_processes > 1) but started this one alone: "
            "without --multi_gpu (which it sets only when it sees several GPUs) accelerate does not start the others, "
            f"and the run would not be sharded. On CPUs run `{SHARDED_LAUNCH} -m hf_mdm.harness run ...`; on "
            "GPUs add --multi_gpu (or configure it once with `accelerate config`); for one process drop --num_processes"
        )


def _check_cpu_processes(environ: Mapping[str, str], accelerator: Optional[bool]) -> None:
    world = environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1 or environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return
    if accelerator is None:
        import torch

        accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if not accelerator:
        raise ValueError(
            f"{world} processes were started on a machine without a GPU, but ACCELERATE_USE_CPU=1 is not set: each "
            "process would run everything alone (accelerate shards CPU processes only with it; a config file's "
            f"use_cpu does not reach them). Run `{SHARDED_LAUNCH} ...` (or set ACCELERATE_USE_CPU=1)"
        )


def close_process_group() -> None:
    """After a run that succeeded: under ``accelerate launch`` every process waits for the others (rank 0 may still
    be writing results), then the process group is closed. A process that exits with the group's threads alive
    can abort ("terminate called without an active exception"), and ``accelerate`` then reports the run failed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
