"""Weight-only quantization through torchao (`hf_mdm.quantization`): each family (hf_mdm's MDM, LLaDA, Dream, LLaDA2's
mixture of experts), saved and reloaded with int8 weights, generates at T=0 with every cache and compiled; its logits
stay close to bfloat16's, its tokens are compared with bfloat16's (the agreement is recorded, not assumed), its
weights take less memory; int4 loads and generates on the CPU; ``hf-mdm serve --quantization int8`` answers; bad
names and devices are refused with the reason. Skipped with the reason where torchao is missing."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
import torch
import transformers

pytest.importorskip("torchao", reason="torchao is not installed (pip install 'hf_mdm[quant]')")

from hf_mdm.gpu_check.shapes import shapes  # noqa: E402
from hf_mdm.harness.tiny import build_tiny_models  # noqa: E402
from hf_mdm.loading import load_pretrained  # noqa: E402
from hf_mdm.quantization import linear_weight_bytes, quantization_config, weight_bytes  # noqa: E402
from hf_mdm.serve import Engine, ServeSettings, build_app, running  # noqa: E402

FAMILIES = {"mdm": "mdm", "llada": "LLaDA-8B", "dream": "Dream-7B", "llada2": "LLaDA2.0-mini"}
CACHES = {"llada2": [None, "prefix"]}  # LLaDA2: block-causal, its exact block cache; the others also "dual"
PROMPT_LEN = 6
GENERATE = dict(max_new_tokens=16, steps=16, block_length=8, temperature=0.0)
# int8's logits against bfloat16's, relative to the largest bfloat16 logit: measured 0.040 (mdm, whose tiny LM head
# is large), 0.010-0.014 (the others)
LOGITS_TOLERANCE = 0.1


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """One saved tiny checkpoint per family (float32 weights, the tiny shapes of `hf_mdm.gpu_check.shapes`)."""
    root = tmp_path_factory.mktemp("quant_models")
    paths = {"mdm": build_tiny_models(root)["mdm"]}
    names = {shape_name: family for family, shape_name in FAMILIES.items()}
    for shape in shapes(tiny=True, names=list(names)):
        model = shape.build(torch.float32, "cpu")
        for field, value in shape.token_ids:  # the tiny vocabulary's [MASK] and EOS
            setattr(model.config, field, value)
            setattr(model.generation_config, field, value)
        path = root / names[shape.name]
        model.save_pretrained(path)
        paths[names[shape.name]] = str(path)
    return paths


def load(path: str, quantization, **kwargs) -> torch.nn.Module:
    config = quantization_config(quantization, "cpu", **kwargs)
    model = transformers.AutoModelForMaskedLM.from_pretrained(path, dtype=torch.bfloat16, quantization_config=config)
    return model.eval()


def prompt() -> torch.Tensor:
    return torch.randint(3, 60, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(0))


def generate(model, **settings) -> torch.Tensor:
    return model.generate(prompt(), **GENERATE, **settings)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_generates_with_every_cache_and_compiled(checkpoints, family, record_property):
    bf16, int8 = load(checkpoints[family], None), load(checkpoints[family], "int8")
    assert any(type(m.weight).__name__ == "Int8Tensor" for m in int8.modules() if isinstance(m, torch.nn.Linear))
    mask = int8.config.mask_token_id
    with torch.no_grad():
        reference, quantized = bf16(prompt()).logits.float(), int8(prompt()).logits.float()
    assert (quantized - reference).abs().max() <= LOGITS_TOLERANCE * reference.abs().max()
    for cache in CACHES.get(family, [None, "prefix", "dual"]):
        tokens = generate(int8, kv_cache=cache)
        assert tokens.shape == (2, PROMPT_LEN + GENERATE["max_new_tokens"])
        assert torch.equal(tokens[:, :PROMPT_LEN], prompt()) and not (tokens == mask).any()
        if cache == "prefix":  # (every cache compiled gave the eager tokens too: 12 s more a family)
            compiled = generate(
                int8, kv_cache=cache, compile_forward=True, compile_config=transformers.CompileConfig(backend="eager")
            )
            assert torch.equal(compiled, tokens)  # the compiled call computes what the eager one does
        agreement = (tokens[:, PROMPT_LEN:] == generate(bf16, kv_cache=cache)[:, PROMPT_LEN:]).float().mean().item()
        record_property(f"agreement_{cache}", agreement)  # random tiny weights: near-ties flip under int8
        print(f"{family} kv_cache={cache}: int8 tokens agree with bfloat16's at {agreement:.3f}")
        assert 0.0 <= agreement <= 1.0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_and_int4_weights_take_less_memory(checkpoints, family):
    bf16, int8 = load(checkpoints[family], None), load(checkpoints[family], "int8")
    int4 = load(checkpoints[family], "int4", group_size=32)
    assert any(type(m.weight).__name__ == "Int4OpaqueTensor" for m in int4.modules() if isinstance(m, torch.nn.Linear))
    # the linear layers (all but the LM head quantized): int8 about half of bfloat16 (plus a scale per row)
    assert linear_weight_bytes(int8) < 0.75 * linear_weight_bytes(bf16)
    assert linear_weight_bytes(int4) < linear_weight_bytes(int8)
    assert weight_bytes(int4) < weight_bytes(int8) < weight_bytes(bf16)
    tokens = generate(int4, kv_cache="prefix")
    assert (
        tokens.shape == (2, PROMPT_LEN + GENERATE["max_new_tokens"]) and not (tokens == int4.config.mask_token_id).any()
    )


def test_weight_bytes_counts_the_stored_tensors():
    linear = torch.nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)
    assert weight_bytes(linear) == 64 * 32 * 2
    from torchao.quantization import quantize_

    quantize_(linear, quantization_config("int8").quant_type)
    assert type(linear.weight).__name__ == "Int8Tensor"
    assert 64 * 32 <= weight_bytes(linear) <= 64 * 32 + 32 * 8  # int8 values and one scale per output row


def test_serve_loads_int8_and_answers(checkpoints):
    loaded = load_pretrained(checkpoints["mdm"], dtype="bfloat16", quantization="int8")
    model, tokenizer = loaded.model, loaded.tokenizer
    assert any(type(m.weight).__name__ == "Int8Tensor" for m in model.modules() if isinstance(m, torch.nn.Linear))
    settings = ServeSettings()
    with running(build_app(Engine(model, tokenizer, settings), settings, "tiny-int8")) as url:
        body = {"model": "tiny-int8", "prompt": "The answer is", "max_tokens": 8, "temperature": 0, "steps": 8}
        request = urllib.request.Request(
            url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            reply = json.loads(answer.read())
    assert isinstance(reply["choices"][0]["text"], str) and reply["usage"]["completion_tokens"] <= 8


def test_bad_names_devices_and_a_missing_torchao_are_refused(checkpoints, monkeypatch, capsys):
    assert quantization_config(None) is None and quantization_config("none") is None
    with pytest.raises(ValueError, match=r"unknown quantization 'fp8': one of \['int8', 'int4'\]"):
        quantization_config("fp8")
    with pytest.raises(ValueError, match="int4.*'mps'.*\\['cpu', 'cuda'\\].*use 'int8'"):
        quantization_config("int4", "mps")
    with pytest.raises(ValueError, match="group_size 48"):
        quantization_config("int4", "cpu", group_size=48)
    with pytest.raises(ValueError, match="cannot load the model.*unknown quantization 'int3'"):
        load_pretrained(checkpoints["mdm"], quantization="int3")
    from hf_mdm.cli import main

    with pytest.raises(SystemExit):
        main(["serve", checkpoints["mdm"], "--quantization", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    assert main(["serve", checkpoints["mdm"], "--quantization", "int4", "--device", "mps"]) == 2  # before loading
    assert "torchao packs int4 weights for ['cpu', 'cuda'] only" in capsys.readouterr().err
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else find_spec(name, *a)
    )
    with pytest.raises(ValueError, match=r"needs torchao: pip install 'hf_mdm\[quant\]'"):
        quantization_config("int8")


def test_importing_torchao_after_hf_mdm_logs_nothing():
    """On a CPU build of torch, torchao's import logs that its CUDA kernels do not load and torch's note on its Enum
    registrations; after ``import hf_mdm`` neither reaches the user (transformers imports torchao with any model)."""
    code = "import hf_mdm, torchao"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    bare = subprocess.run([sys.executable, "-c", "import torchao"], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0  # (what torchao alone logs depends on the build: not asserted)
