"""Difficulty update rules against slow, obvious references (docs/algo/diva_grpo.md)."""

import numpy as np
import pytest

from verl_ext.config import DifficultyConfig
from verl_ext.difficulty.rules import bin_index, binned_update, continuous_update, make_update_rule


def reference_continuous(d, alpha, eta=4.0, lo=1.0, hi=9.0):
    return min(max(d + eta * (0.5 - alpha), lo), hi)


def reference_released_bins(d, alpha, lo=1.0, hi=9.0):
    # The authors' released table, written out as if-chains.
    if alpha <= 0.05:
        change = 2
    elif alpha <= 0.3:
        change = 1
    elif alpha <= 0.5:
        change = 0
    elif alpha <= 0.7:
        change = -1
    else:
        change = -2
    return min(max(d + change, lo), hi)


def test_continuous_matches_reference_on_a_grid():
    rule = make_update_rule(DifficultyConfig())
    d = np.repeat(np.arange(1.0, 9.5, 0.5), 21)
    alpha = np.tile(np.linspace(0.0, 1.0, 21), 17)
    got = rule(d, alpha)
    want = np.array([reference_continuous(a, b) for a, b in zip(d, alpha, strict=True)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_continuous_paper_values():
    # eta = 4: all wrong -> +2, all right -> -2, half right -> unchanged.
    np.testing.assert_allclose(continuous_update([5.0, 5.0, 5.0], [0.0, 1.0, 0.5], 4.0, 1.0, 9.0), [7.0, 3.0, 5.0])


@pytest.mark.parametrize(
    "alpha, change",
    [
        (0.0, 2),
        (0.05, 2),  # edge: lower bin
        (0.050001, 1),
        (0.3, 1),
        (0.30001, 0),
        (0.5, 0),
        (0.50001, -1),
        (0.7, -1),
        (0.70001, -2),
        (1.0, -2),
    ],
)
def test_released_bin_table_and_edges(alpha, change):
    rule = make_update_rule(DifficultyConfig(rule="binned"))
    assert rule(np.array([5.0]), np.array([alpha]))[0] == 5.0 + change
    assert reference_released_bins(5.0, alpha) == 5.0 + change


def test_binned_matches_reference_on_a_grid():
    rule = make_update_rule(DifficultyConfig(rule="binned"))
    alphas = np.concatenate([np.linspace(0, 1, 101), [0.05, 0.3, 0.5, 0.7]])
    for d0 in (1.0, 2.0, 5.0, 8.5, 9.0):
        got = rule(np.full(alphas.size, d0), alphas)
        want = [reference_released_bins(d0, a) for a in alphas]
        np.testing.assert_array_equal(got, want)


def test_bin_index_puts_edge_values_in_lower_bin():
    edges = (0.05, 0.3, 0.5, 0.7, 1.0)
    np.testing.assert_array_equal(bin_index([0.05, 0.3, 0.5, 0.7, 1.0], edges), [0, 1, 2, 3, 4])


def test_configurable_bins():
    out = binned_update([4.0, 4.0], [0.2, 0.9], bin_edges=(0.5, 1.0), bin_changes=(0.5, -0.5), d_min=1, d_max=9)
    np.testing.assert_array_equal(out, [4.5, 3.5])


def test_clipping_at_both_bounds():
    for rule_name in ("continuous", "binned"):
        rule = make_update_rule(DifficultyConfig(rule=rule_name))
        np.testing.assert_array_equal(rule(np.array([8.5, 1.5]), np.array([0.0, 1.0])), [9.0, 1.0])
        np.testing.assert_array_equal(rule(np.array([9.0, 1.0]), np.array([0.0, 1.0])), [9.0, 1.0])


def test_deterministic():
    rng = np.random.default_rng(0)
    d, a = rng.uniform(1, 9, 1000), rng.uniform(0, 1, 1000)
    for rule_name in ("continuous", "binned"):
        cfg = DifficultyConfig(rule=rule_name)
        np.testing.assert_array_equal(make_update_rule(cfg)(d, a), make_update_rule(cfg)(d, a))


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"rule": "linear"}, "rule"),
        ({"alpha_source": "tokens"}, "alpha_source"),
        ({"d_init": 10.0}, "d_init"),
        ({"eta": float("nan")}, "eta"),
        ({"rule": "binned", "bin_edges": (0.5, 1.0), "bin_changes": (1.0,)}, "bin_changes"),
        ({"rule": "binned", "bin_edges": (0.5, 0.4, 1.0), "bin_changes": (1.0, 0.0, -1.0)}, "strictly increasing"),
        ({"rule": "binned", "bin_edges": (0.5, 0.9), "bin_changes": (1.0, -1.0)}, "end at 1.0"),
    ],
)
def test_bad_rule_config_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        make_update_rule(DifficultyConfig(**overrides))
