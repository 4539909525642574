"""Plain-text files -> documents -> sentences, streamed line by line (a 10 GB file never sits in RAM).

What counts as a document (`documents=`):
  auto        a run of 3+ blank lines ends a document (a chapter in a Project Gutenberg book), and so
              does a WikiText article heading (" = Title = "); otherwise the file is one long document
  blank-line  every blank line ends a document (BERT's create_pretraining_data input format)
  file        one document per file
Project Gutenberg files are cut to the text between the "*** START OF" and "*** END OF" lines.

Inside a document, paragraphs (blank-line separated) are re-flowed into one line and split into
sentences (`split_sentences`). With `raw=True` nothing is re-flowed: every line, newline included, is
a "sentence" (character-level LMs must see the text exactly as written).

Bytes that are not UTF-8: with on_bad_utf8="skip" the line is dropped and counted in
`CorpusReader.skipped_lines`; with "error" a ValueError names the file and the byte offset.

    >>> split_sentences('Mr. Pip went home. "Was it late?" he asked. Yes.')
    ['Mr. Pip went home.', '"Was it late?" he asked.', 'Yes.']
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DOCUMENT_MODES = ("auto", "blank-line", "file")
PG_START = re.compile(rb"^\s*\*\*\*\s*START OF")
PG_END = re.compile(rb"^\s*\*\*\*\s*END OF")
WIKI_TITLE = re.compile(r"^ = [^=].* = $")  # " = Title = " (sections are " = = Section = = ")
PG_HEADER_LINES = 400
MAX_DOC_CHARS = 5_000_000  # a longer "document" is cut: keeps memory bounded on one-line corpora

# Abbreviations whose final period does not end a sentence (English prose, as in the Gutenberg books).
_ABBREV = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "rev", "gen", "col", "capt", "lt", "sgt",
           "mt", "vs", "etc", "no", "vol", "fig", "e.g", "i.e", "cf", "co", "inc", "ltd", "messrs", "esq"}
# A sentence ends at . ! ? (plus closing quotes/brackets) followed by space and a plausible sentence start.
_BOUNDARY = re.compile(r"""([.!?]+["'”’)\]]*)\s+(?=["'“‘(\[]?[A-Z0-9])""")


def split_sentences(paragraph: str) -> list[str]:
    """Rule-based sentence splitter: good enough for building NSP/SOP pairs, no model needed."""
    sentences, start = [], 0
    for m in _BOUNDARY.finditer(paragraph):
        before = paragraph[start:m.start(1)].rsplit(None, 1)
        last_word = before[-1].lower().lstrip("\"'“‘([") if before else ""
        if m.group(1) == "." and (last_word in _ABBREV or len(last_word) == 1 and last_word.isalpha()):
            continue  # "Mr." or an initial "J." does not end the sentence
        sentences.append(paragraph[start:m.end(1)].strip())
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


@dataclass
class Position:
    """Where reading stopped: enough to resume a streamed pass after the last finished shard."""
    file_index: int = 0
    byte_offset: int = 0
    in_body: bool | None = None   # inside a Gutenberg body (None: not yet known for this file)


@dataclass
class Document:
    sentences: list[str]
    source: str
    end: Position                # where the next document starts


@dataclass
class CorpusReader:
    files: list[Path]
    documents: str = "auto"
    raw: bool = False
    on_bad_utf8: str = "skip"
    skipped_lines: int = 0
    empty_files: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.files = [Path(f) for f in self.files]
        if self.documents not in DOCUMENT_MODES:
            raise ValueError(f"documents={self.documents!r}: expected one of {', '.join(DOCUMENT_MODES)}")
        if self.on_bad_utf8 not in ("skip", "error"):
            raise ValueError(f"on_bad_utf8={self.on_bad_utf8!r}: expected 'skip' or 'error'")
        for f in self.files:
            if not f.is_file():
                raise FileNotFoundError(f"{f}: no such file")

    def __iter__(self) -> Iterator[Document]:
        return self.read(Position())

    def read(self, start: Position) -> Iterator[Document]:
        """Documents from `start` on (a Position from an earlier Document.end)."""
        for index in range(start.file_index, len(self.files)):
            offset, in_body = (start.byte_offset, start.in_body) if index == start.file_index else (0, None)
            yield from self._read_file(index, offset, in_body)

    # -------------------------------------------------------------------------------------------
    def _lines(self, index: int, offset: int, in_body: bool | None):
        """(line_text, line_start_offset, in_body) for the usable lines of one file."""
        path = self.files[index]
        if in_body is None:  # first visit: a Gutenberg file has a START marker; look before reading
            if path.stat().st_size == 0:
                self.empty_files.append(str(path))
            with open(path, "rb") as fh:  # the marker sits in the first few dozen lines
                head = [line for _, line in zip(range(PG_HEADER_LINES), fh)]
            in_body = not any(PG_START.match(line) for line in head)
        with open(path, "rb") as fh:
            fh.seek(offset)
            pos = offset
            for raw in fh:
                line_start, pos = pos, pos + len(raw)
                if PG_START.match(raw):
                    in_body = True
                    continue
                if PG_END.match(raw):
                    in_body = False  # the licence follows; a later START (rare) would re-open it
                    continue
                if not in_body:
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    if self.on_bad_utf8 == "error":
                        raise ValueError(f"{path}: invalid UTF-8 at byte offset {line_start + err.start} "
                                         f"(use --on-bad-utf8 skip to drop such lines)") from None
                    self.skipped_lines += 1
                    continue
                if line_start == 0:
                    text = text.lstrip("\ufeff")  # BOM
                yield text, line_start, pos, in_body

    def _read_file(self, index: int, offset: int, in_body: bool | None) -> Iterator[Document]:
        source = str(self.files[index])
        lines: list[str] = []   # current document: raw lines (raw mode) or paragraphs
        paragraph: list[str] = []
        chars = blank_run = 0

        def flush(end: Position) -> Document | None:
            nonlocal lines, paragraph, chars
            if paragraph:
                lines.append(" ".join(paragraph))
                paragraph = []
            if self.raw:
                sentences = lines
                while sentences and not sentences[-1].strip():
                    sentences.pop()  # blank lines that only separated documents
                while sentences and not sentences[0].strip():
                    sentences.pop(0)
            else:
                sentences = [s for p in lines for s in split_sentences(p)]
            lines, chars = [], 0
            return Document(sentences, source, end) if sentences else None

        for text, line_start, line_end, body in self._lines(index, offset, in_body):
            stripped = text.strip()
            if self.documents == "auto" and WIKI_TITLE.match(text.rstrip("\r\n")) and (lines or paragraph):
                doc = flush(Position(index, line_start, body))  # the heading opens the next document
                if doc:
                    yield doc
            if not stripped:
                blank_run += 1
                if self.raw:
                    lines.append(text.replace("\r\n", "\n"))
                elif paragraph:
                    lines.append(" ".join(paragraph))
                    paragraph = []
                ends = (self.documents == "blank-line" or (self.documents == "auto" and blank_run == 3))
                if ends and (lines or paragraph):
                    doc = flush(Position(index, line_end, body))
                    if doc:
                        yield doc
                continue
            blank_run = 0
            if self.raw:
                lines.append(text.replace("\r\n", "\n"))
            else:
                paragraph.append(stripped)
            chars += len(text)
            if chars >= MAX_DOC_CHARS:
                doc = flush(Position(index, line_end, body))
                if doc:
                    yield doc
        doc = flush(Position(index + 1, 0, None))
        if doc:
            yield doc
