"Metrics: McNemar's orientation and exact p-value, binary metrics on hand-counted cases."
import math

import pytest

from forensicslab.metrics import binary_metrics, mcnemar


def test_mcnemar_orientation_and_exact_p():
    # a right where b is wrong on 5 cases, b right where a is wrong on 1, both right on 3, both wrong on 1
    a = [1] * 5 + [0] + [1] * 3 + [0]
    b = [0] * 5 + [1] + [1] * 3 + [0]
    r = mcnemar(a, b)
    assert (r["a_only"], r["b_only"]) == (5, 1)
    assert r["p_value"] == pytest.approx(2 * (1 + 6) / 2 ** 6)      # exact two-sided binomial, n = 6 discordant
    swapped = mcnemar(b, a)
    assert (swapped["a_only"], swapped["b_only"]) == (1, 5) and swapped["p_value"] == pytest.approx(r["p_value"])


def test_mcnemar_needs_paired_results():
    with pytest.raises(ValueError, match="paired"):
        mcnemar([1, 0], [1])
    assert mcnemar([1, 1], [1, 1]) == {"a_only": 0, "b_only": 0, "p_value": 1.0}


def test_binary_metrics_hand_counted():
    m = binary_metrics([1, 1, 1, 0, 0], [1, 0, 1, 1, 0])   # tp 2, fn 1, fp 1, tn 1
    assert m["recall"] == pytest.approx(2 / 3) and m["specificity"] == pytest.approx(1 / 2)
    assert m["precision"] == pytest.approx(2 / 3) and m["f1"] == pytest.approx(2 / 3) and m["accuracy"] == pytest.approx(3 / 5)
    assert math.isnan(binary_metrics([0, 0], [0, 0])["recall"])


def test_mcnemar_counts_only_discordant_pairs():
    # 2 cases only a is right on, 0 only b: the p-value is 2 * (1/2)^2 = 0.5; concordant cases change neither count nor p
    a, b = [1, 1], [0, 0]
    base = mcnemar(a, b)
    assert (base["a_only"], base["b_only"]) == (2, 0) and base["p_value"] == pytest.approx(0.5)
    padded = mcnemar(a + [1] * 7 + [0] * 4, b + [1] * 7 + [0] * 4)   # 7 both right, 4 both wrong
    assert padded == base
