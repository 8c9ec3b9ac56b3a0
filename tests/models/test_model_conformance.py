"""The model classes as transformers' own models behave, checked on every class hf_mdm registers (a class added
later fails `test_every_registered_class_is_covered` until it has a tiny config here): the attention interface
(eager, sdpa, flex_attention give the same logits), masks from the masking utilities (bidirectional with padding
and block-causal, against a brute-force mask), attentions and hidden states as outputs, ``return_dict``, gradient
checkpointing, tensor-parallel plans, ``torch.compile(fullgraph=True)`` and ``resize_token_embeddings``."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conformance_models import MASK, TINY, VOCAB, build
from packaging import version
from transformers import AutoModelForMaskedLM

import hf_mdm  # noqa: F401  registers MDMForMaskedDiffusion
import hf_mdm.models  # noqa: F401  registers LLaDA and Dream
from hf_mdm.models import LLaDA2MoeModelLM

IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]
TP_VERIFIED_FROM = "5.24.0"  # the oldest transformers on which the two-process tensor-parallel test ran green
IDS = torch.tensor([[0, 0, 5, MASK, 7, 8, MASK, 3, 9], [4, MASK, 6, 2, MASK, 11, 12, 13, 14]])
PADDING = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]])


@pytest.fixture(params=list(TINY), ids=lambda c: c.__name__)
def model_class(request):
    return request.param


def brute_force_mask(padding: torch.Tensor, block_size, positions=None) -> torch.Tensor:
    """(B, 1, L, L) True where query i may attend to key j: j is a token and, block-causally, in a block <= i's
    (blocks of ``block_size`` positions; default positions 0..L-1)."""
    length = padding.shape[1]
    allowed = padding.bool()[:, None, None, :].expand(-1, 1, length, length)
    if block_size is not None:
        positions = torch.arange(length).expand(padding.shape[0], length) if positions is None else positions
        blocks = positions // block_size
        allowed = allowed & (blocks[:, None, None, :] <= blocks[:, None, :, None])
    return allowed


def test_every_registered_class_is_covered():
    from transformers import MODEL_FOR_MASKED_LM_MAPPING

    ours = {cls for cls in MODEL_FOR_MASKED_LM_MAPPING._extra_content.values() if cls.__module__.startswith("hf_mdm")}
    assert ours == set(TINY)


def test_class_flags_say_what_is_supported(model_class):
    for flag in (
        "_supports_sdpa",
        "_supports_flex_attn",
        "_supports_attention_backend",
        "_can_compile_fullgraph",
        "supports_gradient_checkpointing",
    ):
        assert getattr(model_class, flag) is True, flag
    assert model_class._can_set_attn_implementation()  # the attention classes use the attention interface


@pytest.mark.parametrize("block_size", [None, 1, 4, 9])
@torch.no_grad()  # flex_attention has no backward on the CPU
def test_implementations_agree_with_a_brute_force_mask(model_class, block_size):
    """Every attention implementation, with the mask the masking utilities build (padding, block-causal), gives the
    logits of sdpa with a hand-built boolean mask (a 4-D mask is used as given)."""
    reference = build(model_class, None, "sdpa")
    positions = (PADDING.cumsum(1) - 1).clamp(min=0)  # a left-padded row's blocks start at its first token
    mask = brute_force_mask(PADDING, block_size, positions)
    expected = reference(IDS, attention_mask=mask, position_ids=positions).logits
    for implementation in IMPLEMENTATIONS:
        model = build(model_class, block_size, implementation)
        got = model(IDS, attention_mask=PADDING, position_ids=positions).logits
        real = PADDING.bool()  # padding queries attend like the others; compare the tokens' rows
        torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=2e-5, msg=implementation)


def test_block_causal_logits_ignore_later_blocks(model_class):
    block = 3
    model = build(model_class, block)
    ids = IDS[1:].clone()
    base = model(ids).logits
    changed = ids.clone()
    changed[0, 7] = 20  # a token of the third block (columns 6..8)
    logits = model(changed).logits
    torch.testing.assert_close(logits[:, :6], base[:, :6])  # blocks 0 and 1 cannot see it
    assert not torch.allclose(logits[:, 6:], base[:, 6:])  # its own block can


def test_attentions_and_hidden_states_as_outputs(model_class):
    model = build(model_class, 3, "eager")
    positions = (PADDING.cumsum(1) - 1).clamp(min=0)
    out = model(IDS, attention_mask=PADDING, position_ids=positions, output_attentions=True, output_hidden_states=True)
    layers = model.config.num_hidden_layers
    assert len(out.attentions) == layers and len(out.hidden_states) == layers + 1
    for weights in out.attentions:
        assert weights.shape == (2, 4, 9, 9)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 9))
        assert torch.all(weights.masked_select(~brute_force_mask(PADDING, 3, positions)) == 0)
    assert model(IDS).hidden_states is None and model(IDS).attentions is None
    model.config.output_hidden_states = True  # the config's setting, as in transformers
    assert len(model(IDS).hidden_states) == layers + 1


def test_return_dict_false_gives_a_tuple(model_class):
    model = build(model_class)
    out = model(IDS, return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], model(IDS).logits)
    labels = torch.where(IDS == MASK, 3, -100)
    loss, logits = model(IDS, labels=labels, return_dict=False)[:2]
    assert loss.dim() == 0 and logits.shape == (2, 9, model.get_input_embeddings().num_embeddings)


def test_gradient_checkpointing_gives_the_same_gradients(model_class):
    grads = []
    for checkpointing in (False, True):
        model = build(model_class).train()
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        labels = torch.where(IDS == MASK, 3, -100)
        model(IDS, attention_mask=PADDING, labels=labels).loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


TP_STYLES = {"colwise", "rowwise", "colwise_gather_output", "embedding_rowwise", "packed_colwise", "moe_tp_experts"}


def plan_regex(pattern: str) -> re.Pattern:
    """A parallel plan's key as a regex over module and parameter names (``*`` = a layer index)."""
    return re.compile("^" + re.escape(pattern).replace(r"\*", r"\d+") + "$")


def plan_matches(plan: dict[str, str], names: list[str]) -> None:
    """Every pattern of a parallel plan names a real module or parameter."""
    for pattern in plan:
        assert any(plan_regex(pattern).match(name) for name in names), pattern


def test_tensor_parallel_plan_names_real_modules(model_class):
    model = build(model_class)
    names = [name for name, _ in model.named_modules()] + [name for name, _ in model.named_parameters()]
    plan = dict(model._tp_plan)  # the head's plan and the config's base_model_tp_plan, as transformers merges them
    # attention is split by heads, unless its projection is fused over query, key and value heads of unequal widths
    # (LLaDA2's query_key_value), which no column cut splits: then it stays replicated
    fused_qkv = any(name.endswith("query_key_value") for name in names)
    assert fused_qkv or any(key.endswith("q_proj") for key in plan)
    assert any(key.endswith("up_proj") for key in plan)
    if getattr(model.config, "weight_tying", False):
        plan = {key: style for key, style in plan.items() if not key.endswith("transformer.ff_out")}
    plan_matches(plan, names)
    assert set(plan.values()) <= TP_STYLES, plan
    if hasattr(model, "ep_plan"):  # the mixtures of experts' expert-parallel plan (transformers 5.2x on)
        plan_matches(model.ep_plan, names)
    split = {type(module).__name__ for module in model.modules()}
    assert set(model._no_split_modules) <= split


def planned_weights(model) -> int:
    """How many weight tensors the TP plan shards: parameters named by a pattern, or weights of a module it names."""
    patterns = [plan_regex(key) for key in model._tp_plan]
    names = [name for name, _ in model.named_parameters()]
    planned = lambda name: any(p.match(name) or p.match(name.removesuffix(".weight")) for p in patterns)  # noqa: E731
    return sum(planned(name) for name in names)


def run_in_two_processes(model, tmp_path, layout: str) -> list[dict]:
    """The model saved, its padded forward's logits beside it, and `tp_worker.py` run in two CPU processes (gloo)
    with ``layout``; each rank's report."""
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        logits = model(IDS, attention_mask=PADDING).logits
    torch.save({"ids": IDS, "attention_mask": PADDING, "logits": logits}, tmp_path / "inputs.pt")
    worker = Path(__file__).parents[1] / "helpers" / "tp_worker.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(worker), str(tmp_path)]
    result = subprocess.run(
        [*command, layout],
        capture_output=True,
        text=True,
        timeout=300,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.skipif(
    version.parse(transformers.__version__) < version.parse(TP_VERIFIED_FROM),
    reason=f"tp_plan='auto' is verified from transformers {TP_VERIFIED_FROM}; older releases leave these plans unsharded",
)
def test_tensor_parallel_in_two_processes_gives_the_same_logits(model_class, tmp_path):
    """``from_pretrained(..., tp_plan="auto")`` in two CPU processes (gloo) shards the weights and gives the
    single-process logits."""
    model = build(model_class)
    for report in run_in_two_processes(model, tmp_path, "tp"):
        assert report["sharded"] >= planned_weights(model) >= 4 * model.config.num_hidden_layers, report
        assert report["max_abs_diff"] < 1e-5, report


@pytest.mark.skipif(
    version.parse(transformers.__version__) < version.parse(TP_VERIFIED_FROM),
    reason=f"expert parallelism is verified from transformers {TP_VERIFIED_FROM}",
)
@pytest.mark.parametrize("model_class", [LLaDA2MoeModelLM], ids=lambda c: c.__name__)
def test_expert_parallel_in_two_processes_gives_the_same_logits(model_class, tmp_path):
    """``DistributedConfig(ep_size=2, tp_size=2)``: each process holds half of the routed experts, whole (the
    fused expert weights cut along the expert dimension), and the logits are the single-process ones."""
    model = build(model_class)
    experts = model.model.layers[-1].mlp.experts
    full = list(experts.gate_up_proj.shape)
    for report in run_in_two_processes(model, tmp_path, "ep"):
        assert report["local_experts"] == model.config.num_experts // 2, report
        assert report["gate_up_proj"] == [full[0] // 2, *full[1:]], report
        assert report["max_abs_diff"] < 1e-5, report


def test_padded_forward_compiles_with_fullgraph(model_class):
    """No data-dependent Python branch in a padded forward: dynamo traces it in one graph (``fullgraph=True``
    raises on a graph break), and the compiled logits are the eager ones."""
    model = build(model_class)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(IDS, attention_mask=PADDING).logits, model(IDS, attention_mask=PADDING).logits
        )
        explanation = torch._dynamo.explain(model)(IDS, attention_mask=PADDING)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_resize_token_embeddings_survives_save_and_load(model_class, tmp_path):
    model = build(model_class)
    model.resize_token_embeddings(VOCAB + 5)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.get_input_embeddings().num_embeddings == VOCAB + 5
    ids = IDS.clone()
    ids[0, 4] = VOCAB + 2  # a new token
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
