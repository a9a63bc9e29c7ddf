"""The run summary's JSON form: seconds and fractions inside, ``_ms`` and ``_pct`` keys outside, read back the
same; a missing, unknown or other version's key refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.runtime.controller.model.json_form import JsonFormError
from kdvfs.runtime.controller.model.run_summary import HostCost, LeadIn, Quantiles, RunSummary
from tests.runtime.summaries import run_summary

seconds = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
maybe_seconds = st.none() | seconds


@given(thread_s=seconds, hooks_s=maybe_seconds, share=maybe_seconds, wakes=st.integers(0, 10**6))
def test_a_record_reads_back_what_it_wrote(thread_s: float, hooks_s: float | None, share: float | None,
                                           wakes: int) -> None:
    cost = HostCost(thread_s, None, hooks_s, thread_s, None, None, share, share, wakes, None)
    document = json.loads(json.dumps(cost.to_json()))
    assert document["thread_ms"] == thread_s * 1e3 and document["step_share_pct"] == (None if share is None
                                                                                        else share * 100)
    back = HostCost.from_json(document)
    assert back.thread_s == pytest.approx(thread_s, rel=1e-12) and back.wakes == wakes
    assert (back.hooks_s is None) == (hooks_s is None)


def test_a_nested_record_in_ms_is_written_in_ms() -> None:
    lead_in = LeadIn(3, 1, 0, Quantiles(0.002, 0.004))
    assert lead_in.to_json() == {"waits": 3, "late": 1, "missed": 0, "late_ms": {"median": 2.0, "p99": 4.0}}
    assert LeadIn.from_json(lead_in.to_json()) == lead_in


def test_a_missing_or_unknown_key_or_another_version_is_refused() -> None:
    document = run_summary().to_json()
    assert document["schema_version"] == 2 and RunSummary.from_json(document).steps == 100
    with pytest.raises(JsonFormError, match=r"missing key.*'steps'"):
        RunSummary.from_json({k: v for k, v in document.items() if k != "steps"})
    with pytest.raises(JsonFormError, match=r"unknown key.*'extra'"):
        RunSummary.from_json({**document, "extra": 1})
    with pytest.raises(JsonFormError, match="schema version 0, not 2"):
        RunSummary.from_json({**document, "schema_version": 0})
