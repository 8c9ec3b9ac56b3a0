"""The dataset card of the synthetic-language datasets (`hf_mdm.data`): metadata and a body rendered from
``model_cards/synthetic_dataset.md`` with each language's definition, parameters, sizes and exact entropy."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

from huggingface_hub import DatasetCard, DatasetCardData

from . import __version__
from .languages import PAPER_CITATION, ChainLanguage, HMMLanguage, SyntheticLanguage

DATASET_CARD_TEMPLATE = Path(__file__).resolve().parent.parent / "model_cards" / "synthetic_dataset.md"


def render_dataset_card(
    repo_id: str,
    builders: Sequence[Any],
    pushed_card: Optional[DatasetCard] = None,
    license: str = "apache-2.0",
    template_path: Optional[Union[str, os.PathLike]] = None,
) -> DatasetCard:
    """The dataset card of `builders`' datasets: metadata (license, tags, sizes, the `configs` and `dataset_info`
    written by `push_to_hub`, each `dataset_info` entry with its language parameters in `description`) and a body
    rendered from the template with each language's definition, parameters, sizes and exact entropy per token."""
    data = pushed_card.data.to_dict() if pushed_card is not None else {}
    descriptions = {builder.config.name: builder.info.description for builder in builders}
    infos = data.get("dataset_info")
    for info in [infos] if isinstance(infos, dict) else infos or []:
        if info.get("config_name", "default") in descriptions:
            info["description"] = descriptions[info.get("config_name", "default")]
    total = sum(sum(builder.config.split_sizes().values()) for builder in builders)
    data.update(
        license=license,
        pretty_name="hf_mdm synthetic languages",
        task_categories=["text-generation"],
        size_categories=[_size_category(total)],
        tags=["synthetic", "masked-diffusion", "formal-languages", "hf-mdm", "arxiv:2502.09622"],
    )
    return DatasetCard.from_template(
        DatasetCardData(**data),
        template_path=str(template_path or DATASET_CARD_TEMPLATE),
        repo_id=repo_id,
        configs_table=[_card_entry(builder) for builder in builders],
        hf_mdm_version=__version__,
        citation=PAPER_CITATION,
    )


def _card_entry(builder: Any) -> Dict[str, Any]:
    config, language = builder.config, builder.language
    entropy = language.expected_nll(config.length)
    return {
        "name": config.name,
        "definition": _definition(language),
        "language": repr(language),
        "parameters": json.dumps(language.to_config(), sort_keys=True),
        "length": config.length,
        "sizes": config.split_sizes(),
        "seed": config.seed,
        "builder_kwargs": ", ".join(f"{k}={v!r}" for k, v in _overrides(config).items()),
        "nats_per_token": entropy.per_token(config.length),
        "bits_per_token": entropy.per_token(config.length) / math.log(2),
        "stderr_per_token": entropy.stderr / config.length,
        "ter_reference": entropy.ter(config.length),
        "exact": entropy.stderr == 0.0,
    }


def _overrides(config: Any) -> Dict[str, Any]:
    """The keyword arguments that rebuild ``config`` from its name."""
    parameters = config.data_parameters()
    parameters.pop("language_kind")
    if config.chunk_size is None:
        parameters.pop("chunk_size")  # the default follows the length
    return {k: v for k, v in parameters.items() if v is not None}


def _definition(language: SyntheticLanguage) -> str:
    if isinstance(language, ChainLanguage):
        return (
            "Theorem 4.4 language: token 4u + v for u, v in 0..3; the first token is uniform, each next token has u "
            "equal to the previous token's v and a uniform v. A sequence is valid iff it is such a chain."
        )
    recipe = (
        f"every row drawn from Dirichlet({language.concentration}), entries below {language.prune_threshold} set to "
        "0 (the largest kept) and the row renormalised"
    )
    if isinstance(language, HMMLanguage):
        return (
            f"Hidden Markov model with {language.num_states} hidden states over {language.vocab_size} tokens: "
            f"initial, transition and emission matrices random ({recipe})."
        )
    return (
        f"{language.n}-gram language over {language.vocab_size} tokens: each token drawn from a table indexed by the "
        f"previous {language.n - 1} token(s) (lower orders at the start); tables random ({recipe})."
    )


def _size_category(num_rows: int) -> str:
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")]
    bounds += [(10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]
    return next((label for bound, label in bounds if num_rows < bound), "n>100M")
