"""DVReward scoring: P(yes)/(P(yes)+P(no)), fallbacks, DSG gating, aggregation golden numbers."""

import math

import pytest

from verl_ext.rewards.dvreward.scoring import aggregate, gate_by_parents, hard_answer, normalise_answer, p_yes


@pytest.mark.parametrize("method", ["geometric", "mean", "sum_mean"])
def test_aggregation_golden_numbers(golden, method):
    result = aggregate(list(golden["p"].values()), golden["kinds"], method)
    assert result.score == pytest.approx(golden["score"][method], abs=1e-4)
    assert (result.semantic, result.quality) == (pytest.approx(0.6), pytest.approx(0.8))
    assert result.n_failed == 0


def test_p_yes_sums_normalised_first_token_candidates():
    # AlphaGRPO calculate_confidence_score: sum exp(logprob) of candidates normalising to yes / no.
    candidates = [(" Yes", math.log(0.5)), ("yes.", math.log(0.1)), ("NO", math.log(0.2)), ("maybe", math.log(0.15))]
    assert p_yes(candidates, "Yes") == pytest.approx(0.6 / 0.8)


def test_hard_fallback_and_binary_mode():
    no_yes_no = [("Sure", -0.1), ("I", -3.0)]
    assert p_yes(no_yes_no, "Yes, it is.") == 1.0
    assert p_yes(no_yes_no, " no") == 0.0
    # binary mode ignores the log-probs and reads the answer text
    assert p_yes([("no", math.log(0.9)), ("yes", math.log(0.1))], "yes", binary=True) == 1.0
    assert normalise_answer(' "Yes!" ') == "yes"
    assert hard_answer("") is None


def test_neither_yes_nor_no_is_a_fault_not_a_no():
    assert p_yes([("maybe", -0.1)], "maybe") is None
    assert p_yes([], None) is None


def test_dsg_gating_zeroes_children_of_a_no_and_propagates():
    scores = [0.2, 0.9, 0.8, 0.7]
    parents = [[], [0], [1], []]  # 2 is a grandchild of 0
    assert gate_by_parents(scores, parents) == [0.2, 0.0, 0.0, 0.7]
    # an unknown parent (judge failed) does not gate its child
    assert gate_by_parents([None, 0.9], [[], [0]]) == [None, 0.9]


def test_failed_questions_are_excluded_and_counted():
    result = aggregate([0.9, None, 0.8], ["semantic", "semantic", "quality"], "sum_mean")
    assert result.score == pytest.approx(0.85)
    assert result.semantic == pytest.approx(0.9)
    assert result.n_failed == 1 and result.per_question == (0.9, None, 0.8)


def test_unjudgeable_samples_have_no_score():
    kinds = ["semantic", "semantic", "quality"]
    assert aggregate([None, None, 0.8], kinds).score is None  # every semantic question failed
    assert aggregate([], []).score is None  # no questions at all
    assert aggregate([0.9, None, None], kinds, "sum_mean", min_answered_fraction=0.5).score is None
    # a kind with no questions counts as 1.0 (reference behaviour)
    assert aggregate([0.64], ["semantic"]).score == pytest.approx(0.8)


def test_unknown_aggregation_names_the_config_key():
    with pytest.raises(ValueError, match="reward_kwargs.dvreward.aggregation"):
        aggregate([0.5], ["semantic"], "median")
