"""vLLM V1's request phases from the engine's timestamps (``metrics._phases``): each phase
only where both of its ends are known (an embedding has no decode, a request that never ran
has no phase)."""

from __future__ import annotations

import pytest
from ironlm.entrypoints.openai.request_tracker import _phases


def test_each_phase_from_its_two_timestamps() -> None:
    times = {"arrival_time": 10.0, "first_scheduled_time": 10.5, "first_token_time": 11.0,
             "last_token_time": 13.0}
    assert _phases(times) == pytest.approx(
        {"queue": 0.5, "prefill": 0.5, "decode": 2.0, "inference": 2.5})
    assert _phases({"arrival_time": 10.0, "first_scheduled_time": 10.5}) == {"queue": 0.5}
    assert _phases({"arrival_time": 10.0}) == {}
    # clocks never give a negative phase (a token stamped in the step it was scheduled)
    assert _phases({"first_scheduled_time": 2.0, "first_token_time": 1.999}) == {"prefill": 0.0}
