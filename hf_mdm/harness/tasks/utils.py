"""Functions named by hf_mdm's task YAMLs (``!function hf_mdm.harness.tasks.utils.<name>``).

Datasets come from `hf_mdm.harness.data` (the Hub, or ``HF_MDM_DATA_DIR``); generated code runs in
`hf_mdm.harness.sandbox` (opt-in: ``HF_ALLOW_CODE_EVAL=1`` and ``--confirm_run_unsafe_code``); the GSM8K answer is
extracted and compared with lm-eval's own ``regex`` filter and ``exact_match`` metric.
"""

from __future__ import annotations

from typing import Any, Sequence

import datasets
from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter

from .. import data
from ..arithmetic import check_chain
from ..code_eval import execute, humaneval_job, mbpp_job, pass_at_k_of_outcomes, unsplit_reason
from ..sandbox import require_code_execution

# lm-eval's gsm8k task: its strict and flexible answer patterns and its exact_match settings.
GSM8K_STRICT = RegexFilter(regex_pattern=r"#### (\-?[0-9\.\,]+)", group_select=0)
GSM8K_FLEXIBLE = RegexFilter(regex_pattern=r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1)
GSM8K_EXACT_MATCH = {
    "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"],
    "ignore_case": True,
    "ignore_punctuation": False,
}
GSM8K_FEWSHOT_POOL = 32  # enough for any --num_fewshot up to 32
MBPP_FEWSHOT_TASK_IDS = (2, 3, 4)  # the prompt problems of Austin et al. (2021), as in lm-eval's mbpp


# -- datasets ----------------------------------------------------------------------------------------------------


def load_gsm8k(**kwargs: Any) -> datasets.DatasetDict:
    """GSM8K (``main``) from ``HF_MDM_DATA_DIR`` or the Hub."""
    return data.load_gsm8k(kwargs.get("data_dir"))


def load_mbpp(**kwargs: Any) -> datasets.DatasetDict:
    """MBPP (``full``); needs the code-execution opt-in, checked here so that a run fails before generating."""
    require_code_execution()
    return data.load_mbpp(kwargs.get("data_dir"))


def load_humaneval(**kwargs: Any) -> datasets.DatasetDict:
    """HumanEval; needs the code-execution opt-in, checked here so that a run fails before generating."""
    require_code_execution()
    return data.load_humaneval(kwargs.get("data_dir"))


def gsm8k_fewshot_docs(dataset: datasets.Dataset) -> list[dict]:
    """The first train problems, the few-shot pool (lm-eval's first_n sampler scans its whole pool per request)."""
    return [dict(row) for row in dataset.select(range(min(GSM8K_FEWSHOT_POOL, len(dataset))))]


def mbpp_fewshot_docs(dataset: datasets.Dataset) -> list[dict]:
    """The three prompt problems (task_id 2, 3, 4) of the ``prompt`` split, in that order."""
    rows = {row["task_id"]: row for row in dataset}
    return [rows[task_id] for task_id in MBPP_FEWSHOT_TASK_IDS]


# -- code execution ------------------------------------------------------------------------------------------------


def execute_mbpp(resps: Sequence[Sequence[str]], docs: Sequence[dict]) -> list[list[dict]]:
    """Filter: run each response in the sandbox and its asserts on the trusted side (`hf_mdm.harness.verdict`;
    where a task's test cannot be split, solution, test_setup_code and asserts together, as the outcome notes)."""
    jobs = [[mbpp_job(r, doc) for r in rs] for rs, doc in zip(resps, docs)]
    return execute(jobs, notes=[unsplit_reason(doc) for doc in docs])


def execute_humaneval(resps: Sequence[Sequence[str]], docs: Sequence[dict]) -> list[list[dict]]:
    """Filter: run prompt + response in the sandbox and the tests with ``check(entry_point)`` on the trusted side
    (where a task's test cannot be split, all together in the sandbox, as the outcome notes)."""
    jobs = [[humaneval_job(r, doc) for r in rs] for rs, doc in zip(resps, docs)]
    return execute(jobs, notes=[unsplit_reason(doc) for doc in docs])


def pass_at_1(references: Sequence[Any], predictions: Sequence[Sequence[dict]]) -> float:
    """Metric: unbiased pass@1 of one problem from the sandbox outcomes of its samples."""
    return pass_at_k_of_outcomes(predictions[0], [1])["pass@1"]


def pass_at_k(references: Sequence[Any], predictions: Sequence[Sequence[dict]], k: Sequence[int] = (1,)) -> dict:
    """Metric: unbiased pass@k for each k (needs ``repeats`` >= k samples per problem)."""
    return pass_at_k_of_outcomes(predictions[0], [k] if isinstance(k, int) else list(k))


# -- GSM8K chain ---------------------------------------------------------------------------------------------------


def extract_answer(pattern: RegexFilter, text: str) -> str:
    """The answer ``pattern`` (lm-eval's GSM8K strict or flexible filter) takes from ``text`` (its fallback when
    none)."""
    return pattern.apply([[text]], [{}])[0][0]


def exact_match(prediction: str, reference: str) -> float:
    """1.0 where ``prediction`` equals ``reference`` under lm-eval's GSM8K exact-match settings, else 0.0."""
    return float(exact_match_hf_evaluate([prediction], [reference], **GSM8K_EXACT_MATCH)["exact_match"])


def process_gsm8k_chain(doc: dict, results: Sequence[str]) -> dict[str, float]:
    """Accuracy (strict and flexible, as lm-eval's gsm8k) and arithmetic validity of the generated chain.

    ``chain_valid``: every arithmetic statement of the chain holds (see `hf_mdm.harness.arithmetic`);
    ``valid_and_correct``: the strict answer is right and the chain valid (a right answer reached through a
    wrong step does not count); ``statements``: number of checked statements.
    """
    text = results[0]
    target = doc["answer"]
    strict = extract_answer(GSM8K_STRICT, text)
    flexible = extract_answer(GSM8K_FLEXIBLE, text)
    correct = exact_match(strict, target)
    check = check_chain(text, answer=strict if strict != GSM8K_STRICT.fallback else flexible, question=doc["question"])
    return {
        "exact_match": correct,
        "flexible_match": exact_match(flexible, target),
        "chain_valid": float(check.valid),
        "valid_and_correct": float(check.valid and correct == 1.0),
        "statements": float(check.num_statements),
    }
