"""`launch`: a module of the repository run under ``accelerate launch`` on 2 CPU processes with one of hf_mdm's
shipped accelerate configs, as the scaling-out and RL command tests run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hf_mdm.scaling import accelerate_config

REPO = Path(__file__).resolve().parents[2]
ACCELERATE = Path(sys.executable).parent / "accelerate"


def launch(config: str, *command: str) -> subprocess.CompletedProcess:
    """``ACCELERATE_USE_CPU=1 accelerate launch --config_file CONFIG --num_processes 2 -m COMMAND`` from the repo."""
    launcher = [str(ACCELERATE), "launch", "--config_file", str(accelerate_config(config)), "--num_processes", "2"]
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    argv = [*launcher, "--main_process_port", "0", "-m", *command]
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    return result
