"""generate runs under torch.inference_mode and hands back normal tensors (`hf_mdm.generation.outside_autograd`)."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from tiny_mdm import tiny_mdm
from transformers import LogitsProcessor, LogitsProcessorList

from hf_mdm.generation import MaskedDiffusionGenerateOutput, diffusion_generate, normal_tensors

SETTINGS = dict(max_new_tokens=8, steps=4, block_length=4, seed=0)


class ModeSpy(LogitsProcessor):
    """Notes, at each step, whether the step runs in inference mode and with autograd off."""

    def __init__(self) -> None:
        self.modes: list[tuple[bool, bool]] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return scores


def test_steps_run_in_inference_mode_whatever_the_caller_enabled() -> None:
    model, spy = tiny_mdm(), ModeSpy()
    with torch.enable_grad():
        model.generate(torch.tensor([[1, 2, 3]]), logits_processor=LogitsProcessorList([spy]), **SETTINGS)
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # the caller's mode is back
    assert spy.modes and set(spy.modes) == {(True, False)}


@pytest.mark.parametrize("kv_cache", [None, "dual"])
def test_outputs_enter_autograd(kv_cache) -> None:
    """Every tensor of the output is a normal tensor: the ids can be a training step's input and the scores a factor
    of a loss (a product keeps its inputs for backward, which an inference tensor refuses)."""
    model = tiny_mdm()
    out = model.generate(
        torch.tensor([[1, 2, 3], [4, 5, 6]]), kv_cache=kv_cache, return_dict_in_generate=True, output_scores=True,
        output_logits=True, output_history=True, **SETTINGS,
    )  # fmt: skip
    tensors = [out.sequences, *out.scores, *out.logits, *out.history]
    assert tensors and not any(t.is_inference() for t in tensors)
    model.train()
    loss = model(input_ids=out.sequences, labels=out.sequences).loss * out.scores[0].softmax(-1).mean()
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_free_function_and_plain_tensor_output() -> None:
    ids = diffusion_generate(tiny_mdm(), torch.tensor([[1, 2, 3]]), **SETTINGS)
    assert not ids.is_inference() and ids.shape == (1, 11)


class Pair(NamedTuple):
    first: torch.Tensor
    second: int


def test_normal_tensors_walks_containers() -> None:
    with torch.inference_mode():
        a, b, c = torch.ones(2), torch.zeros(3), torch.arange(4)
    normal = torch.ones(1)
    out = normal_tensors({"x": [a, (b, Pair(c, 7))], "y": normal, "z": "text"})
    assert not out["x"][0].is_inference() and not out["x"][1][0].is_inference()
    assert isinstance(out["x"][1][1], Pair) and out["x"][1][1].second == 7 and not out["x"][1][1].first.is_inference()
    assert torch.equal(out["x"][1][1].first, c) and out["y"] is normal and out["z"] == "text"
    output = normal_tensors(MaskedDiffusionGenerateOutput(sequences=a, nfe=3))
    assert not output.sequences.is_inference() and not output[0].is_inference() and output.nfe == 3
