"""Linear-time matching of request text: the one way a pattern that reads what a client (or a
policy) wrote is compiled (docs/serve.md "Linear time").

Python's `re` backtracks: `a*a*b` against a run of `a`s, or `\\s*/?\\s*` against a run of
spaces, takes time quadratic (or worse) in the text, and it holds the GIL while it does, so a
match running "in a thread" still stops the event loop. RE2 (`google-re2`) matches in time
linear in the text and releases the GIL while it matches. What RE2 cannot express —
backreferences, lookahead and lookbehind, conditionals, atomic groups, possessive
quantifiers — is refused when the pattern is compiled, in one line naming the construct, so a
service never starts with a pattern it would have to run some other way.

Semantics follow RE2 where it differs from `re`: `\\d`, `\\w`, `\\s` and `\\b` are ASCII-only,
`$` without `MULTILINE` matches only at the very end (not before a final newline), and `\\Z` is
spelled `\\z`.
"""

from __future__ import annotations

from typing import Any

import re2

FLAGS = {"IGNORECASE": "i", "MULTILINE": "m", "DOTALL": "s"}
"""The `re` flag names a config may give, as RE2 inline flags."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is our one-line error, not a line on stderr too

try:  # the parser `re.compile` uses; its node names say which construct RE2 lacks
    from re import _parser as _sre_parse  # Python >= 3.11
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_UNSUPPORTED = {
    "GROUPREF": "a backreference (\\1 or (?P=name))",
    "GROUPREF_EXISTS": "a conditional group ((?(1)...|...))",
    "ASSERT": "a lookahead or lookbehind ((?=...), (?<=...))",
    "ASSERT_NOT": "a negative lookahead or lookbehind ((?!...), (?<!...))",
    "ATOMIC_GROUP": "an atomic group ((?>...))",
    "POSSESSIVE_REPEAT": "a possessive quantifier (*+, ++, ?+)",
}


class UnsupportedPattern(ValueError):
    """A pattern RE2 cannot run: the message is one line naming the construct."""


def _constructs(parsed: Any) -> list[str]:
    """Names of the `_UNSUPPORTED` constructs anywhere in an `sre` parse tree, in order."""
    found: list[str] = []
    stack = [parsed]
    while stack:
        node = stack.pop()
        if isinstance(node, list | tuple) or type(node).__name__ == "SubPattern":
            items = list(node.data) if type(node).__name__ == "SubPattern" else list(node)
            for entry in items:
                if isinstance(entry, tuple) and entry and hasattr(entry[0], "name"):
                    name = entry[0].name
                    if name in _UNSUPPORTED and _UNSUPPORTED[name] not in found:
                        found.append(_UNSUPPORTED[name])
                stack.append(entry)
    return found


def compile_linear(pattern: str, flags: list[str] | tuple[str, ...] = ()) -> Any:
    """`pattern` (Python `re` syntax, with `flags` by name) compiled by RE2. Raises
    `re.error` for a pattern that is not a regular expression at all and `UnsupportedPattern`
    for one RE2 cannot run in linear time."""
    inline = "".join(FLAGS[f] for f in flags)
    parsed = _sre_parse.parse(pattern, 0)  # raises re.error: not a pattern at all
    try:
        return re2.compile(f"(?{inline}){pattern}" if inline else pattern, _OPTIONS)
    except re2.error as exc:
        found = _constructs(parsed)
        why = " and ".join(found) if found else _re2_reason(exc)
        raise UnsupportedPattern(
            f"uses {why}, which linear-time matching (RE2) cannot run; rewrite the pattern without it"
        ) from None


def _re2_reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else str(exc)
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if "\\Z" in text:
        return "\\Z (RE2 spells the end of the text \\z)"
    return f"a construct RE2 does not accept ({text})"


def overescaped(pattern: str) -> str | None:
    """The first place `pattern` holds a doubled backslash before a character that needed none
    of it (the compiled `\\\\boxed\\\\{` of a pattern pasted with one backslash level too many:
    it matches a literal backslash and a brace, not a brace), or None."""
    i = 0
    while i < len(pattern) - 1:
        if pattern[i] != "\\":
            i += 1
            continue
        if pattern[i + 1] == "\\" and i + 2 < len(pattern) and pattern[i + 2] in "{}()[].*+?|^$":
            return pattern[max(0, i - 8) : i + 3]
        i += 2  # an escape and the character it escapes
    return None
