"""The generation config ``hf-mdm serve MODEL`` serves with (``--generation-config``; ``--preset`` is a setting of
every request, `hf_mdm.serve.settings.ServeSettings.preset`). The model and its tokenizer load through
`hf_mdm.loading.load_pretrained`. What cannot be read is a ValueError saying what and why, in one line (the
command's error)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..generation import MaskedDiffusionGenerationConfig
from ..generation_presets import PRESET_NAMES
from ..loading import one_line

__all__ = ["serving_config"]


def serving_config(
    preset: Optional[str], generation_config: Optional[str]
) -> Optional[MaskedDiffusionGenerationConfig]:
    """The config requests start from: a saved generation config (a JSON file or a folder holding
    ``generation_config.json``, e.g. ``hf-mdm tune``'s), or None (the checkpoint's own, or the ``preset``'s, which
    is built for each request from its length and settings). Checks ``preset``'s name."""
    if preset and generation_config:
        raise ValueError("pass --preset or --generation-config, not both")
    if preset and preset not in PRESET_NAMES:
        raise ValueError(f"--preset {preset!r}: one of {list(PRESET_NAMES)}")
    if not generation_config:
        return None
    path = Path(generation_config)
    if not path.exists():
        raise ValueError(f"--generation-config {generation_config}: no such file or folder")
    try:
        if path.is_file():
            return MaskedDiffusionGenerationConfig.from_pretrained(str(path.parent), config_file_name=path.name)
        return MaskedDiffusionGenerationConfig.from_pretrained(str(path))
    except Exception as err:
        raise ValueError(f"--generation-config {generation_config}: {one_line(err)}") from err
