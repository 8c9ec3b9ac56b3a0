"""Model cards and Hub uploads for trained MDMs and their AR baselines.

Cards are rendered from the templates in ``model_cards/`` with huggingface_hub's card tools; TER/SER results
become ``model-index`` eval results in the card metadata, so the Hub shows them. ``push_model`` uploads the
model (weights, config, generation config and, for hf_mdm models, the exported remote code), the language
definition when given, and the card, in one commit.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from huggingface_hub import CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import OfflineModeIsEnabled

from . import models  # noqa: F401  registers the LLaDA and Dream families
from .families import facts_of

MODEL_CARDS_DIR = Path(__file__).resolve().parent.parent / "model_cards"
ARCHITECTURE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "mask_token_id",
    "bos_token_id",
    "schedule",
    "block_size",
)


@dataclass
class CardResult:
    """One evaluation number for a card: ``metric`` ("ter", "ser", "relative_increase", ...), the sampler or
    decoding ``setting`` it was measured with, and the evaluation data set."""

    metric: str
    value: float
    setting: str = ""
    dataset_name: str = "synthetic language"
    dataset_type: str = "synthetic"

    def eval_result(self) -> EvalResult:
        return EvalResult(
            task_type="text-generation",
            dataset_type=self.dataset_type,
            dataset_name=self.dataset_name,
            metric_type=self.metric,
            metric_value=float(self.value),
            metric_config=self.setting or None,
        )


def is_mdm(model_or_config: Any) -> bool:
    """Whether a model (or its config) is a masked diffusion LM of a registered family (hf_mdm's own, LLaDA, Dream)
    with a [MASK] id."""
    from .loading import checkpoint_kind

    return checkpoint_kind(model_or_config) == "masked"


def describe_language(language: Any) -> str:
    """One paragraph about the training language from a language object or its ``to_config()`` dict."""
    if language is None:
        return "Not recorded."
    config = language if isinstance(language, dict) else language.to_config()
    params = ", ".join(f"{k}={v}" for k, v in sorted(config.items()) if k not in ("class", "format_version"))
    kind = config.get("class", type(language).__name__)
    return (
        f"Sequences sampled from a synthetic `{kind}` ({params}). The language's definition is uploaded with the "
        "model as `language/` and loads with `hf_mdm.languages.load_language`."
    )


#: The block-size section of a block diffusion model's card: what hf_mdm's `block_diffusion` experiment measured.
BLOCK_SIZE_ADVICE = (
    "Measured by hf_mdm's `block_diffusion` experiment (exact-posterior oracle and tiny trained models on synthetic "
    "languages; see the project's README and `results/block_diffusion.md`). Validity under a parallel stochastic "
    "sampler does not come from a small block size: with an exact model the paper's sampler errs at every b > 1 (on "
    "the chain language SER = 1 - (1 - 3/(4s))^(L - L/b) with s steps per block), and at the same number of steps "
    "more with smaller blocks; where sequences must be valid decode "
    'one token a step, or use `transfer="speculative"`, which keeps the model\'s left-to-right law at every b '
    "(with a trained model, its errors too) in fewer sequential forwards. Trained on the same data, block "
    "diffusion models ended closer to the data's entropy than the bidirectional MDM, and an AR model closer still. "
    "With the exact block cache a forward computes one block, so revealing several tokens a forward stayed faster "
    "than AR with its KV cache at every length measured (32 to 256), where the bidirectional MDM's lead shrank."
)


def model_card(
    model: Any,
    repo_id: str,
    language: Any = None,
    training_config: Optional[dict] = None,
    results: Sequence[Union[CardResult, dict]] = (),
    license: str = "apache-2.0",
    project_url: Optional[str] = None,
) -> ModelCard:
    """Render the MDM or AR-baseline card for ``model`` (picked from its model type); ``project_url``, when given,
    is where the card links "hf_mdm" to (no link otherwise)."""
    results = [r if isinstance(r, CardResult) else CardResult(**r) for r in results]
    mdm = is_mdm(model)
    model_name = repo_id.split("/")[-1]
    card_data = ModelCardData(
        license=license,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["hf_mdm", "masked-diffusion" if mdm else "autoregressive-baseline", "synthetic-language"],
        model_name=model_name,
        eval_results=[r.eval_result() for r in results] or None,
    )
    config = model.config
    architecture = {k: getattr(config, k) for k in ARCHITECTURE_FIELDS if getattr(config, k, None) is not None}
    vocab = int(getattr(config, "vocab_size", 2))
    template = MODEL_CARDS_DIR / ("mdm.md" if mdm else "ar_baseline.md")
    return ModelCard.from_template(
        card_data,
        template_path=str(template),
        model_name=model_name,
        repo_id=repo_id,
        num_parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        architecture=architecture,
        schedule=getattr(config, "schedule", "linear"),
        bos_token_id=getattr(config, "bos_token_id", None),
        data_description=describe_language(language),
        training_config=dict(training_config or {}),
        results=[r.__dict__ for r in results],
        example_prompt=", ".join(str(i % max(vocab - 1, 1)) for i in range(3)),
        example_new_tokens=32,
        example_steps=32,
        project_url=project_url,
        block_size=getattr(config, "block_size", None) if mdm else None,
        block_size_advice=BLOCK_SIZE_ADVICE,
    )


def save_for_hub(
    model: Any,
    folder: Union[str, Path],
    repo_id: str,
    language: Any = None,
    training_config: Optional[dict] = None,
    results: Sequence[Union[CardResult, dict]] = (),
    project_url: Optional[str] = None,
) -> Path:
    """Write everything ``push_model`` uploads into ``folder``: model files, ``language/``, ``README.md``."""
    folder = Path(folder)
    model.save_pretrained(folder)
    if language is not None and not isinstance(language, dict):
        language.save_pretrained(folder / "language")
    if training_config:
        (folder / "training_config.json").write_text(json.dumps(training_config, indent=2, default=str))
    model_card(model, repo_id, language, training_config, results, project_url=project_url).save(folder / "README.md")
    return folder


LLADA2_ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "partial_rotary_factor",
    "first_k_dense_replace",
    "num_experts",
    "num_experts_per_tok",
    "num_shared_experts",
    "n_group",
    "topk_group",
    "max_position_embeddings",
    "mask_token_id",
    "block_size",
)
_LLADA2_PRESETS = {"llada2_moe": ("LLaDA2.0", "llada2"), "llada21_moe": ("LLaDA2.1", "llada21")}


def llada2_card(
    model: Any,
    repo_id: str,
    base_model: Optional[str] = None,
    results: Sequence[Union[CardResult, dict]] = (),
    license: str = "apache-2.0",
    project_url: Optional[str] = None,
) -> ModelCard:
    """Render ``model_cards/llada2.md`` for a LLaDA2.0 / LLaDA2.1 checkpoint (``model``, native classes): its
    architecture, its published sampler's defaults (the family's `DiffusionFacts.sampler`), and harness results
    (``CardResult`` with the task as ``dataset_name``, e.g. accuracy and seconds per request of an ``hf-mdm compare``
    cell)."""
    config = model.config
    if config.model_type not in _LLADA2_PRESETS:
        raise ValueError(
            f"llada2_card renders LLaDA2.x checkpoints (llada2_moe, llada21_moe), got {config.model_type!r}"
        )
    family, preset = _LLADA2_PRESETS[config.model_type]
    results = [r if isinstance(r, CardResult) else CardResult(**r) for r in results]
    model_name = repo_id.split("/")[-1]
    card_data = ModelCardData(
        license=license,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["hf_mdm", "masked-diffusion", "block-diffusion", "mixture-of-experts"],
        model_name=model_name,
        base_model=base_model,
        eval_results=[r.eval_result() for r in results] or None,
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(MODEL_CARDS_DIR / "llada2.md"),
        model_name=model_name,
        repo_id=repo_id,
        base_model=base_model or model_name,
        family=family,
        model_type=config.model_type,
        preset=preset,
        block_size=config.block_size,
        num_parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        architecture={
            k: getattr(config, k) for k in LLADA2_ARCHITECTURE_FIELDS if getattr(config, k, None) is not None
        },
        sampler=dict(facts_of(model).sampler),
        results=[r.__dict__ for r in results],
        project_url=project_url,
    )


#: The HTTP libraries' errors for a Hub that cannot be reached (no network, DNS, proxy, time-out): httpx2 or httpx
#: for huggingface_hub >= 1.0, requests before it; those not installed are left out.
TRANSPORT_ERRORS = (
    ("httpx2", "TransportError"),
    ("httpx", "TransportError"),
    ("requests.exceptions", "ConnectionError"),
    ("requests.exceptions", "Timeout"),
)


def hub_unreachable_errors() -> tuple[type[BaseException], ...]:
    """The exception classes that mean the Hub could not be reached, nothing about the request itself: offline
    mode (``HF_HUB_OFFLINE``), connection errors and the installed HTTP libraries' ``TRANSPORT_ERRORS``."""
    errors: list[type[BaseException]] = [OfflineModeIsEnabled, ConnectionError, TimeoutError]
    for module, name in TRANSPORT_ERRORS:
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def push_model(
    model: Any,
    repo_id: str,
    language: Any = None,
    training_config: Optional[dict] = None,
    results: Sequence[Union[CardResult, dict]] = (),
    token: Optional[str] = None,
    private: bool = False,
    commit_message: Optional[str] = None,
    api: Optional[HfApi] = None,
    project_url: Optional[str] = None,
):
    """Upload a trained MDM or AR baseline with its card (and language definition) to the Hub in one commit;
    ``project_url``: the address the card links "hf_mdm" to (none by default).

    No tokenizer is uploaded: synthetic-language models read token ids directly.
    """
    api = api or HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with tempfile.TemporaryDirectory() as tmp:
        save_for_hub(model, tmp, repo_id, language, training_config, results, project_url)
        operations = [
            CommitOperationAdd(path_in_repo=path.relative_to(tmp).as_posix(), path_or_fileobj=str(path))
            for path in sorted(Path(tmp).rglob("*"))
            if path.is_file()
        ]
        return api.create_commit(
            repo_id=repo_id,
            operations=operations,
            repo_type="model",
            commit_message=commit_message or f"Upload {'MDM' if is_mdm(model) else 'AR baseline'} with hf_mdm",
        )
