"""Per-token text work of a streamed request, in time proportional to the new text only: it runs on the
server's event loop, once per generated token of every request, so nothing here may grow with the output
or with the stop strings.

- `IncrementalDecoder`: token ids -> text pieces. Decoding the whole output again at every token (what
  `inference.generate.TextStreamer` does, simple and right for one local stream) costs O(n) at token n;
  here only a window is decoded: the tokens since the last piece plus the piece before them, so that
  merges and spaces come out as a full decode gives them (the window's first token is decoded in both
  halves of the difference, so a decoder that treats a sequence's first token specially does it twice
  and it cancels). A piece ending in an incomplete UTF-8 character (U+FFFD) waits for the next token.
- `StopMatcher`: one Knuth-Morris-Pratt automaton per stop string, fed each new character once. Its state
  is the longest prefix of that stop string the text ends with, which is exactly how much text must be held
  back (it may still become the stop string) and nothing more.

    >>> m = StopMatcher(["</s>"])
    >>> m.feed("ab</"), m.held
    (None, 2)
    >>> m.feed("s>x")
    1
"""
from __future__ import annotations

# a piece still ending in U+FFFD this many tokens after the last piece is a real replacement character (an
# incomplete UTF-8 character spans at most 4 byte tokens): emit it rather than widen the window forever
MAX_PENDING_TOKENS = 8


class IncrementalDecoder:
    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # the window starts here: the tokens of the previous piece, for context
        self.read = 0    # tokens before this are shown

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip)

    def push(self, token: int) -> str:
        """The new text `token` completes ('' while a UTF-8 character is still incomplete)."""
        self.ids.append(int(token))
        before, text = self._decode(self.prefix, self.read), self._decode(self.prefix)
        if text.endswith("\ufffd") and len(self.ids) - self.read < MAX_PENDING_TOKENS:
            return ""
        piece = text[len(before):]
        if piece:
            self.prefix, self.read = self.read, len(self.ids)
        elif text == before:  # tokens with no text (skipped specials): nothing to wait for
            self.read = len(self.ids)
        return piece

    def flush(self) -> str:
        """Whatever is still held (the output ended)."""
        piece = self._decode(self.prefix)[len(self._decode(self.prefix, self.read)):]
        self.prefix = self.read = len(self.ids)
        return piece


def _failure(s: str) -> list[int]:
    """KMP failure table: fail[i] = length of the longest proper prefix of s[:i + 1] that is also its suffix."""
    fail, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopMatcher:
    """Finds the first stop string in a text given piece by piece; see the module docstring."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.fail = [_failure(s) for s in self.stops]
        self.state = [0] * len(self.stops)

    @property
    def held(self) -> int:
        """How many trailing characters of the text so far may still be the start of a stop string."""
        return max(self.state, default=0)

    def feed(self, text: str) -> int | None:
        """Take the next characters. When a stop string is now complete: the offset in `text` where the
        earliest-starting one begins (negative: it began in earlier text, within `held`); else None."""
        first = None
        for n, (s, fail) in enumerate(zip(self.stops, self.fail)):
            k = self.state[n]
            for i, c in enumerate(text):
                while k and s[k] != c:
                    k = fail[k - 1]
                if s[k] == c:
                    k += 1
                if k == len(s):
                    start = i + 1 - k
                    first = start if first is None else min(first, start)
                    k = fail[k - 1]
                    break
            self.state[n] = k
        return first
