"""Leave-one-family-out margin choice (``benchmarks/learned/margin_information.py``) on made-up episodes."""

from __future__ import annotations

import numpy as np

from benchmarks.learned.margin_information import leave_one_family_out, summary


def made_results(pairs: int = 8, seeds: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two margins on 3 x 3 cells at the cells' budgets (0.5/1/2%): margin 0 saves 3% and is over budget on the
    episodes whose known quantity is high, margin 1 saves 1% and is always within; four families."""
    known = np.tile(np.array([0.0, 0.0, 1.0, 2.0]), (pairs, 1))[:, :seeds]
    results = np.zeros((2, pairs, 3, 3, seeds, 3))
    budgets = np.array([0.5, 1.0, 2.0])[None, :, None, None]
    results[0, ..., 0], results[1, ..., 0] = 3.0, 1.0
    over = (known >= 1.0)[:, None, None, :]
    results[0, ..., 1] = np.where(over, 2 * budgets, 0.5 * budgets)
    results[1, ..., 1] = 0.1 * budgets
    return results, np.repeat(np.array(["a", "b", "c", "d"]), pairs // 4), known


def test_the_bar_takes_the_compliant_margin_and_a_known_quantity_earns_the_rest() -> None:
    results, families, known = made_results()
    bar = leave_one_family_out(results, families, [])
    assert np.allclose(bar[..., 0], 1.0) and np.all(bar[..., 1] == 1.0)  # margin 0 is within in only half
    binned = leave_one_family_out(results, families, [known])
    low = (known < 1.0)[:, None, None, :].repeat(3, 1).repeat(3, 2)
    assert np.allclose(binned[..., 0][low], 3.0) and np.allclose(binned[..., 0][~low], 1.0)
    assert np.all(binned[..., 1] == 1.0)
    assert summary(binned, families)["saved_pct"] == 2.0 and summary(bar, families)["weakest_cell_family"] == 1.0
