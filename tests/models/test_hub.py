"""Model cards and the Hub push: the exact files and card metadata that would be uploaded (network mocked); a push
without the Hub is one line saying nothing was uploaded."""

from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from remote_code import exported_files  # noqa: E402
from transformers import LlamaForCausalLM

from hf_mdm import MDMForMaskedDiffusion, cli
from hf_mdm.hub import CardResult, model_card, push_model
from hf_mdm.training import ar_config_for, mdm_config_for


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return MDMForMaskedDiffusion(mdm_config_for(8, 16)), LlamaForCausalLM(ar_config_for(8, 16))


def card_metadata(card: ModelCard) -> dict:
    return yaml.safe_load(str(card).split("---")[1])


def test_mdm_card_carries_results_as_model_index(models):
    mdm, _ = models
    results = [CardResult("ter", 3.21, "steps=64, stochastic, random"), CardResult("ser", 0.12, "steps=64")]
    card = model_card(mdm, "org/mdm-2gram", training_config={"learning_rate": 3e-4, "epochs": 1}, results=results)
    meta = card_metadata(card)
    assert meta["license"] == "apache-2.0" and "masked-diffusion" in meta["tags"]
    index = meta["model-index"][0]
    assert index["name"] == "mdm-2gram"
    metrics = {m["type"]: m for r in index["results"] for m in r["metrics"]}
    assert metrics["ter"]["value"] == 3.21 and metrics["ser"]["value"] == 0.12
    assert metrics["ter"]["config"] == "steps=64, stochastic, random"
    text = str(card)
    assert "| learning_rate | 0.0003 |" in text and "| ter | steps=64, stochastic, random | 3.21 |" in text
    assert "mask_token_id | 8" in text and "schedule `linear`" in text


def test_cards_link_only_to_an_address_given(models):
    for model in models:
        text = str(model_card(model, "org/x"))
        assert "hf_mdm" in text and "github.com" not in text and "](http" not in text.split("arXiv")[0]
        linked = str(model_card(model, "org/x", project_url="https://example.org/hf_mdm"))
        assert "[hf_mdm](https://example.org/hf_mdm)" in linked


def test_ar_card(models):
    _, ar = models
    card = model_card(ar, "org/ar-2gram")
    meta = card_metadata(card)
    assert "autoregressive-baseline" in meta["tags"] and "model-index" not in meta
    assert "BOS token, id 8" in str(card) and "No evaluation recorded." in str(card)


def test_push_uploads_exact_files(models):
    mdm, _ = models
    captured = {}

    def fake_create_commit(self, repo_id, operations, **kwargs):
        captured["repo_id"] = repo_id
        captured["files"] = {
            op.path_in_repo: (
                op.path_or_fileobj if isinstance(op.path_or_fileobj, bytes) else open(op.path_or_fileobj, "rb").read()
            )
            for op in operations
            if isinstance(op, CommitOperationAdd)
        }
        captured["message"] = kwargs.get("commit_message")
        return "commit-info"

    with (
        mock.patch.object(HfApi, "create_repo") as create_repo,
        mock.patch.object(HfApi, "create_commit", fake_create_commit),
    ):
        out = push_model(mdm, "org/mdm-2gram", training_config={"steps": 10}, results=[{"metric": "ter", "value": 2.5}])
    assert out == "commit-info"
    create_repo.assert_called_once()
    assert captured["repo_id"] == "org/mdm-2gram"
    assert set(captured["files"]) == {
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "training_config.json",
    } | set(exported_files("modeling_mdm.py", "configuration_mdm.py"))
    assert b"model-index" in captured["files"]["README.md"]
    assert b'"AutoModelForMaskedLM": "modeling_mdm.MDMForMaskedDiffusion"' in captured["files"]["config.json"]
    assert "MDM" in captured["message"]


def test_a_block_diffusion_card_says_so_and_how_to_pick_the_block_size(models):
    mdm, _ = models
    block = MDMForMaskedDiffusion(mdm_config_for(8, 16, block_size=4))
    text = str(model_card(block, "org/bd"))
    assert "bidirectional inside each block of 4 positions" in text and "## Choosing a block size" in text
    assert "| block_size | 4 |" in text and "bidirectional attention, trained on the MDM ELBO" not in text
    plain = str(model_card(mdm, "org/mdm"))
    assert "Choosing a block size" not in plain and "bidirectional attention, trained on the MDM ELBO" in plain


@pytest.fixture
def saved_mdm(tmp_path) -> Path:
    from hf_mdm import MDMForMaskedDiffusion
    from hf_mdm.training import mdm_config_for

    MDMForMaskedDiffusion(mdm_config_for(4, 8)).save_pretrained(tmp_path / "mdm")
    return tmp_path / "mdm"


def _unreachable_errors():
    """The errors the installed huggingface_hub raises without a network: its HTTP client's (httpx2 from
    huggingface_hub 2.x, httpx before) and its offline mode's."""
    import importlib
    import importlib.util

    from huggingface_hub.errors import OfflineModeIsEnabled

    client = next(importlib.import_module(m) for m in ("httpx2", "httpx") if importlib.util.find_spec(m))
    request = client.Request("POST", "https://huggingface.co/api/repos/create")
    return [
        client.ConnectError("[Errno -3] Temporary failure in name resolution\nmore detail", request=request),
        client.ConnectTimeout("timed out", request=request),
        OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/repos/create: offline mode is enabled."),
    ]


@pytest.mark.parametrize("error", _unreachable_errors(), ids=lambda e: type(e).__name__)
def test_push_without_the_hub_says_so_in_one_line(saved_mdm, capsys, error):
    from huggingface_hub import HfApi

    with (
        mock.patch.object(HfApi, "create_repo", side_effect=error),
        mock.patch.object(HfApi, "create_commit") as commit,
    ):
        code = cli.main(["push", "--model", str(saved_mdm), "--repo-id", "you/mdm"])
    err = capsys.readouterr().err
    assert code == 2 and not commit.called
    last = err.splitlines()[-1]  # before it, only the loading progress bar
    assert last.startswith("hf-mdm: error: could not reach the Hugging Face Hub") and "nothing was uploaded" in last
    assert type(error).__name__ in last and "Traceback" not in err and "more detail" not in err


def test_push_still_raises_what_is_not_about_the_network(saved_mdm):
    from huggingface_hub import HfApi

    with mock.patch.object(HfApi, "create_repo", side_effect=RuntimeError("a bug")), pytest.raises(RuntimeError):
        cli.main(["push", "--model", str(saved_mdm), "--repo-id", "you/mdm"])
