"""What a masked diffusion model family declares about itself: its logits shift and its reference sampler.

A model class declares its family's facts as the class attribute ``diffusion_facts`` (`DiffusionFacts`) and
registers them under its config's ``model_type`` (`register_family`), so that a checkpoint of that family loaded
through other code (its published remote code, a PEFT wrapper) gets the same facts. The sampler, the lm-eval model
and the Hub helpers ask `facts_of`; none of them reads a ``model_type``. Exported with the model as remote code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class DiffusionFacts:
    """``logits_shift``: 1 if position i is predicted from hidden state i - 1 (Dream), else 0; ``reference``: the
    published sampler hf_mdm reproduces token for token for this family (``"llada"``, ``"dream"``), or None;
    ``sampler``: the family's published sampler as settings of hf_mdm's default sampler ((field, value) pairs of
    `MaskedDiffusionGenerationConfig`, e.g. LLaDA2's ``transfer="llada2"`` with its defaults), which a call
    uses for the fields it leaves unset unless it names another ``transfer`` or ``strategy``; ``corruption``: the
    noise of the forward process, ``"mask"`` ([MASK] tokens: hf_mdm's samplers) or ``"uniform"`` (random tokens,
    no [MASK]: transformers' DiffusionGemma, sampled by `hf_mdm.generation_uniform`)."""

    logits_shift: int = 0
    reference: Optional[str] = None
    sampler: tuple[tuple[str, Any], ...] = ()
    corruption: str = "mask"

    def sampler_defaults(self, transfer: Optional[str], strategy: Optional[str] = None) -> dict[str, Any]:
        """The ``sampler`` settings, for a call whose ``transfer`` and ``strategy`` are unset or the family's own;
        else none (the call asks for another sampler)."""
        settings = dict(self.sampler)
        named = {"transfer": transfer, "strategy": strategy}
        if any(value is not None and value != settings.get(name) for name, value in named.items()):
            return {}
        return settings


_FAMILIES: dict[str, DiffusionFacts] = {}


def register_family(model_type: str, facts: DiffusionFacts) -> None:
    """Declare the facts of the checkpoints whose config has ``model_type``."""
    _FAMILIES[model_type] = facts


def facts_of(model_or_config: Any) -> Optional[DiffusionFacts]:
    """The facts a model's class declares, else those registered for its config's ``model_type``; None for a model
    of no registered masked diffusion family."""
    facts = getattr(type(model_or_config), "diffusion_facts", None)
    if isinstance(facts, DiffusionFacts):
        return facts
    config = getattr(model_or_config, "config", model_or_config)
    return _FAMILIES.get(getattr(config, "model_type", None))


def attention_block_size(model_or_config: Any) -> Optional[int]:
    """The attention block of a block-causal model (``config.block_size``: bidirectional inside each block of that
    many positions, causal across blocks), None for a bidirectional one."""
    config = getattr(model_or_config, "config", model_or_config)
    size = getattr(config, "block_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None
