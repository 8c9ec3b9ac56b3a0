"""User mistakes at ``hf-mdm sft`` and ``hf-mdm a2d``: each ends in one line that names the file, the row or the
flag and says what to change (no traceback), and Ctrl-C says what is kept and how to resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from hf_mdm.cli import main
from hf_mdm.cli_finetune import check_bf16
from hf_mdm.finetune import load_pairs, tokenize_pairs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    from hf_mdm.harness.tiny import build_tiny_models

    return {name: Path(path) for name, path in build_tiny_models(tmp_path_factory.mktemp("tiny")).items()}


def pairs(path: Path, rows: list, count: int = 8) -> Path:
    rows = rows or [{"prompt": f"What is {i} + {i}?", "response": f"{2 * i}."} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft(model: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["sft", "--model", str(model), "--data", str(data), "--output-dir", str(out), "--batch-size", "4",
                 "--max-length", "48", "--max-steps", "2", *extra])  # fmt: skip


def last_error(capsys) -> str:
    """The command's error line (progress bars may come before it), after checking no traceback was printed."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "name, text",
    [("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("empty.json", ""), ("header.csv", "prompt,response\n")],
)
def test_a_data_file_without_rows_is_named(tiny, tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}: .*no rows"):
        load_pairs(str(path))
    assert sft(tiny["mdm"], path, tmp_path / "out") == 2
    line = last_error(capsys)
    assert line.startswith("hf-mdm: error: ") and str(path) in line


def test_a_broken_json_line_is_located(tmp_path):
    lines = pairs(tmp_path / "pairs.jsonl", []).read_text().splitlines()
    lines[2] = '{"prompt": "c", "response": '
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"{broken} line 3: not valid JSON"):
        load_pairs(str(broken))
    document = tmp_path / "document.json"
    document.write_text('[\n  {"prompt": "a", "response": "b"},\n  {"prompt": "c", "response": }\n]\n')
    with pytest.raises(ValueError, match=f"{document} line 3: not valid JSON"):
        load_pairs(str(document))
    scalar = tmp_path / "scalar.jsonl"
    scalar.write_text('{"prompt": "a", "response": "b"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=f"{scalar} line 2: .*JSON object"):
        load_pairs(str(scalar))


def test_a_null_response_is_refused_with_its_file_and_row(tiny, tmp_path, capsys):
    """Malformed rows are refused (a row without the columns raises too); only rows too long for max_length are
    dropped with a logged count."""
    from transformers import AutoTokenizer

    rows = [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": None}]
    data = pairs(tmp_path / "null.jsonl", rows)
    tokenizer = AutoTokenizer.from_pretrained(tiny["mdm"])
    with pytest.raises(ValueError, match=f"{data} row 2: 'response' is null"):
        tokenize_pairs(load_pairs(str(data)), tokenizer, source=str(data))
    chat = pairs(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": None},
                                                         {"role": "assistant", "content": "b"}]}])  # fmt: skip
    with pytest.raises(ValueError, match=f"{chat} row 1: message 1's content is null"):
        tokenize_pairs(load_pairs(str(chat)), tokenizer, source=str(chat))
    assert sft(tiny["mdm"], data, tmp_path / "out") == 2
    assert f"{data} row 2: 'response' is null" in last_error(capsys)


def test_sft_on_an_autoregressive_model_points_to_a2d(tiny, tmp_path, capsys):
    data = pairs(tmp_path / "pairs.jsonl", [])
    assert sft(tiny["llama"], data, tmp_path / "out") == 2
    line = last_error(capsys)
    assert "autoregressive" in line and f"hf-mdm a2d --model {tiny['llama']}" in line
    assert "126336" not in line


def test_sft_bf16_without_a_bf16_gpu_gives_this_clis_advice(tiny, tmp_path, capsys, monkeypatch):
    """No GPU with bfloat16 (so on any machine: transformers' answer set to no), and --bf16 is refused up front."""
    monkeypatch.setattr(transformers.utils, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(transformers.utils, "is_torch_xla_available", lambda: False)
    data = pairs(tmp_path / "pairs.jsonl", [])
    assert sft(tiny["mdm"], data, tmp_path / "out", "--bf16") == 2
    line = last_error(capsys)
    assert "--bf16" in line and "without --bf16" in line and "use_cpu" not in line
    assert not (tmp_path / "out").exists()  # refused before loading anything
    monkeypatch.setattr(transformers.utils, "is_torch_bf16_gpu_available", lambda: True)
    check_bf16(True)  # with such a GPU it passes


def test_a2d_on_a_model_it_cannot_convert_says_what_it_takes_in_one_line(tiny, tmp_path, capsys):
    assert main(["a2d", "--model", str(tiny["mdm"]), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and len(err) < 400, err
    assert "'hf_mdm'" in err and "Llama" in err and "Qwen2" in err and "hf-mdm sft" in err


def test_ctrl_c_before_the_first_checkpoint_says_nothing_is_kept(tiny, tmp_path, capsys, monkeypatch):
    from test_sft import interrupt_at

    interrupt_at(monkeypatch, 1)
    data = pairs(tmp_path / "pairs.jsonl", [])
    (tmp_path / "out" / "checkpoint-9").mkdir(parents=True)  # a save cut short: no trainer_state.json
    assert sft(tiny["mdm"], data, tmp_path / "out", "--save-steps", "5") == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no checkpoint is kept" in line and "rerunning the same command starts from step 0" in line
    assert "skipping 1 newer checkpoint folder whose save was cut short" in line
