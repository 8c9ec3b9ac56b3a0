"""The three benchmarks through the real lm-eval evaluator, hf_mdm's tasks and sandbox, on real rows of the data
folder: the reference answers score exactly 1, empty answers 0, hostile programs 0 (and harm nothing)."""

import os
import tempfile
from pathlib import Path

import pytest
from lm_eval.api.model import LM

from hf_mdm.harness import simple_evaluate, task_names
from hf_mdm.harness.sandbox import UNISOLATED_ENV, bubblewrap_unavailable, isolation_layer

os.environ.setdefault("HF_MDM_DATA_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "data"))
LIMIT = 6
PRIMARY = {
    "mdm_gsm8k": ["exact_match,strict-match", "exact_match,flexible-extract"],
    "mdm_gsm8k_chain": ["exact_match,none", "flexible_match,none", "valid_and_correct,none"],
    "mdm_mbpp": ["pass_at_1,sandbox"],
    "mdm_humaneval": ["pass_at_1,sandbox"],
}


@pytest.fixture(autouse=True)
def code_execution(monkeypatch):
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    monkeypatch.setenv("HF_MDM_SANDBOX_TIMEOUT_S", "3")
    monkeypatch.setenv("HF_MDM_SANDBOX_CPU_S", "2")
    if bubblewrap_unavailable():  # the explicit opt-in to the process layer alone (the default refuses)
        monkeypatch.setenv(UNISOLATED_ENV, "1")


class AnswerLM(LM):
    """An lm-eval model that answers each request with ``answer(doc)``, recording the prompts it saw."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer
        self.prompts = []

    def generate_until(self, requests, disable_tqdm=False):
        self.prompts += [r.args[0] for r in requests]
        return [self.answer(r.doc) for r in requests]

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


def reference(doc):
    if "canonical_solution" in doc:
        return doc["canonical_solution"]
    return doc["code"] if "test_list" in doc else doc["answer"]


def evaluate(lm, tasks=tuple(PRIMARY)):
    return simple_evaluate(lm, tasks=list(tasks), limit=LIMIT, confirm_run_unsafe_code=True, log_samples=True)


def test_tasks_are_registered():
    assert {"mdm_gsm8k", "mdm_gsm8k_chain", "mdm_mbpp", "mdm_humaneval"} <= task_names()


def test_reference_answers_score_one():
    lm = AnswerLM(reference)
    results = evaluate(lm)
    for task, metrics in PRIMARY.items():
        assert results["n-samples"][task]["effective"] == LIMIT
        for metric in metrics:
            assert results["results"][task][metric] == 1.0, (task, metric)
    assert results["results"]["mdm_gsm8k_chain"]["chain_valid,none"] == 1.0
    # the prompts are the benchmarks' few-shot formats
    assert sum("Question:" in p and "#### " in p for p in lm.prompts) == 2 * LIMIT  # 5-shot GSM8K, both tasks
    assert sum("[BEGIN]\ndef similar_elements" in p for p in lm.prompts) == LIMIT  # MBPP prompt problems 2, 3, 4
    outcome = results["samples"]["mdm_mbpp"][0]["filtered_resps"][0][0]
    assert outcome["passed"] and outcome["status"] == "passed"
    assert outcome["verdict"] == "trusted"  # the asserts ran in this process, the solution in the sandbox
    # the results say which isolation layer ran the code (bubblewrap where it works here)
    assert results["sandbox"]["layer"] == outcome["layer"] == isolation_layer()
    layer = isolation_layer()
    assert results["sandbox"]["programs"] == {
        "mdm_mbpp": {f"{layer}/trusted": LIMIT},
        "mdm_humaneval": {f"{layer}/trusted": LIMIT},
    }


def test_empty_answers_score_zero():
    results = evaluate(AnswerLM(lambda doc: ""))
    for task, metrics in PRIMARY.items():
        for metric in metrics:
            assert results["results"][task][metric] == 0.0, (task, metric)


def test_hostile_programs_score_zero_and_harm_nothing():
    with tempfile.TemporaryDirectory(prefix="hf_mdm_victim_") as directory:
        victim = Path(directory) / "precious.txt"
        victim.write_text("keep me")
        programs = [
            "while True:\n    pass",
            "blob = bytearray(6 * 1024 ** 3)",
            "import os\nfor _ in range(40):\n    os.fork()",
            f"import os, shutil\nos.remove({str(victim)!r})\nshutil.rmtree({directory!r})",
            "import subprocess\nsubprocess.Popen(['sleep', '100'])",
            "import os\nos.system('kill -9 -1')",
        ]
        answers = iter(programs * 2)
        results = evaluate(AnswerLM(lambda doc: next(answers)), tasks=["mdm_mbpp", "mdm_humaneval"])
        assert victim.read_text() == "keep me"
    assert results["results"]["mdm_mbpp"]["pass_at_1,sandbox"] == 0.0
    assert results["results"]["mdm_humaneval"]["pass_at_1,sandbox"] == 0.0
    reasons = [s["filtered_resps"][0][0]["reason"] for s in results["samples"]["mdm_mbpp"]]
    assert any("limit" in r for r in reasons) and any("MemoryError" in r for r in reasons)


def test_code_tasks_need_the_opt_in(monkeypatch):
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL")
    with pytest.raises(PermissionError, match="HF_ALLOW_CODE_EVAL"):
        evaluate(AnswerLM(reference), tasks=["mdm_humaneval"])
