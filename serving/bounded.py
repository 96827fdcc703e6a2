"""Tokenise only the characters that can reach the model: a prefix of each long text, the same token ids.

Texts are truncated to `max_length` tokens, so most of a long text used to be tokenised only to be dropped.
`BoundedTokenizer` tokenises a prefix of each long text instead, cut where a word ends, and doubles it until the
prefix alone yields `max_length` tokens or is the whole text. The encodings it returns equal the tokenizer's
encodings of the whole texts, because:

- A space that follows a letter, number, punctuation mark or symbol ends a word for the normalisers and
  pre-tokenisers of the BERT family (WordPiece with the BERT normaliser, byte-level BPE, SentencePiece's
  Metaspace; `_NORMALIZERS` and `_PRE_TOKENIZERS` list the ones this holds for): the tokens of the text cut
  there are the first tokens of the whole text. A tokenizer with any other part gets its texts whole.
- Truncation keeps the first tokens, so a cut text of at least `max_length` tokens truncates to the same ones.
- A pair truncated longest first keeps a number of tokens of each text that depends only on the texts' lengths
  up to `max_length`, with one exception: when both are cut to halves of an odd budget, the longer text gets the
  extra token. For such a pair (both texts long) both texts are counted whole, which is linear in their length.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer

from serving.validation import Text

# The first prefix, in characters per token of max_length, until texts seen tell better (English prose takes about
# 4.5 per token of BERT's WordPiece); then the characters per token of the texts cut so far, times CHARS_MARGIN.
CHARS_PER_TOKEN = 8.0
CHARS_MARGIN = 1.5
_MAX_TRIES = 16  # spaces looked at for a cut before the prefix is doubled instead
# Parts whose output for a text cut at a word's end is the start of their output for the whole text.
_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "Nmt", "StripAccents", "Strip",
                "Prepend", "Precompiled", "ByteLevel", "Replace", "Sequence"}  # fmt: skip
_SPACE_SPLITTERS = {"BertPreTokenizer", "ByteLevel", "Metaspace", "Whitespace", "WhitespaceSplit"}
_PRE_TOKENIZERS = _SPACE_SPLITTERS | {"Punctuation", "Digits", "Sequence"}
_SPACES_ONLY = re.compile(r" (\{\d*,?\d*\}|[+*?])?")  # a Replace pattern such as " {2,}" matches spaces alone


def ends_word(char: str) -> bool:
    """A letter, number, punctuation mark or symbol: no normaliser removes it or turns it into a space (U+2581 and
    U+FFFD excepted, which SentencePiece's normaliser maps to a space)."""
    return unicodedata.category(char)[0] in "LNPS" and char not in "\u2581\ufffd"


def cut(text: str, limit: int) -> int:
    """The longest prefix of `text` of at most `limit` characters that ends where a word ends, as its length: the
    next character is a space and the last one `ends_word`. 0 if none of the last `_MAX_TRIES` spaces qualifies."""
    end = text.rfind(" ", 1, limit + 1)
    for _ in range(_MAX_TRIES):
        if end <= 0 or ends_word(text[end - 1]):
            return max(end, 0)
        end = text.rfind(" ", 1, end)
    return 0


def cuts_keep_tokens(tokenizer: Tokenizer) -> bool:
    """Whether a text cut by `cut` yields the first tokens of the whole text under `tokenizer`."""
    try:
        normalizer = json.loads(tokenizer.normalizer.__getstate__()) if tokenizer.normalizer else None
        pre_tokenizer = json.loads(tokenizer.pre_tokenizer.__getstate__()) if tokenizer.pre_tokenizer else None
    except Exception:  # a custom (Python) part has no description: it is not one of the known ones
        return False
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    return (
        _local(normalizer)
        and pre_tokenizer is not None
        and _splits_at_spaces(pre_tokenizer)
        and not any(c.isspace() or c == "\u2581" for content in added for c in content)  # an added "New York"
    )


def _local(normalizer: dict | None) -> bool:
    if normalizer is None:
        return True
    kind = normalizer["type"]
    if kind == "Sequence":
        return all(_local(n) for n in normalizer["normalizers"])
    if kind == "Replace":  # a pattern that could match across the cut, or a replacement that adds a space, is not
        pattern, content = normalizer["pattern"], normalizer["content"]
        if "Regex" in pattern:  # runs of spaces made one space (SentencePiece's normaliser) keep words apart
            return _SPACES_ONLY.fullmatch(pattern["Regex"]) is not None and content == " "
        return not any(c.isspace() for c in pattern["String"] + content)
    return kind in _NORMALIZERS


def _splits_at_spaces(pre_tokenizer: dict) -> bool:
    parts = pre_tokenizer["pretokenizers"] if pre_tokenizer["type"] == "Sequence" else [pre_tokenizer]
    for part in parts:
        kind = part["type"]
        if kind not in _PRE_TOKENIZERS or kind == "Sequence":
            return False
        if kind == "ByteLevel" and not part.get("use_regex", True):
            return False
        if kind == "Metaspace" and (not part.get("split", True) or part.get("replacement") != "\u2581"):
            return False
    return any(part["type"] in _SPACE_SPLITTERS for part in parts)


@dataclass
class _Side:
    """One text (`second`: the second of a pair), how much of it is tokenised (`text[:end]`) and its encoding
    without special tokens, truncated to max_length tokens."""

    text: str
    second: bool = False
    end: int = 0
    encoding: Encoding | None = None

    @property
    def whole(self) -> bool:
        return self.end == len(self.text)

    @property
    def tokens(self) -> int:
        return len(self.encoding.ids) if self.encoding is not None else 0


class BoundedTokenizer:
    """`tokenizer.encode_batch(items)`, truncating to `tokenizer.truncation`'s max_length, that reads only a
    prefix of each long text (see the module docstring).

    Each side of an item is encoded alone, without special tokens (which is what the tokenizer does first; the
    second side of a pair as the pair ("", text), which gives its tokens type id 1), and `tokenizer.post_process`
    then truncates the item and adds the special tokens, as `encode_batch` does next. That also spares a long
    pair the tokenizer's overflowing windows of both sides (their product).

    Args:
        tokenizer: a tokenizer with truncation enabled (longest first, keeping the start) and padding disabled
            (the caller pads). Otherwise, or with a normaliser or pre-tokeniser that `cuts_keep_tokens` does not
            know, texts are tokenised whole.
        first_chars: the first prefix of a long text, in characters (default: learnt, see `CHARS_PER_TOKEN`).
    """

    def __init__(self, tokenizer: Tokenizer, first_chars: int | None = None) -> None:
        self.tokenizer = tokenizer
        truncation = tokenizer.truncation or {}
        self.max_length = truncation.get("max_length", 0)
        pair_specials = tokenizer.post_processor.num_special_tokens_to_add(True) if tokenizer.post_processor else 0
        self.pair_budget = self.max_length - pair_specials  # tokens a pair keeps of its two texts
        self.bounded = (
            self.pair_budget > 0
            and truncation.get("strategy") == "longest_first"
            and truncation.get("direction") == "right"
            and tokenizer.padding is None
            and not tokenizer.encode("", add_special_tokens=False).ids  # ("", text) adds nothing to the text's
            and cuts_keep_tokens(tokenizer)
        )
        self.first_chars = first_chars
        self.chars_per_token = CHARS_PER_TOKEN  # shared by threads: a lost update only costs a round

    def encode_batch(self, items: list[Text]) -> list[Encoding]:
        """Encodings of `items` (strings, or (text, text_pair) tuples), as the tokenizer gives for the whole texts."""
        if not self.bounded:
            return self.tokenizer.encode_batch(items)
        sides = [_sides(item) for item in items]
        self._grow([s for group in sides for s in group])
        self._learn([s for group in sides for s in group if not s.whole])
        if self.pair_budget % 2:
            self._settle_longer_side([g for g in sides if len(g) == 2 and min(s.tokens for s in g) >= self.max_length])
        return [self.tokenizer.post_process(*(s.encoding for s in group)) for group in sides]

    def _encode(self, sides: list[_Side]) -> None:
        texts = [("", s.text[: s.end]) if s.second else s.text[: s.end] for s in sides]
        for side, enc in zip(sides, self.tokenizer.encode_batch(texts, add_special_tokens=False), strict=True):
            side.encoding = enc

    def _grow(self, sides: list[_Side]) -> None:
        """Encode every side: a short text whole, a long one cut at the shortest tried prefix (doubling) that has
        max_length tokens."""
        limit = self.first_chars or max(1, round(self.chars_per_token * self.max_length))
        todo = sides
        while todo:
            for side in todo:
                side.end = cut(side.text, limit) if limit < len(side.text) else len(side.text)
            self._encode([s for s in todo if s.end > 0 or s.whole])  # end 0: no cut found (or an empty text)
            todo = [s for s in todo if not s.whole and (s.end == 0 or s.tokens < self.max_length)]
            limit *= 2

    def _learn(self, cut_sides: list[_Side]) -> None:
        """Move the characters per token towards those of the texts just cut (a moving average, with a margin)."""
        if cut_sides:
            seen = sum(s.end for s in cut_sides) / sum(_count(s.encoding) for s in cut_sides)
            self.chars_per_token += 0.2 * (min(CHARS_PER_TOKEN, CHARS_MARGIN * seen) - self.chars_per_token)

    def _settle_longer_side(self, pairs: list[list[_Side]]) -> None:
        """Pairs whose sides both reach max_length are cut to halves of the budget; with an odd budget, the longer
        side (the second on a tie) keeps the extra token, so count both sides whole and truncate them here."""
        cut_sides = [s for pair in pairs for s in pair if not s.whole]
        for side in cut_sides:
            side.end = len(side.text)
        self._encode(cut_sides)
        half = self.pair_budget // 2
        for first, second in pairs:
            longer_first = _count(first.encoding) > _count(second.encoding)
            first.encoding.truncate(half + longer_first)
            second.encoding.truncate(half + (not longer_first))


def _sides(item: Text) -> list[_Side]:
    return [_Side(item[0]), _Side(item[1], second=True)] if isinstance(item, tuple) else [_Side(item)]


def _count(encoding: Encoding) -> int:
    """Tokens of the text before truncation: truncation with no stride splits them into the overflowing windows."""
    return len(encoding.ids) + sum(len(o.ids) for o in encoding.overflowing)
