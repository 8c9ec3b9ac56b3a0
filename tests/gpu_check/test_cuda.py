"""On CUDA (``make test-cuda``; ``make gpu-check`` runs them last, when its budget reaches them; skipped without a
GPU): every model class in bfloat16 on the GPU against float32 on the CPU, each attention implementation, the caches
token-exact, compiled forwards and CUDA graphs equal to eager, LLaDA2's experts implementations, rows alone in
bfloat16 (``batch_invariant``), and a two-process lm-eval run where two GPUs are present.

Tolerance of bfloat16 against float32: logits within 0.1 absolute + 5% relative (bfloat16 keeps 8 bits of
mantissa; these tiny random models' logits are of order 1), and the argmax equal at 95% of positions at least."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cache_spy import assert_one_static_cache, spy_on_caches
from tiny_mdm import tiny_mdm
from transformers import CompileConfig

from hf_mdm.gpu_check.shapes import shapes

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: on a GPU, run `make test-cuda`"),
]

DIFFUSION = {s.name: s for s in shapes(tiny=True) if s.kind == "diffusion"}
MODELS = ["MDM", "MDM block-causal", *DIFFUSION]
ATOL, RTOL, ARGMAX_AGREEMENT = 0.1, 0.05, 0.95


def build(name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    if name.startswith("MDM"):
        # head dimension 16: torch's flex_attention kernel on CUDA needs at least 16 (the CPU tests' tiny MDM has 8)
        model = tiny_mdm(block_size=4 if "block" in name else None, hidden_size=64, intermediate_size=128)
        return model.to(device=device, dtype=dtype)
    return DIFFUSION[name].build(dtype, device)


def ids_for(model: torch.nn.Module) -> torch.Tensor:
    vocab = model.config.vocab_size if hasattr(model.config, "vocab_size") else 30
    return torch.randint(3, min(vocab, 30) - 1, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", MODELS)
def test_bfloat16_on_cuda_matches_float32_on_the_cpu(name):
    reference = build(name, torch.float32, "cpu")
    ids = ids_for(reference)
    expected = reference(ids).logits
    model = build(name, torch.float32, "cuda")
    model.load_state_dict(reference.state_dict())
    got = model.to(torch.bfloat16)(ids.cuda()).logits.float().cpu()
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= ARGMAX_AGREEMENT


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("name", MODELS)
def test_every_attention_implementation_on_cuda(name, implementation):
    assert_same_logits_after(build(name, torch.float32, "cuda"), lambda m: m.set_attn_implementation(implementation))


def assert_same_logits_after(model: torch.nn.Module, change) -> None:
    """The model's float32 logits on CUDA before and after ``change(model)`` (an implementation switched)."""
    ids = ids_for(model).cuda()
    expected = model(ids).logits
    change(model)
    torch.testing.assert_close(model(ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_exact_block_cache_is_token_exact_on_cuda():
    model = build("MDM block-causal", torch.float32, "cuda")
    prompt = ids_for(model).cuda()
    settings = dict(max_new_tokens=16, steps=16, block_length=4)
    assert torch.equal(
        model.generate(prompt, kv_cache="prefix", **settings), model.generate(prompt, kv_cache="none", **settings)
    )


def test_dual_cache_with_refresh_every_forward_is_token_exact_on_cuda():
    model = build("MDM", torch.float32, "cuda")
    prompt = ids_for(model).cuda()
    settings = dict(max_new_tokens=16, steps=8, block_length=8)
    cached = model.generate(prompt, kv_cache="dual", kv_cache_refresh=1, **settings)
    assert torch.equal(cached, model.generate(prompt, **settings))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_forward_and_cuda_graphs_equal_eager(mode):
    model = build("MDM", torch.float32, "cuda")
    prompt = ids_for(model).cuda()
    settings = dict(max_new_tokens=16, steps=8, block_length=8)
    compiled = CompileConfig(backend="inductor", mode=mode, dynamic=mode == "default")
    eager = model.generate(prompt, **settings)
    for _ in range(2):  # the second call replays the recorded graphs
        assert torch.equal(model.generate(prompt, compile_forward=True, compile_config=compiled, **settings), eager)


@pytest.mark.parametrize("name, cache", [("MDM", "dual"), ("MDM", "prefix"), ("MDM block-causal", "prefix")])
def test_cuda_graphs_with_the_static_cache_equal_eager(name, cache):
    torch._dynamo.reset()
    graphs = CompileConfig(backend="inductor", mode="reduce-overhead", dynamic=False)
    assert_static_cache_equals_eager(build(name, torch.float32, "cuda"), cache, graphs)


def assert_static_cache_equals_eager(model: torch.nn.Module, cache: str, compile_config: CompileConfig) -> None:
    """A generate of 4 blocks with ``compile_config`` (static shapes: CUDA graphs, or any backend with
    ``dynamic=False``) gives eager's tokens on the call that compiles (at most 3 graphs) and on one that replays
    them (none), the cache's keys/values in one set of `StaticLayer` buffers a call, written in place."""
    prompt = ids_for(model).to(model.device)
    block = 4 if model.config.block_size else 8
    settings = dict(max_new_tokens=16, steps=8, block_length=block, kv_cache=cache, return_dict_in_generate=True)
    eager = model.generate(prompt, **settings)
    compiled = []
    for _ in range(2):
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        with pytest.MonkeyPatch.context() as patch:
            seen = spy_on_caches(patch)
            out = model.generate(prompt, compile_forward=True, compile_config=compile_config, **settings)
        compiled.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - before)
        assert torch.equal(out.sequences, eager.sequences)
        assert_one_static_cache(seen, out.nfe)
    assert 1 <= compiled[0] <= 3 and compiled[1] == 0, compiled


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm", "batched_mm"])
def test_llada2_experts_implementations_on_cuda(implementation):
    model = build("LLaDA2.0-mini", torch.float32, "cuda")
    assert_same_logits_after(model, lambda m: m.set_experts_implementation(implementation))


def test_rows_alone_in_bfloat16_on_cuda():
    model = build("MDM", torch.bfloat16, "cuda")
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([1, 2, 3, 4, 8, 9, 10])]
    ids = torch.zeros((2, 7), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, 7 - len(p) :], mask[i, 7 - len(p) :] = p, 1
    settings = dict(max_new_tokens=16, steps=16, block_length=8, temperature=1.0, batch_invariant=True)
    out = model.generate(ids.cuda(), attention_mask=mask.cuda(), seed=[1, 2], **settings)
    for i, p in enumerate(prompts):
        alone = model.generate(p[None].cuda(), seed=i + 1, **settings)
        assert torch.equal(out[i, 7:], alone[0, len(p) :])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than two GPUs")
def test_two_gpu_processes_give_the_one_process_answers(tmp_path):
    from hf_mdm.harness.tiny import build_tiny_models

    repo = Path(__file__).resolve().parents[2]
    tiny = build_tiny_models(tmp_path / "tiny")
    env = dict(os.environ, HF_MDM_DATA_DIR=os.environ.get("HF_MDM_DATA_DIR", str(repo.parent / "shared" / "data")))
    outputs = {}
    for processes in (1, 2):
        launcher = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu"] if processes == 2 else []
        command = launcher + (["--num_processes", "2", "--main_process_port", "0"] if processes == 2 else [])
        command += ([] if processes == 2 else [sys.executable]) + ["-m", "hf_mdm.harness", "run", "--model", "hf_mdm"]
        command += ["--model_args", f"pretrained={tiny['mdm']},steps=8,dtype=bfloat16,batch_invariant=True"]
        command += [
            "--tasks",
            "mdm_gsm8k",
            "--limit",
            "4",
            "--output_path",
            str(tmp_path / str(processes)),
            "--log_samples",
        ]
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[processes] = sorted(p.read_text() for p in (tmp_path / str(processes)).rglob("samples_*.jsonl"))
    assert len(outputs[1]) == len(outputs[2]) == 1
    assert answers(outputs[1][0]) == answers(outputs[2][0])


def answers(samples_jsonl: str) -> list:
    rows = [json.loads(line) for line in samples_jsonl.splitlines()]
    return sorted((row["doc_id"], row["filter"], row["resps"]) for row in rows)
