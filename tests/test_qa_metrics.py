import pytest

from capo_envs.qa.metrics import exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    "raw, normalised",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple, a day ", "apple day"),
        ("Theatre", "theatre"),  # 'the' only as a whole word
        ("1,987", "1987"),
        ("Zoë", "zoë"),
    ],
)
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_exact_match_uses_aliases():
    assert exact_match("the United States", ["USA", "United States"]) == 1.0
    assert exact_match("United Kingdom", ["USA", "United States"]) == 0.0
    assert exact_match("anything", []) == 0.0


def test_f1():
    assert f1_score("new york city", ["New York"]) == pytest.approx(0.8)
    assert f1_score("paris", ["London"]) == 0.0
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("no", ["no"]) == 1.0
    assert f1_score("", ["x"]) == 0.0
