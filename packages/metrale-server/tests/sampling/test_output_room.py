"""fit_max_tokens: the room a prompt leaves, the one rule of the core and the API."""

from __future__ import annotations

import pytest

from metrale_server.sampling.output_room import OutputRoomError, fit_max_tokens


def test_the_room_left_default_and_asked_for() -> None:
    assert fit_max_tokens(5, None, 10) == 5
    assert fit_max_tokens(5, None, 10, default=2) == 2
    assert fit_max_tokens(5, None, 10, default=9) == 5
    assert fit_max_tokens(5, 5, 10) == 5


def test_no_room_and_too_many_are_refused_naming_the_field() -> None:
    with pytest.raises(OutputRoomError) as no_room:
        fit_max_tokens(10, None, 10)
    assert "leaves no room for output" in str(no_room.value)
    with pytest.raises(OutputRoomError) as too_many:
        fit_max_tokens(5, 6, 10)
    assert too_many.value.describe(max_tokens_param="max_completion_tokens").startswith(
        "max_completion_tokens: the prompt (5 tokens) + max_completion_tokens (6)"
    )
