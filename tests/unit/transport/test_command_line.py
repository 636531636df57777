"""command_line: argv as one remote shell command line, each word quoted once; long words (scripts) come
from a cache, quoted exactly as short ones are."""

from __future__ import annotations

import shlex
import subprocess

from fleetfix.transport.base import command_line

SCRIPT = "echo 'it''s' \"$HOME\" `id` $(true); \\\n" * 400  # ~16 KB: over the cached length


def test_every_word_is_quoted_as_shlex_quotes_it() -> None:
    argv = ["sh", "-c", SCRIPT, "sh", "a b", "", "it's"]
    assert command_line(argv) == shlex.join(argv)
    assert command_line(argv) == shlex.join(argv)  # the second time from the cache: the same text


def test_a_long_word_reaches_the_shell_unchanged() -> None:
    line = command_line(["printf", "%s", SCRIPT])
    shown = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True).stdout
    assert shown == SCRIPT


def test_a_cached_quoting_is_never_another_words() -> None:
    other = SCRIPT.replace("it", "IT")
    assert command_line([SCRIPT]) != command_line([other])
    assert shlex.split(command_line([other])) == [other]
