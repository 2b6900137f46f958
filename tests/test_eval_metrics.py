"""Metrics equal hand-computed values (RULER string match, LongBench metrics)."""

from __future__ import annotations

import random

import pytest

from polykv_search.evaluation.metrics import (
    classification_score,
    code_sim_score,
    count_score,
    indel_ratio,
    lcs_length,
    longbench_score,
    normalize_answer,
    qa_f1_score,
    retrieval_score,
    rouge_l_score,
    ruler_postprocess,
    string_match_all,
    string_match_part,
)


# ------------------------------------------------------------------------------------ RULER
def test_string_match_all_is_the_mean_fraction_of_references_found_case_insensitive():
    preds = ["The numbers are 123 and 456.", "nothing here"]
    refs = [["123", "456", "789"], ["abc"]]
    assert string_match_all(preds, refs) == pytest.approx(100 * (2 / 3 + 0) / 2)
    assert string_match_all(["Keys: ABC-def"], [["abc-DEF"]]) == 100.0


def test_string_match_part_scores_one_when_any_reference_is_found():
    assert string_match_part(["answer ABC"], [["abc", "zzz"]]) == 100.0
    assert string_match_part(["answer ABC", "no"], [["abc"], ["yes"]]) == 50.0


def test_ruler_postprocess_strips_and_turns_control_characters_into_newlines():
    assert ruler_postprocess("  12\t34\x00 ") == "12\n34"


def test_string_match_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        string_match_all(["a"], [])


# --------------------------------------------------------------------------------- LongBench
def test_normalize_answer_lowers_and_drops_punctuation_articles_and_spaces():
    assert normalize_answer("The  Cat, an apple!") == "cat apple"


def test_qa_f1_on_a_hand_computed_case():
    # "cat sat on mat" vs "cat on mat": 3 common tokens, P = 3/4, R = 1, F1 = 6/7.
    assert qa_f1_score("The cat sat on the mat.", "a cat on a mat") == pytest.approx(6 / 7)
    assert qa_f1_score("dog", "cat") == 0.0


def test_rouge_l_counts_unique_words_like_the_rouge_package():
    # One sentence each; word sets of 5, LCS as a set {the, cat, on, mat} = 4: P = R = F = 0.8.
    assert rouge_l_score("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(0.8, abs=1e-6)


def test_rouge_l_is_summary_level_over_sentences():
    # Union LCS: ref "a c" gets {a} from "a b" and {c} from "c d"; ref "b d" adds {b, d}: 4/4.
    assert rouge_l_score("a b. c d", "a c. b d") == pytest.approx(1.0, abs=1e-6)


def test_rouge_l_of_an_empty_text_is_zero():
    assert rouge_l_score("", "some summary") == 0.0
    assert rouge_l_score("...", "some summary") == 0.0


def test_lcs_length_matches_the_dynamic_program():
    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("abc") for _ in range(rng.randint(0, 70)))
        b = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 70)))
        table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                table[i][j] = table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(table[i - 1][j], table[i][j - 1])
        assert lcs_length(a, b) == table[-1][-1]


def test_code_sim_takes_the_first_plain_line_and_its_indel_ratio():
    pred = "```python\n# a comment\nx = foo(1)\n"
    # "x = foo(1)" vs "x = foo(2)": 10 characters each, LCS 9, ratio 18/20.
    assert code_sim_score(pred, "x = foo(2)") == pytest.approx(0.9)
    assert indel_ratio("abcd", "abcd") == 1.0 and indel_ratio("ab", "cd") == 0.0
    assert code_sim_score("", "x") == 0.0 and code_sim_score("// only comments", "") == 1.0


def test_classification_drops_classes_contained_in_the_truth():
    classes = ["Location", "Location city", "Human"]
    assert classification_score("Type: Location city", "Location city", all_classes=classes) == 1.0
    assert classification_score("Human or Location", "Human", all_classes=classes) == 0.5
    assert classification_score("no idea", "Human", all_classes=classes) == 0.0


def test_count_and_retrieval_scores():
    assert count_score("There are 3 unique paragraphs out of 5", "3") == 0.5
    assert count_score("none", "3") == 0.0
    assert retrieval_score("Paragraph 7", "Paragraph 7") == 1.0
    assert retrieval_score("Paragraph 7 or 8", "Paragraph 8") == 0.5


def test_longbench_score_takes_the_best_reference_and_scales_to_100():
    preds = ["Paris", "london bridge"]
    answers = [["paris", "Lyon"], ["Berlin"]]
    assert longbench_score("hotpotqa", preds, answers) == pytest.approx(50.0)


def test_longbench_score_cuts_few_shot_predictions_to_their_first_line():
    classes = ["Location", "Human"]
    assert longbench_score("trec", ["\nLocation\nHuman"], [["Location"]], classes) == 100.0
    assert longbench_score("trec", ["Location Human"], [["Location"]], classes) == 50.0
    with pytest.raises(ValueError):
        longbench_score("nope", ["a"], [["a"]])
