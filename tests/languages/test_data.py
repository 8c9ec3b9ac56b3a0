"""The synthetic-language datasets builder and the Hub push helper (with the Hub replaced by a local folder)."""

import contextlib
import json
import types
from pathlib import Path
from unittest import mock

import datasets
import pytest
import torch
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from huggingface_hub import CommitInfo, CommitOperationDelete, DatasetCard, HfApi, RepoUrl
from huggingface_hub.hf_api import RepoFile

import hf_mdm.data
from hf_mdm.data import (
    SyntheticLanguageBuilder,
    chunk_generator,
    load_language_from_dataset,
    push_synthetic_datasets,
    synthetic_metadata,
)
from hf_mdm.languages import ChainLanguage, HMMLanguage, NGramLanguage, load_language

TINY = {"length": 12, "num_train": 40, "num_validation": 10, "num_test": 6}
SPLITS = ("train", "validation", "test")
EXPECTED_LANGUAGES = {
    "ngram2": lambda: NGramLanguage.random(16, 2, 0, concentration=0.5, prune_threshold=0.01),
    "ngram3": lambda: NGramLanguage.random(16, 3, 0, concentration=0.5, prune_threshold=0.01),
    "ngram4": lambda: NGramLanguage.random(16, 4, 0, concentration=0.5, prune_threshold=0.01),
    "hmm": lambda: HMMLanguage.random(16, 16, 0, concentration=0.5, prune_threshold=0.1),
    "chain": ChainLanguage,
}


def build(tmp_path: Path, config_name: str = "ngram2", **overrides) -> SyntheticLanguageBuilder:
    builder = SyntheticLanguageBuilder(config_name=config_name, cache_dir=str(tmp_path), **{**TINY, **overrides})
    builder.download_and_prepare()
    return builder


def ids(dataset: datasets.Dataset) -> torch.LongTensor:
    return torch.tensor(dataset["input_ids"][:])


@pytest.mark.parametrize("config_name", sorted(EXPECTED_LANGUAGES))
def test_configs_sizes_support_and_language(tmp_path, config_name):
    builder = build(tmp_path, config_name)
    data = builder.as_dataset()
    assert {split: data[split].num_rows for split in data} == {"train": 40, "validation": 10, "test": 6}
    assert data["train"].features == datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    expected = EXPECTED_LANGUAGES[config_name]()
    assert builder.language.to_config() == expected.to_config()
    for split in SPLITS:
        x = ids(data[split])
        assert x.shape == (data[split].num_rows, 12)
        assert bool(builder.language.in_support(x).all())
        torch.testing.assert_close(builder.language.log_prob(x), expected.log_prob(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "config, spec",
    [
        ({"language_kind": "ngram", "vocab_size": 4, "n": 2}, {"kind": "ngram", "vocab_size": 4, "n": 2}),
        (
            {"language_kind": "ngram", "vocab_size": 4, "n": 3, "language_seed": 2, "prune_threshold": 0.0},
            {"kind": "ngram", "vocab_size": 4, "n": 3, "seed": 2, "prune_threshold": 0.0, "train": True},
        ),
        (
            {"language_kind": "hmm", "vocab_size": 6, "num_states": 4, "language_seed": 1, "concentration": 1.0},
            {"kind": "hmm", "vocab_size": 6, "num_states": 4, "seed": 1, "concentration": 1.0, "name": "hmm"},
        ),
        ({"language_kind": "chain", "vocab_size": 16}, {"kind": "chain", "name": "chain"}),
    ],
)
def test_builder_and_experiments_build_the_same_language(config, spec):
    """One builder (hf_mdm.languages.build_language) behind the datasets and the experiments' preset entries."""
    from hf_mdm.experiments import make_language

    ours = hf_mdm.data.SyntheticLanguageConfig(name="x", **config).build_language()
    theirs = make_language(spec)
    assert type(ours) is type(theirs) and ours.to_config() == theirs.to_config()
    assert ours.tensors().keys() == theirs.tensors().keys()
    assert all(torch.equal(ours.tensors()[k], theirs.tensors()[k]) for k in ours.tensors())


def test_same_arguments_give_identical_data_and_seeds_change_it(tmp_path):
    first, second = build(tmp_path / "a").as_dataset(), build(tmp_path / "b").as_dataset()
    for split in SPLITS:
        assert torch.equal(ids(first[split]), ids(second[split]))
    assert not torch.equal(ids(first["train"])[:10], ids(first["validation"]))  # splits use their own streams

    reseeded = build(tmp_path, seed=1)
    assert not torch.equal(ids(reseeded.as_dataset("train")), ids(first["train"]))
    assert reseeded.language.to_config() == build(tmp_path).language.to_config()  # same language, new samples

    other_language = build(tmp_path, language_seed=1)
    x = ids(first["train"])
    assert not torch.equal(other_language.language.log_prob(x), build(tmp_path).language.log_prob(x))

    more_training = build(tmp_path, num_train=80).as_dataset()
    assert torch.equal(ids(more_training["validation"]), ids(first["validation"]))


def test_chunked_generation_streams_chunks_in_order(tmp_path):
    builder = SyntheticLanguageBuilder(config_name="hmm", cache_dir=str(tmp_path), chunk_size=7, **TINY)
    sizes = []
    sample = builder.language.sample

    def spy(num, length, generator=None):
        sizes.append(num)
        return sample(num, length, generator)

    with mock.patch.object(builder.language, "sample", spy):
        builder.download_and_prepare()
    assert sizes == [7] * 5 + [5] + [7, 3] + [6]  # train 40, validation 10, test 6: never more than a chunk
    train = ids(builder.as_dataset("train"))
    chunks = [sample(n, 12, chunk_generator(0, "train", c)) for c, n in enumerate([7] * 5 + [5])]
    assert torch.equal(train, torch.cat(chunks))

    streamed = builder.as_streaming_dataset(split="train")  # generated on the fly, nothing written
    assert torch.equal(torch.tensor([row["input_ids"] for row in streamed]), train)


def test_num_proc_gives_the_same_data(tmp_path):
    serial = build(tmp_path / "serial", "ngram3", chunk_size=9)
    parallel_dir = str(tmp_path / "parallel")
    parallel = SyntheticLanguageBuilder(config_name="ngram3", cache_dir=parallel_dir, chunk_size=9, **TINY)
    parallel.download_and_prepare(num_proc=2)  # the 5 train chunks are shared out between two processes
    assert parallel.as_dataset("train").info.splits["train"].shard_lengths == [27, 13]
    for split in SPLITS:
        assert torch.equal(ids(parallel.as_dataset(split)), ids(serial.as_dataset(split)))


def test_cache_key_covers_every_parameter_and_the_code_version(tmp_path):
    def config_id(**overrides):
        builder = SyntheticLanguageBuilder(config_name="ngram2", cache_dir=str(tmp_path), **{**TINY, **overrides})
        return builder.config_id

    base = config_id()
    assert config_id() == base and base.startswith("ngram2-")
    changes = [
        {"length": 13},
        {"num_train": 41},
        {"num_validation": 11},
        {"num_test": 7},
        {"seed": 1},
        {"language_seed": 1},
        {"vocab_size": 8},
        {"n": 3},
        {"concentration": 0.3},
        {"prune_threshold": 0.02},
        {"chunk_size": 5},
    ]
    ids_ = [config_id(**change) for change in changes]
    assert base not in ids_ and len(set(ids_)) == len(changes)
    with mock.patch.object(hf_mdm.data, "__version__", "9.9.9"):
        assert config_id() != base
    with mock.patch.object(hf_mdm.data, "DATA_FORMAT_VERSION", 99):
        assert config_id() != base

    builder = build(tmp_path)  # prepared; a second builder with the same arguments reuses the files
    again = SyntheticLanguageBuilder(config_name="ngram2", cache_dir=str(tmp_path), **TINY)
    with mock.patch.object(SyntheticLanguageBuilder, "_generate_tables", side_effect=AssertionError("regenerated")):
        again.download_and_prepare()
    assert again.cache_dir == builder.cache_dir
    assert torch.equal(ids(again.as_dataset("test")), ids(builder.as_dataset("test")))


def test_language_recovered_from_prepared_and_saved_datasets(tmp_path):
    builder = build(tmp_path, "hmm")
    data = builder.as_dataset()
    x = ids(data["test"])
    expected = builder.language.log_prob(x)
    data.save_to_disk(str(tmp_path / "dict"))
    data["train"].save_to_disk(str(tmp_path / "train"))
    sources = [
        data,
        data["validation"],
        data["train"].map(lambda row: row),
        str(tmp_path / "dict"),
        tmp_path / "train",
        datasets.load_from_disk(str(tmp_path / "dict")),
        datasets.load_from_disk(str(tmp_path / "train")),
        builder.as_streaming_dataset(),
        builder.as_streaming_dataset(split="test"),
    ]
    for source in sources:
        language = load_language_from_dataset(source)
        assert isinstance(language, HMMLanguage)
        torch.testing.assert_close(language.log_prob(x), expected, rtol=0, atol=0)
    metadata = synthetic_metadata(data)
    assert metadata["config_name"] == "hmm" and metadata["parameters"]["length"] == 12

    with pytest.raises(ValueError, match="carries no language"):
        load_language_from_dataset(datasets.Dataset.from_dict({"input_ids": [[0, 1]]}))


def test_bad_configurations_say_what_to_change(tmp_path):
    with pytest.raises(ValueError, match="exactly 16 tokens"):
        SyntheticLanguageBuilder(config_name="chain", cache_dir=str(tmp_path), vocab_size=20)
    with pytest.raises(ValueError, match="num_states is not a parameter"):
        SyntheticLanguageBuilder(config_name="ngram2", cache_dir=str(tmp_path), num_states=4)
    with pytest.raises(ValueError, match="Split sizes"):
        SyntheticLanguageBuilder(config_name="ngram2", cache_dir=str(tmp_path), num_train=-1)
    with pytest.raises(ValueError, match="not found"):
        SyntheticLanguageBuilder(config_name="ngram5", cache_dir=str(tmp_path))


# ----------------------------------------------------------------------------------------------------------------
# push_synthetic_datasets against a fake Hub: HfApi's network methods and the HfFileSystem that datasets' push_to_hub
# reads the repository with are replaced by a local folder; everything else (Parquet shards, README merging) runs.

FAKE_SHA = "f" * 40


class FakeHub:
    """A dataset repository in a folder. ``commits`` records (message, sorted paths); ``preuploaded`` the paths."""

    def __init__(self, root: Path) -> None:
        self.root, self.commits, self.preuploaded, self._blobs = root, [], [], {}

    def repo(self, repo_id: str) -> Path:
        return self.root / "datasets" / f"{repo_id}@{FAKE_SHA}"  # where datasets' HfFileSystem paths point

    def files(self, repo_id: str) -> set:
        return {p.relative_to(self.repo(repo_id)).as_posix() for p in self.repo(repo_id).rglob("*") if p.is_file()}

    def patches(self) -> contextlib.ExitStack:
        hub = self
        stack = contextlib.ExitStack()

        def create_repo(self, repo_id, **kwargs):
            hub.repo(repo_id).mkdir(parents=True, exist_ok=True)
            return RepoUrl(f"https://huggingface.co/datasets/{repo_id}")

        def repo_info(self, repo_id, **kwargs):
            return types.SimpleNamespace(id=repo_id, sha=FAKE_SHA)

        def preupload_lfs_files(self, repo_id, additions, **kwargs):
            for addition in additions:  # the shard's temporary file is deleted once uploaded: keep its bytes
                with addition.as_file() as f:
                    hub._blobs[addition.path_in_repo] = f.read()
                hub.preuploaded.append(addition.path_in_repo)

        def create_commit(self, repo_id, operations, *, commit_message, **kwargs):
            operations = list(operations)
            for operation in operations:
                path = hub.repo(repo_id) / operation.path_in_repo
                if isinstance(operation, CommitOperationDelete):
                    path.unlink()
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                if operation.path_in_repo in hub._blobs:
                    path.write_bytes(hub._blobs.pop(operation.path_in_repo))
                else:
                    with operation.as_file() as f:
                        path.write_bytes(f.read())
            hub.commits.append((commit_message, sorted(op.path_in_repo for op in operations)))
            url = f"https://huggingface.co/datasets/{repo_id}/commit/{FAKE_SHA}"
            return CommitInfo(commit_url=url, commit_message=commit_message, commit_description="", oid=FAKE_SHA)

        def hf_hub_download(self, repo_id, filename, **kwargs):
            return str(hub.repo(repo_id) / filename)

        def list_repo_tree(self, repo_id, **kwargs):  # what older datasets list the repository with
            for path in sorted(hub.repo(repo_id).rglob("*")):
                if path.is_file():
                    yield RepoFile(
                        path=path.relative_to(hub.repo(repo_id)).as_posix(), size=path.stat().st_size, oid=FAKE_SHA
                    )

        for name, fake in [
            ("create_repo", create_repo),
            ("repo_info", repo_info),
            ("preupload_lfs_files", preupload_lfs_files),
            ("create_commit", create_commit),
            ("hf_hub_download", hf_hub_download),
            ("list_repo_tree", list_repo_tree),
        ]:
            stack.enter_context(mock.patch.object(HfApi, name, fake))
        local = DirFileSystem(path=str(self.root), fs=LocalFileSystem())
        if hasattr(datasets.dataset_dict, "HfFileSystem"):  # newer datasets read the repo's files through it
            stack.enter_context(mock.patch("datasets.dataset_dict.HfFileSystem", lambda **kwargs: local))
        return stack


def test_push_uploads_one_config_per_language_with_card_and_parameters(tmp_path):
    hub, repo_id, configs = FakeHub(tmp_path / "hub"), "user/hf-mdm-synthetic", ["ngram2", "hmm", "chain"]
    with hub.patches():
        info = push_synthetic_datasets(repo_id, configs, cache_dir=str(tmp_path / "cache"), **TINY)
    assert info.oid == FAKE_SHA
    assert not hub._blobs  # every preuploaded shard was committed

    parquet = [f"{name}/{split}-00000-of-00001.parquet" for name in configs for split in SPLITS]
    files = ("language_config.json", "language.safetensors")
    languages = [f"languages/{name}/{file}" for name in configs for file in files]
    assert hub.preuploaded == parquet
    uploads = [
        (f"Upload {name} (hf_mdm {hf_mdm.__version__})", sorted(["README.md", *parquet[3 * i : 3 * i + 3]]))
        for i, name in enumerate(configs)
    ]
    card_commit = ("Add the dataset card and the language parameters", sorted(["README.md", *languages]))
    assert hub.commits == [*uploads, card_commit]
    assert hub.files(repo_id) == {"README.md", *parquet, *languages}

    card = DatasetCard.load(hub.repo(repo_id) / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0" and {"synthetic", "arxiv:2502.09622"} <= set(data["tags"])
    assert data["size_categories"] == ["n<1K"] and data["pretty_name"] == "hf_mdm synthetic languages"
    assert {c["config_name"]: c["data_files"] for c in data["configs"]} == {
        name: [{"split": split, "path": f"{name}/{split}-*"} for split in SPLITS] for name in configs
    }
    assert [c["config_name"] for c in data["configs"] if c.get("default")] == ["ngram2"]
    infos = {entry["config_name"]: entry for entry in data["dataset_info"]}
    for name in configs:
        builder = SyntheticLanguageBuilder(config_name=name, cache_dir=str(tmp_path / "cache"), **TINY)
        language, entropy = builder.language, builder.language.expected_nll(TINY["length"])
        assert infos[name]["description"] == builder.info.description
        sizes = [(split["name"], split["num_examples"]) for split in infos[name]["splits"]]
        assert sizes == [("train", 40), ("validation", 10), ("test", 6)]
        assert f"### `{name}`" in card.text and f"`{json.dumps(language.to_config(), sort_keys=True)}`" in card.text
        assert f"{entropy.per_token(TINY['length']):.6f} nats" in card.text
        assert f"{entropy.ter(TINY['length']):.6f}" in card.text

        # what a user gets back: the rows, the language from the rows' info, and the saved matrices
        pushed = datasets.load_dataset(str(hub.repo(repo_id)), name, cache_dir=str(tmp_path / "load"))
        x = ids(pushed["train"])
        assert torch.equal(x, ids(builder.as_dataset("train")))
        recovered = load_language_from_dataset(pushed)
        torch.testing.assert_close(recovered.log_prob(x), language.log_prob(x), rtol=0, atol=0)
        saved = load_language(hub.repo(repo_id) / "languages" / name)
        torch.testing.assert_close(saved.log_prob(x), language.log_prob(x), rtol=0, atol=0)
    assert "(Monte Carlo, standard error" in card.text and "(exact)" in card.text  # the HMM's entropy is estimated
