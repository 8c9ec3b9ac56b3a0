"""chain_valid: every arithmetic statement of a generated GSM8K chain is checked (hf_mdm.harness.arithmetic)."""

import json
import os
from pathlib import Path

import pytest

from hf_mdm.harness.arithmetic import check_chain, find_statements, safe_eval
from hf_mdm.harness.tasks.utils import process_gsm8k_chain

DATA_DIR = Path(os.environ.setdefault("HF_MDM_DATA_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "data")))


@pytest.mark.parametrize(
    "text",
    [
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18",
        "The cost came to 80,000+50,000=$<<80000+50000=130000>>130,000",
        "He runs 3 x 4 = 12 laps, then 12 / 5 = 2.4 km and 10/3 = 3.33 km. Total: (2 + 3) * 4 = 20.",
        "They kept 100-60 = 40% and 18 / 450 * 100 = 4% of it; 150% of 80 is 80*150% = 120.",
        "Chained: 1 + 2 + 3 = 6 = 2 * 3 = 12 / 2",
        "The change is -5 + 3 = -2 degrees, and 2^3 = 8, and .5 * 4 = 2.0",
    ],
)
def test_true_statements_are_valid(text):
    check = check_chain(text)
    assert check.statements and check.valid, [(s.text, s.values) for s in check.statements]


@pytest.mark.parametrize(
    "text, wrong",
    [
        ("1+2+3=4+3=6", "1+2+3 = 4+3 = 6"),  # right answer, a wrong link in the chain
        ("5 * 4 = 25 so there are 25 apples.\n#### 25", "5 * 4 = 25"),
        ("He has 7 - 2 = 5 left, and 5 + 1 = 7 after buying one.", "5 + 1 = 7"),
        ("Total <<3*3=10>>10 sprints", "3*3 = 10"),
        ("1+2=3+3=6", "1+2 = 3+3 = 6"),  # the running-total shorthand is not an equality
        ("It is 12 / 0 = 5", "12 / 0 = 5"),
    ],
)
def test_false_statements_are_found(text, wrong):
    check = check_chain(text)
    assert not check.valid
    assert [s.text for s in check.statements if not s.holds] == [wrong]


def test_right_answer_through_a_wrong_step():
    """The final answer is right (18), but one step is false: accurate, not chain-valid."""
    doc = {
        "question": "Janet has 16 eggs, eats 3, bakes 4, sells the rest at $2. How much does she make?",
        "answer": "16 - 3 - 4 = <<16-3-4=9>>9\n9 * 2 = $<<9*2=18>>18\n#### 18",
    }
    wrong_step = "She has 16 - 3 - 4 = 10 eggs left.\nShe makes 9 * 2 = 18 dollars.\n#### 18"
    scores = process_gsm8k_chain(doc, [wrong_step])
    assert scores["exact_match"] == 1.0 and scores["flexible_match"] == 1.0
    assert scores["chain_valid"] == 0.0 and scores["valid_and_correct"] == 0.0
    assert process_gsm8k_chain(doc, [doc["answer"]])["valid_and_correct"] == 1.0
    wrong_question = "16 - 3 - 4 = 9\n9 * 3 = 27\n#### 27"  # true arithmetic, wrong price: valid, not correct
    assert process_gsm8k_chain(doc, [wrong_question]) == {
        "exact_match": 0.0,
        "flexible_match": 0.0,
        "chain_valid": 1.0,
        "valid_and_correct": 0.0,
        "statements": 2.0,
    }


@pytest.mark.parametrize(
    "text",
    [
        "Let X be the price. X*25% = $19.50, so X = $26.",
        "3 times 4 = 12",
        "250=(5/2)x",
        "Meet at 6:00+48=6:48 PM",
        "15 pages x 1/3 = 5 pages",
        "17/3 = 5 and 2/3 loads",
    ],
)
def test_text_around_arithmetic_is_not_misread(text):
    """Variables, words and clock times around numbers make a statement uncheckable, never false."""
    assert all(s.holds for s in find_statements(text))


def test_rounding_to_the_written_precision():
    assert check_chain("10/3 = 3.33").valid and check_chain("100/7 = 14.29").valid
    assert not check_chain("10/3 = 3.4").valid
    assert not check_chain("9 * 2 = 18.4").valid  # an integer result must be written exactly


def test_chains_without_statements():
    """Valid only if the answer is a number of the question (nothing had to be computed)."""
    assert not check_chain("The answer is 42.", answer="42", question="How many are 6 sevens?").valid
    assert check_chain("He still has 15 trees.", answer="15", question="There are 15 trees. How many?").valid


def test_safe_eval_rejects_code():
    assert safe_eval("(2 + 3) * 4 / 8") == 2.5
    for expression in ("__import__('os').system('true')", "len([1])", "a + 1", "2 ** 10000"):
        with pytest.raises((ValueError, ArithmeticError)):
            safe_eval(expression)


def test_reference_solutions_are_almost_all_valid():
    """GSM8K's own test solutions: the checker finds their steps and nearly all hold (the few exceptions are
    algebra without checkable statements and genuine slips in the references)."""
    rows = [json.loads(line) for line in (DATA_DIR / "gsm8k" / "test.jsonl").read_text().splitlines()]
    checks = [check_chain(r["answer"], r["answer"].split("####")[-1].strip(), r["question"]) for r in rows]
    assert sum(c.valid for c in checks) / len(checks) > 0.97
    assert sum(c.num_statements for c in checks) > 4 * len(rows)
