"""Checks room, built-in kinds: prompts whose right answer soakd computes itself (pure).

Each prompt is one recognisable instruction, so the embedded simulator answers it right
(``solve``) and a real model at temperature 0 does too. The judge reads the answer the way
a reader would: the first number in it for ``number_words`` and ``arithmetic`` (none:
unparseable), the string itself anywhere in it for ``echo`` (an empty answer: unparseable).
"""

from __future__ import annotations

import random
import re
import string
from typing import Final

from soakd.checks.verdict import FAIL, PASS, UNPARSEABLE, Verdict

# fmt: off
_ONES: Final = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)
_TENS: Final = (
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
)
# fmt: on


def number_words(n: int) -> str:
    """0 <= n < 1000 in English words: ``347`` -> ``three hundred forty-seven``."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    hundreds, rest = divmod(n, 100)
    return f"{_ONES[hundreds]} hundred" + (f" {number_words(rest)}" if rest else "")


_WORDS_TO_NUMBER: Final = {number_words(n): n for n in range(1000)}

NUMBER_WORDS: Final = "Write the number {} in digits. Reply with the digits only."
ARITHMETIC: Final = "What is {} + {}? Reply with the number only."
ECHO: Final = "Repeat this text exactly, and nothing else: {}"
_NUMBER_WORDS_RE: Final = re.compile(r"Write the number ([a-z -]+) in digits\. Reply with")
_ARITHMETIC_RE: Final = re.compile(r"What is (\d+) \+ (\d+)\? Reply with the number only\.")
_ECHO_RE: Final = re.compile(r"Repeat this text exactly, and nothing else: (\S+)")
_NUMBER_RE: Final = re.compile(r"-?\d[\d,]*")
_ECHO_CHARS: Final = string.ascii_letters + string.digits


def make(kind: str, rng: random.Random) -> tuple[str, str]:
    """A built-in check of ``kind``: (prompt, the right answer)."""
    if kind == "number_words":
        n = rng.randrange(1000)
        return NUMBER_WORDS.format(number_words(n)), str(n)
    if kind == "arithmetic":
        a, b = rng.randrange(100), rng.randrange(100)
        return ARITHMETIC.format(a, b), str(a + b)
    if kind == "echo":
        text = "".join(rng.choice(_ECHO_CHARS) for _ in range(16))
        return ECHO.format(text), text
    raise ValueError(f"unknown check kind {kind!r}")


def judge(kind: str, expected: str, answer: str) -> Verdict:
    """The answer to a built-in check of ``kind`` whose right answer is ``expected``."""
    if kind == "echo":
        if not answer.strip():
            return Verdict(UNPARSEABLE)
        return Verdict(PASS if expected in answer else FAIL)
    found = _NUMBER_RE.search(answer)
    if found is None:
        return Verdict(UNPARSEABLE)
    return Verdict(PASS if found.group().replace(",", "") == expected else FAIL)


def solve(prompt: str) -> str | None:
    """The right answer to a built-in check's prompt (None: not one). The simulator's."""
    if (m := _ARITHMETIC_RE.search(prompt)) is not None:
        return str(int(m.group(1)) + int(m.group(2)))
    if (m := _NUMBER_WORDS_RE.search(prompt)) is not None:
        n = _WORDS_TO_NUMBER.get(m.group(1))
        return None if n is None else str(n)
    if (m := _ECHO_RE.search(prompt)) is not None:
        return m.group(1)
    return None
