"""How ``kdvfs run`` words the end of a script that did not exit 0."""

from __future__ import annotations

import pytest

from kdvfs.runtime.cli.live.run import script_end


@pytest.mark.parametrize(("code", "words"), [
    (137, "the script was killed by SIGKILL (exit code 137)"),
    (143, "the script was killed by SIGTERM (exit code 143)"),
    (1, "the script exited with code 1"),
    (2, "the script exited with code 2"),
    (250, "the script exited with code 250"),
])
def test_a_killed_script_is_named_as_killed(code: int, words: str) -> None:
    assert script_end(code) == words
