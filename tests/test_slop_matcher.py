"""The slop matcher's shortcuts (issue 33 item 13, speed) find exactly what a plain search finds.

find() searches only the phrases whose inner word is a word of the text, and skips a built-in pattern
none of whose gate words is; dedup's key is taken from the slop filter's canonical text. Each shortcut
is checked here against the plain definition on texts made to sit on its edges.
"""

from __future__ import annotations

import hashlib
import random
import re

import pytest

from finetune.ingest.clean import Cleaner, normalize_text
from finetune.ingest.options import IngestOptions
from finetune.ingest.slop import DEFAULT_PATTERNS, DEFAULT_PHRASES, SlopMatcher, _bounded, canonical


def plain_find(matcher: SlopMatcher, text: str) -> list[str]:
    """find() as defined: every phrase searched, longest first, then every pattern whose gate is in the text."""
    canon = canonical(text)
    found, taken = [], []
    for phrase in matcher.ordered:
        start = canon.find(phrase)
        while start >= 0:
            end = start + len(phrase)
            if _bounded(canon, start, end, phrase) and not any(a < end and start < b for a, b in taken):
                found.append(phrase)
                taken.append((start, end))
            start = canon.find(phrase, start + 1)
    for label, rx, gates, _ in matcher.patterns:
        if all(any(gate in canon for gate in group) for group in gates):
            for m in rx.finditer(canon):
                if not any(a < m.end() and m.start() < b for a, b in taken):
                    found.append(label)
                    taken.append(m.span())
    return found


USER_PHRASES = ("ai", "delve into", "don\u2019t  really know", "it's worth noting that", "\u039f\u0394\u039f\u03a3 test")
FRAGMENTS = list(DEFAULT_PHRASES) + list(USER_PHRASES) + [
    "I am an AI, so", "as an artificial intelligence, i", "I don\u2019t have my own views",
    "I do not hold any personal opinions", "i have been developed by openai", "I cannot browse the internet",
    "i am unable to access the web.", "my knowledge only extends until", "I DON'T really KNOW",
    "\u0391\u03a3", "\u03a3", "\u2019", "\u2018", "\u02bc", "'", "AI", "the", "own", "access", "x", "foo_", ",", ".",
    " ", "  ", "\n", "\t", "\u00a0", "\u2003"]


def random_texts(seed: int, n: int):
    rng = random.Random(seed)
    for _ in range(n):
        parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 7))]
        seps = [rng.choice([" ", "", "\n", ". ", "  ", "_", "a", "\u2019"]) for _ in parts]
        yield "".join(p.upper() if rng.random() < 0.2 else p for pair in zip(parts, seps) for p in pair)


@pytest.mark.parametrize("builtin,extra", [(True, ()), (True, USER_PHRASES), (False, USER_PHRASES)])
def test_find_equals_the_plain_search_of_every_phrase_and_pattern(builtin, extra):
    matcher = SlopMatcher.build(builtin, extra)
    hits = 0
    for text in random_texts(0, 3000):
        found = matcher.find(text)
        assert found == plain_find(matcher, text), text
        hits += bool(found)
    assert hits > 1000  # the texts do hold phrases and patterns


def test_every_builtin_pattern_is_exercised_and_gated_by_words_it_holds():
    matcher = SlopMatcher.build()
    texts = ["I am an AI, so", "I don\u2019t have my own views", "i am unable to access the web.",
             "I was created by OpenAI", "my knowledge only extends until"]
    assert [matcher.find(t) for t in texts] == [[label] for label, *_ in DEFAULT_PATTERNS]
    for label, regex, gates, words in DEFAULT_PATTERNS:
        # a gate word stands between two literal spaces of the regex (or a space and an alternation's
        # edge), so a match holds it as a whole word; none holds an apostrophe (straightened or not)
        for word in (word for group in words for word in group):
            assert "'" not in word and re.search(rf"(?: |\(\?:|\|){word}(?:\|[^()]*)?\)* ", regex), (label, word)


def test_phrases_without_an_anchor_word_are_always_searched():
    matcher = SlopMatcher.build(False, ("delve", "delve into", "i don't know", "as an ai"))
    assert matcher.find("We DELVE  into it") == ["delve into"]
    assert matcher.find("I don\u2019t know") == ["i don't know"]  # the inner word holds an apostrophe
    assert matcher.find("as an AI.") == ["as an ai"]


def test_the_dedup_key_is_the_spaced_lower_text_whatever_the_slop_filter_saw():
    matcher = SlopMatcher.build()
    for text in random_texts(1, 2000):
        matcher.find(text)
        assert matcher.spaced_lower(text) == " ".join(text.split()).lower()
        assert matcher.spaced_lower(text + " x") == " ".join((text + " x").split()).lower()  # another text


@pytest.mark.parametrize("slop", ["strip", "drop", "off"])
def test_prepare_makes_the_same_dedup_digest_as_the_plain_key(slop):
    cleaner = Cleaner(IngestOptions(slop=slop))
    for text in random_texts(2, 500):
        prep = cleaner.prepare("x", {"text": text + " and enough words to keep this record long enough"})
        if prep.verdict is None:
            joined = " ".join(prep.record["text"].split()).lower()
            assert prep.digest == hashlib.blake2b(joined.encode(), digest_size=16).digest()


def test_normalize_text_on_control_characters_and_odd_spaces():
    assert normalize_text("a\u00a0\u00a0b\x00c\u200b d\t\n```\n  code\u00a0 x\n```") == "a bc d\n```\n  code\u00a0 x\n```"
    assert normalize_text("plain  text\n\n\n\nnext") == "plain text\n\nnext"
    assert normalize_text("a\ufeffb\u3000c") == "ab c"
