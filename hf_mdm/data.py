"""A `datasets` builder for the synthetic languages of `hf_mdm.languages`, and a helper that pushes them to the Hub.

The builder is used directly (datasets 5 no longer runs dataset scripts):

```python
>>> import torch
>>> from hf_mdm.data import SyntheticLanguageBuilder, load_language_from_dataset
>>> builder = SyntheticLanguageBuilder(config_name="ngram2", length=64, num_train=1000, num_validation=100)
>>> builder.download_and_prepare()
>>> dataset = builder.as_dataset()  # DatasetDict with train / validation / test, one column `input_ids`
>>> language = load_language_from_dataset(dataset)  # the language the sequences were sampled from
>>> bool(language.in_support(torch.tensor(dataset["train"]["input_ids"][:8])).all())
True
```

Where the language parameters live: every split's `DatasetInfo.description` ends with one line
`hf_mdm synthetic language: {json}` holding the language's `to_config()`, the builder parameters and the code
versions. The description travels with `as_dataset`, `save_to_disk` / `load_from_disk`, `map` and, through the
`dataset_info` entries of the README that `push_synthetic_datasets` writes, with `load_dataset(repo_id, config)`.
`load_language_from_dataset` reads it back. A pushed repository also holds the exact matrices in
`languages/<config>/` (`save_pretrained` output), loadable with `hf_mdm.languages.load_language`.
"""

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import datasets
import numpy as np
import pyarrow as pa
import torch
from datasets.builder import Key
from datasets.fingerprint import Hasher
from huggingface_hub import CommitInfo, CommitOperationAdd, DatasetCard, HfApi

from . import __version__
from .dataset_card import DATASET_CARD_TEMPLATE, render_dataset_card  # noqa: F401  (public here too)
from .languages import (
    LANGUAGE_CONFIG_NAME,
    LANGUAGE_KINDS,
    LANGUAGE_WEIGHTS_NAME,
    PAPER_CITATION,
    REQUIRED_PARAMETERS,
    SyntheticLanguage,
    build_language,
    load_language,
)

#: Bump when the way sequences are drawn or stored changes (seeding, chunking, columns): it is part of the cache key.
DATA_FORMAT_VERSION = 1
#: Each split draws from its own random stream, so the validation data does not depend on ``num_train``.
SPLIT_STREAMS = {"train": 0, "validation": 1, "test": 2}
#: The default number of tokens generated at once (``chunk_size = max(1, TOKENS_PER_CHUNK // length)`` rows).
TOKENS_PER_CHUNK = 1 << 21
#: The line of ``DatasetInfo.description`` that carries the language and builder parameters as JSON.
METADATA_PREFIX = "hf_mdm synthetic language: "
#: The dataset card template rendered by ``push_synthetic_datasets``.
DEFAULT_PUSH_CONFIGS = ("ngram2", "ngram3", "ngram4", "hmm", "chain")

FEATURES = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
_DATA_FIELDS = (
    "language_kind",
    "vocab_size",
    "n",
    "num_states",
    "concentration",
    "prune_threshold",
    "language_seed",
    "length",
    "num_train",
    "num_validation",
    "num_test",
    "seed",
)
_LANGUAGE_PARAMETERS = {
    "ngram": ("vocab_size", "n", "concentration", "prune_threshold"),
    "hmm": ("vocab_size", "num_states", "concentration", "prune_threshold"),
    "chain": ("vocab_size",),
}


@dataclass
class SyntheticLanguageConfig(datasets.BuilderConfig):
    """Which language to sample from, and how many sequences of which length.

    Args:
        language_kind (`str`): `"ngram"`, `"hmm"` or `"chain"` (the Theorem 4.4 language, 16 tokens, no parameters).
        vocab_size (`int`): number of tokens (16 for `"chain"`).
        n (`int`, *optional*): order of an n-gram language.
        num_states (`int`, *optional*): number of hidden states of an HMM language.
        concentration (`float`, *optional*): Dirichlet concentration of every stochastic row (random languages).
        prune_threshold (`float`, *optional*): row entries below it are zeroed (the largest kept), then renormalised.
        language_seed (`int`): seed of the random language parameters.
        length (`int`): tokens per sequence.
        num_train, num_validation, num_test (`int`): sequences per split; a split of size 0 is left out.
        seed (`int`): seed of the sampled sequences (each split and each chunk has its own stream derived from it).
        chunk_size (`int`, *optional*): sequences generated and written at once; defaults to
            `max(1, TOKENS_PER_CHUNK // length)`. It changes the random streams, so it is part of the cache key.
    """

    language_kind: str = "ngram"
    vocab_size: Optional[int] = None
    n: Optional[int] = None
    num_states: Optional[int] = None
    concentration: Optional[float] = None
    prune_threshold: Optional[float] = None
    language_seed: int = 0
    length: int = 512
    num_train: int = 1_000_000
    num_validation: int = 10_000
    num_test: int = 10_000
    seed: int = 0
    chunk_size: Optional[int] = None

    @property
    def rows_per_chunk(self) -> int:
        """The resolved ``chunk_size``."""
        return self.chunk_size if self.chunk_size is not None else max(1, TOKENS_PER_CHUNK // max(self.length, 1))

    def split_sizes(self) -> Dict[str, int]:
        """``{"train": num_train, "validation": num_validation, "test": num_test}``."""
        return {"train": self.num_train, "validation": self.num_validation, "test": self.num_test}

    def data_parameters(self) -> Dict[str, Any]:
        """Every parameter that changes the generated data (the cache key, with the code versions)."""
        return {**{name: getattr(self, name) for name in _DATA_FIELDS}, "chunk_size": self.rows_per_chunk}

    def create_config_id(self, config_kwargs: dict, custom_features: Optional[datasets.Features] = None) -> str:
        """``<name>-<hash>`` of ``data_parameters()``, ``hf_mdm.__version__`` and ``DATA_FORMAT_VERSION``.

        Unlike the default (the name plus the keyword overrides only), the hash covers the resolved parameters, so
        two builders share a cache directory exactly when they would write the same data.
        """
        key = {"data": self.data_parameters(), "hf_mdm": __version__, "data_format": DATA_FORMAT_VERSION}
        if custom_features is not None:
            key["features"] = custom_features.to_dict()
        return f"{self.name}-{Hasher.hash(key)}"

    def validate(self) -> None:
        """Raises a ValueError that says what to change when the parameters do not describe a language and sizes."""
        if self.language_kind not in LANGUAGE_KINDS:
            raise ValueError(f"language_kind must be one of {LANGUAGE_KINDS}, got {self.language_kind!r}.")
        allowed = _LANGUAGE_PARAMETERS[self.language_kind]
        for name in ("vocab_size", "n", "num_states", "concentration", "prune_threshold"):
            if name not in allowed and getattr(self, name) is not None:
                raise ValueError(f"{name} is not a parameter of a {self.language_kind!r} language; leave it unset.")
        for name in REQUIRED_PARAMETERS[self.language_kind]:
            if getattr(self, name) is None:
                raise ValueError(f"A {self.language_kind!r} language needs {name}; pass {name}=...")
        if self.language_kind == "chain" and self.vocab_size not in (None, 16):
            raise ValueError(f"The chain language has exactly 16 tokens; got vocab_size={self.vocab_size}.")
        if self.length < 1:
            raise ValueError(f"length must be >= 1, got {self.length}.")
        if min(self.split_sizes().values()) < 0 or sum(self.split_sizes().values()) == 0:
            raise ValueError(f"Split sizes must be >= 0 and not all 0, got {self.split_sizes()}.")
        if self.seed < 0 or self.language_seed < 0:
            raise ValueError(f"seed and language_seed must be >= 0, got {self.seed} and {self.language_seed}.")
        if self.rows_per_chunk < 1 or self.rows_per_chunk * self.length >= 2**31:
            raise ValueError(f"chunk_size * length must be in [1, 2**31); got chunk_size={self.rows_per_chunk}.")

    def build_language(self) -> SyntheticLanguage:
        """The language these parameters describe, from ``hf_mdm.languages.build_language`` (deterministic: random
        languages come from ``language_seed``; unset ``concentration`` and ``prune_threshold`` take the defaults
        ``DEFAULT_CONCENTRATION`` and ``DEFAULT_PRUNE_THRESHOLD``)."""
        if self.language_kind == "chain":  # no parameters: vocab_size is 16 or unset (see `validate`)
            return build_language("chain")
        names = _LANGUAGE_PARAMETERS[self.language_kind]
        params = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        return build_language(self.language_kind, seed=self.language_seed, **params)


def _builder_config(name: str, description: str, **params: Any) -> SyntheticLanguageConfig:
    """One of the named configurations, at the current ``DATA_FORMAT_VERSION``, with 16 tokens."""
    version = datasets.Version(f"{DATA_FORMAT_VERSION}.0.0")
    return SyntheticLanguageConfig(name=name, version=version, description=description, vocab_size=16, **params)


def _ngram_config(n: int) -> SyntheticLanguageConfig:
    description = f"A random {n}-gram language over 16 tokens (Theorem 4.2: TER needs O(1) steps)."
    return _builder_config(
        f"ngram{n}", description, language_kind="ngram", n=n, concentration=0.5, prune_threshold=0.01
    )


class SyntheticLanguageBuilder(datasets.ArrowBasedBuilder):
    """Sequences sampled i.i.d. from a synthetic language, in `train`, `validation` and `test` splits.

    One column, `input_ids` (a list of int32 token ids in `[0, vocab_size)`, all of the same `length`).

    Configurations (the paper did not publish its parameters; these are ours):

    | config | language | parameters |
    | --- | --- | --- |
    | `ngram2`, `ngram3`, `ngram4` | `NGramLanguage.random` | vocab_size 16, n 2/3/4, concentration 0.5, prune 0.01 |
    | `hmm` | `HMMLanguage.random` | num_states 16, vocab_size 16, concentration 0.5, prune 0.1 |
    | `chain` | `ChainLanguage()` | the 16-token language of Theorem 4.4 |

    (all with `language_seed` 0; "prune" is `prune_threshold`)

    With 16 tokens, concentration 0.5 and threshold 0.01 the pruning removes about 30% of the entries of a row of an
    n-gram table, so that changing one token of a sample makes it impossible 50% (n = 2) to 72% (n = 4) of the time;
    an HMM needs the stronger 0.1 for the same effect (about 68%), since a token pair is impossible only if no path
    of hidden states explains it. Entropies at length 64: about 1.94, 2.03, 2.04 and 1.77 nats per token.

    Sizes default to the paper's (1,000,000 training, 10,000 validation and 10,000 test sequences of 512 tokens:
    about 2 GB on disk); override them, and any language parameter, with keyword arguments: `length`, `num_train`,
    `num_validation`, `num_test`, `seed` (of the samples), `language_seed` (of the language), `vocab_size`, `n`,
    `num_states`, `concentration`, `prune_threshold`, `chunk_size`.

    Generation streams to disk in chunks of `chunk_size` sequences (each an Arrow table written straight away), with
    datasets' progress bar; `download_and_prepare(num_proc=k)` spreads the chunks over k processes with the same
    result. The data are deterministic: chunk `c` of split `s` is `language.sample(rows, length, generator)` with
    `generator` seeded from `numpy.random.SeedSequence([seed, SPLIT_STREAMS[s], c])`. The cache directory is keyed
    on every parameter that changes the data and on the code versions (see `SyntheticLanguageConfig.create_config_id`).

    Example:

    ```python
    >>> from hf_mdm.data import SyntheticLanguageBuilder
    >>> builder = SyntheticLanguageBuilder(config_name="hmm", length=128, num_train=10_000, cache_dir="/tmp/synthetic")
    >>> builder.download_and_prepare()
    >>> train = builder.as_dataset(split="train").with_format("torch")
    >>> builder.language.log_prob(train[:4]["input_ids"])  # exact log-likelihoods under the true language
    >>> stream = builder.as_streaming_dataset(split="train")  # or generate on the fly, without writing anything
    ```
    """

    BUILDER_CONFIG_CLASS = SyntheticLanguageConfig
    BUILDER_CONFIGS = [
        _ngram_config(2),
        _ngram_config(3),
        _ngram_config(4),
        _builder_config(
            "hmm",
            "A random HMM over 16 tokens with 16 hidden states (SER experiments).",
            language_kind="hmm",
            num_states=16,
            concentration=0.5,
            prune_threshold=0.1,
        ),
        _builder_config(
            "chain",
            "The Theorem 4.4 language: 16 tokens (u, v), the next u equals the previous v.",
            language_kind="chain",
        ),
    ]
    DEFAULT_CONFIG_NAME = "ngram2"
    config: SyntheticLanguageConfig

    def __init__(self, *, dataset_name: str = "synthetic_languages", **kwargs: Any) -> None:
        self._language: Optional[SyntheticLanguage] = None
        super().__init__(dataset_name=dataset_name, **kwargs)

    @property
    def language(self) -> SyntheticLanguage:
        """The language the sequences are sampled from (built once, from the configuration)."""
        if self._language is None:
            self._language = self.config.build_language()
        return self._language

    def _info(self) -> datasets.DatasetInfo:
        self.config.validate()
        splits = datasets.SplitDict(dataset_name=self.dataset_name)
        for split, size in self.config.split_sizes().items():
            if size > 0:
                splits.add(datasets.SplitInfo(name=split, num_examples=size))
        return datasets.DatasetInfo(
            description=_describe(self.config, self.language),
            features=FEATURES,
            splits=splits,  # the expected sizes: progress-bar totals, checked after generation
            homepage="https://arxiv.org/abs/2502.09622",
            citation=PAPER_CITATION,
            license="apache-2.0",
        )

    def _split_generators(self, dl_manager: Any) -> List[datasets.SplitGenerator]:
        return [
            datasets.SplitGenerator(name=split, gen_kwargs={"split": split, "chunks": self._chunks(size)})
            for split, size in self.config.split_sizes().items()
            if size > 0
        ]

    def _chunks(self, num_rows: int) -> List[Tuple[int, int]]:
        """``(chunk index, rows)`` pairs covering ``num_rows``; the list is what ``num_proc`` shares out."""
        rows = self.config.rows_per_chunk
        return [(c, min(rows, num_rows - c * rows)) for c in range(math.ceil(num_rows / rows))]

    def _generate_tables(self, split: str, chunks: Sequence[Tuple[int, int]]) -> Iterator[Tuple[Key, pa.Table]]:
        for index, (chunk, rows) in enumerate(chunks):
            generator = chunk_generator(self.config.seed, split, chunk)
            yield Key(index, 0), _to_table(self.language.sample(rows, self.config.length, generator))


def chunk_generator(seed: int, split: str, chunk: int) -> torch.Generator:
    """The generator of chunk ``chunk`` of ``split``: independent streams from one ``seed``."""
    state = np.random.SeedSequence([seed, SPLIT_STREAMS[split], chunk]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def _to_table(x: torch.LongTensor) -> pa.Table:
    """A ``(rows, length)`` tensor as a one-column Arrow table, without going through Python lists."""
    rows, length = x.shape
    offsets = pa.array(np.arange(0, rows * length + 1, length, dtype=np.int32))
    values = pa.array(x.to(torch.int32).reshape(-1).numpy())
    return pa.Table.from_arrays([pa.ListArray.from_arrays(offsets, values)], schema=FEATURES.arrow_schema)


# ----------------------------------------------------------------------------------------------------------------
# The language parameters inside a dataset.


def _describe(config: SyntheticLanguageConfig, language: SyntheticLanguage) -> str:
    metadata = {
        "config_name": config.name,
        "language": language.to_config(),
        "parameters": config.data_parameters(),
        "hf_mdm_version": __version__,
        "data_format_version": DATA_FORMAT_VERSION,
    }
    summary = (
        f"Sequences of {config.length} tokens sampled i.i.d. from {language!r} (hf_mdm {__version__}, configuration "
        f"{config.name!r}). Recover the language with hf_mdm.data.load_language_from_dataset(dataset)."
    )
    return f"{summary}\n{METADATA_PREFIX}{json.dumps(metadata, sort_keys=True)}"


DatasetLike = Union[datasets.Dataset, datasets.DatasetDict, datasets.IterableDataset, datasets.IterableDatasetDict]


def synthetic_metadata(dataset: Union[DatasetLike, str, os.PathLike]) -> Dict[str, Any]:
    """The metadata a synthetic dataset carries: `config_name`, `language` (its `to_config()`), `parameters`
    (`SyntheticLanguageConfig.data_parameters()`), `hf_mdm_version` and `data_format_version`.

    Args:
        dataset: a `Dataset` / `DatasetDict` (also streaming) from `SyntheticLanguageBuilder.as_dataset`,
            `load_from_disk` or `load_dataset` of a repository written by `push_synthetic_datasets`, or the path of a
            `save_to_disk` directory.
    """
    if isinstance(dataset, (str, os.PathLike)):
        dataset = datasets.load_from_disk(os.fspath(dataset))
    if isinstance(dataset, dict):  # DatasetDict and IterableDatasetDict
        found = {json.dumps(synthetic_metadata(split), sort_keys=True) for split in dataset.values()}
        if len(found) != 1:
            raise ValueError(f"The splits of this DatasetDict carry {len(found)} different languages; pick one split.")
        return json.loads(found.pop())
    for line in (dataset.info.description or "").splitlines():
        if line.startswith(METADATA_PREFIX):
            return json.loads(line[len(METADATA_PREFIX) :])
    raise ValueError(
        f"This dataset carries no language: its info.description has no line starting with {METADATA_PREFIX!r}. "
        "Datasets made by SyntheticLanguageBuilder or pushed by push_synthetic_datasets have one."
    )


def load_language_from_dataset(dataset: Union[DatasetLike, str, os.PathLike]) -> SyntheticLanguage:
    """The language a synthetic dataset was sampled from (see `synthetic_metadata` for what `dataset` may be).

    Random languages are regenerated from their seed, which gives the same matrices with the same torch version; a
    pushed repository also holds the matrices themselves in `languages/<config>/` (load them with `load_language`).

    Example:

    ```python
    >>> from datasets import load_dataset
    >>> dataset = load_dataset("<user>/hf-mdm-synthetic", "ngram2")
    >>> language = load_language_from_dataset(dataset)
    ```
    """
    return load_language(synthetic_metadata(dataset)["language"])


# ----------------------------------------------------------------------------------------------------------------
# Pushing to the Hub.


def push_synthetic_datasets(
    repo_id: str,
    configs: Sequence[str] = DEFAULT_PUSH_CONFIGS,
    *,
    token: Optional[str] = None,
    private: bool = False,
    cache_dir: Optional[str] = None,
    num_proc: Optional[int] = None,
    max_shard_size: Optional[Union[int, str]] = None,
    license: str = "apache-2.0",
    template_path: Optional[Union[str, os.PathLike]] = None,
    **overrides: Any,
) -> CommitInfo:
    """Builds the given configurations and pushes them to one dataset repository, one Hub config per language.

    Each configuration is pushed with `DatasetDict.push_to_hub(repo_id, config_name=name)` (Parquet shards under
    `<name>/<split>-*.parquet`, the first configuration the default one). A last commit adds the dataset card,
    rendered from `model_cards/synthetic_dataset.md`, whose `dataset_info` entries carry the language parameters
    (so `load_language_from_dataset(load_dataset(repo_id, name))` works), and each language's exact matrices in
    `languages/<name>/` (`language_config.json` and `language.safetensors`).

    Args:
        repo_id: the dataset repository, `<user or org>/<name>`; created if needed.
        configs: names of `SyntheticLanguageBuilder.BUILDER_CONFIGS` to push.
        token, private: as in `HfApi.create_repo` / `push_to_hub`.
        cache_dir, num_proc: where and with how many processes the data are generated.
        max_shard_size: Parquet shard size, as in `push_to_hub`.
        license: the card's license.
        template_path: another card template (Jinja2), if not the packaged one.
        **overrides: builder keyword overrides applied to every configuration, e.g. `length=256, num_train=100_000`.

    Returns:
        The `CommitInfo` of the last commit (card and language files).

    Example:

    ```python
    >>> push_synthetic_datasets("<user>/hf-mdm-synthetic", configs=["ngram2", "hmm"], length=512)
    ```
    """
    if not configs:
        raise ValueError("configs is empty: name at least one of " + ", ".join(DEFAULT_PUSH_CONFIGS) + ".")
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True).repo_id
    builders = [SyntheticLanguageBuilder(config_name=name, cache_dir=cache_dir, **overrides) for name in configs]
    for index, builder in enumerate(builders):
        builder.download_and_prepare(num_proc=num_proc)
        builder.as_dataset().push_to_hub(
            repo_id,
            config_name=builder.config.name,
            set_default=index == 0,
            commit_message=f"Upload {builder.config.name} (hf_mdm {__version__})",
            token=token,
            private=private,
            max_shard_size=max_shard_size,
        )
    card = render_dataset_card(repo_id, builders, _pushed_card(api, repo_id), license, template_path)
    operations = [CommitOperationAdd("README.md", str(card).encode())]
    for builder in builders:
        operations += _language_files(builder.config.name, builder.language)
    return api.create_commit(
        repo_id,
        operations,
        commit_message="Add the dataset card and the language parameters",
        repo_type="dataset",
    )


def _pushed_card(api: HfApi, repo_id: str) -> DatasetCard:
    """The README that `push_to_hub` wrote (its `configs` and `dataset_info` metadata are kept)."""
    return DatasetCard.load(api.hf_hub_download(repo_id, "README.md", repo_type="dataset"))


def _language_files(name: str, language: SyntheticLanguage) -> List[CommitOperationAdd]:
    with tempfile.TemporaryDirectory() as directory:
        language.save_pretrained(directory)
        return [
            CommitOperationAdd(f"languages/{name}/{filename}", Path(directory, filename).read_bytes())
            for filename in (LANGUAGE_CONFIG_NAME, LANGUAGE_WEIGHTS_NAME)
        ]
