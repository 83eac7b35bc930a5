"""Subscription filters: the attribute part of Pub/Sub's filter syntax.

Google's "Filter messages" page defines a filter over ``attributes``:

* ``attributes.KEY = "value"`` and ``attributes.KEY != "value"``;
* ``attributes:KEY`` (the attribute exists);
* ``hasPrefix(attributes.KEY, "prefix")``;
* ``NOT`` (or ``-``) before any of these, ``AND`` and ``OR`` between them, and
  parentheses. The page says ``AND`` and ``OR`` cannot be mixed without
  parentheses; this parser refuses such a mix, as the service does.

A key is a bare name (letters, digits, ``_`` and ``-``) or a quoted string;
values are double- or single-quoted strings with backslash escapes. The filter
is at most 256 bytes. Anything else (``hasPrefix`` on ``data``, regular
expressions, numbers) is refused with :class:`FilterError`: the emulator only
speaks the attribute filters the documents list.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

__all__ = ["MAX_FILTER_BYTES", "FilterError", "compile_filter"]

#: The service's limit on a filter's length ("Filter ... 256 bytes").
MAX_FILTER_BYTES = 256

Predicate = Callable[[Mapping[str, str]], bool]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>!=|=|:|\(|\)|,|-)
      | (?P<word>[A-Za-z_][A-Za-z0-9_.\-]*)
    )""",
    re.VERBOSE,
)


class FilterError(ValueError):
    """Raised when a filter is not one the emulator understands."""


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise FilterError(f"invalid filter near {text[position : position + 20]!r}")
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            raise FilterError(f"invalid filter: expected {value or kind}, got {token!r}")
        self.at += 1
        return token[1]

    def expression(self) -> Predicate:
        first = self.term()
        joiner: str | None = None
        parts = [first]
        while (
            (token := self.peek()) is not None
            and token == ("word", token[1])
            and (token[1] in ("AND", "OR"))
        ):
            if joiner is not None and token[1] != joiner:
                raise FilterError("invalid filter: mixing AND and OR needs parentheses")
            joiner = token[1]
            self.at += 1
            parts.append(self.term())
        if joiner == "OR":
            return lambda attrs: any(part(attrs) for part in parts)
        if joiner == "AND":
            return lambda attrs: all(part(attrs) for part in parts)
        return first

    def term(self) -> Predicate:
        token = self.peek()
        if token is None:
            raise FilterError("invalid filter: unexpected end")
        if token in (("word", "NOT"), ("op", "-")):
            self.at += 1
            inner = self.term()
            return lambda attrs: not inner(attrs)
        if token == ("op", "("):
            self.at += 1
            inner = self.expression()
            self.take("op", ")")
            return inner
        if token == ("word", "hasPrefix"):
            self.at += 1
            self.take("op", "(")
            key = self.key()
            self.take("op", ",")
            prefix = _unquote(self.take("string"))
            self.take("op", ")")
            return lambda attrs: key in attrs and attrs[key].startswith(prefix)
        key = self.key()
        op = self.take("op")
        if op == ":":
            return lambda attrs: key in attrs
        if op not in ("=", "!="):
            raise FilterError(f"invalid filter: unexpected {op!r}")
        value = _unquote(self.take("string"))
        if op == "=":
            return lambda attrs: attrs.get(key) == value
        return lambda attrs: attrs.get(key) != value

    def key(self) -> str:
        token = self.peek()
        if token is None:
            raise FilterError("invalid filter: expected attributes.KEY")
        if token[0] == "word" and token[1].startswith("attributes."):
            self.at += 1
            name = token[1][len("attributes.") :]
            if not name:
                raise FilterError("invalid filter: empty attribute key")
            return name
        raise FilterError(f"invalid filter: only attribute filters are supported, got {token[1]!r}")


def compile_filter(text: str) -> Predicate | None:
    """A predicate over a message's attributes for ``text`` (``None`` for an empty filter).

    Raises:
        FilterError: the filter is too long or not in the supported syntax.
    """
    if not text:
        return None
    if len(text.encode("utf-8")) > MAX_FILTER_BYTES:
        raise FilterError(f"filter is longer than {MAX_FILTER_BYTES} bytes")
    # ``attributes:KEY`` tokenises as word "attributes" ":" word: rewrite to one token.
    tokens = _tokens(text)
    merged: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        if (
            tokens[i] == ("word", "attributes")
            and i + 2 < len(tokens)
            and tokens[i + 1] == ("op", ":")
            and tokens[i + 2][0] in ("word", "string")
        ):
            key = tokens[i + 2][1]
            key = _unquote(key) if tokens[i + 2][0] == "string" else key
            merged += [("word", f"attributes.{key}"), ("op", ":")]
            i += 3
            continue
        merged.append(tokens[i])
        i += 1
    parser = _Parser(merged)
    predicate = parser.expression()
    if parser.peek() is not None:
        raise FilterError(f"invalid filter: unexpected {parser.peek()!r}")
    return predicate
