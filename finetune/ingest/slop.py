"""The slop / refusal filter: a narrow, curated default phrase list plus the user's own.

Narrow on purpose: broad public lists flag words such as "ethics" or "bias" and throw away good data.
Every default phrase below is one that, in a response, almost only ever appears as model boilerplate.
Matching ignores case, runs of whitespace and curly vs straight apostrophes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from finetune.errors import DataError

DEFAULT_PHRASES = (
    # identity boilerplate
    "as an ai language model",
    "as a language model, i",
    "as an ai assistant, i",
    "as an ai, i",
    "as a large language model",
    "i am an ai language model",
    "i'm an ai language model",
    "i am just an ai",
    "i'm just an ai",
    "i'm only an ai",
    "openai's content policy",
    "openai's use case policy",
    "openai's guidelines",
    # refusals
    "i cannot fulfill this request",
    "i cannot fulfill that request",
    "i can't fulfill this request",
    "i can't fulfill that request",
    "i cannot comply with this request",
    "i'm sorry, but i cannot assist with that",
    "i'm sorry, but i can't assist with that",
    "i'm sorry, but as an ai",
    "i am sorry, but as an ai",
    "it is not appropriate for me to",
    "it's not appropriate for me to",
    "goes against my programming",
    "against my programming",
    "harmful or offensive content",
    "offensive or harmful content",
    "inappropriate or offensive content",
    "violates my guidelines",
    # capability / knowledge disclaimers
    "i do not have personal opinions",
    "i don't have personal opinions",
    "i do not have personal beliefs",
    "i don't have personal beliefs",
    "i do not have personal experiences",
    "i don't have personal experiences",
    "i don't have the ability to browse",
    "i do not have the ability to browse",
    "i cannot browse the internet",
    "i don't have access to real-time",
    "i do not have access to real-time",
    "as of my last knowledge update",
    "as of my knowledge cutoff",
    "my knowledge cutoff",
    "as of my last training update",
)

# The variants a phrase list cannot enumerate ("I'm an AI assistant, so unable to...", "I am an AI and do
# not have personal preferences"), as regexes over the canonical text (lower case, straight apostrophes,
# single spaces). Each is counted under its label. Narrow: "an AI" must be what the speaker *is* ("as",
# "I am"), followed by what boilerplate follows it (a comma, "so", "and I/do/cannot..."), so "as an AI
# researcher", "AI assistants are useful" and "as an assistant professor" do not match.
_AN_AI = (r"(?:an? |just an? |only an? |merely an? )(?:ai|artificial intelligence)"
          r"(?: (?:language model|assistant|model|chatbot|system|program))?")
# (label, regex, gates, words): the regex runs only on a text holding, for each group of `gates`, one of
# its strings, and for each group of `words`, one of its words as a whole word. A regex that starts with an
# alternation or \b is tried at every position of the text (~0.8 ms on a 7 KB page, each); `in` is a C
# scan; the word tests read one set intersection per text. `words` are words the regex holds between two
# literal spaces (so a match has one of them as a whole word of the canonical text), without an apostrophe.
DEFAULT_PATTERNS = (
    ("as / i am an ai [assistant|model], ...",
     rf"\b(?:as|i am|i'm) {_AN_AI}(?=[,;:.!]|$| so\b| i\b| i'm\b| without\b| developed\b| created\b| trained\b"
     r"| built\b| and (?:i|do|don't|cannot|can't|have|lack|am|therefore)\b)",
     (("a ai", "an ai", "artificial intel"),), ()),
    ("i don't have personal preferences / feelings / ...",
     r"\bi (?:do not|don't|cannot|can't) (?:have|hold|form|experience) (?:any )?(?:personal|my own) "
     r"(?:preferences|feelings|emotions|opinions|beliefs|experiences|tastes|views)\b",
     (("personal ", "my own "), ("i do not ", "i don't ", "i cannot ", "i can't ")),
     (("personal", "own"), ("have", "hold", "form", "experience"))),
    ("i am unable to browse / access the internet",
     r"\bi(?: am|'m)? (?:not able to|unable to|cannot|can't|do not|don't) (?:browse|access|search) "
     r"the (?:internet|web)\b", (("the internet", "the web"), ("browse the ", "access the ", "search the ")),
     (("browse", "access", "search"),)),
    # the speaker's own maker, not a fact about a company's product ("Whisper, developed by OpenAI, ..."): "I am
    # ChatGPT, a large language model trained by OpenAI", "I was created by OpenAI"; the words between name the
    # speaker (no "that" / "was": "I was reading that GPT-2 was trained by OpenAI" is about GPT-2)
    ("i am / was ... trained / developed / created by openai",
     r"\bi(?: am|'m| was|'ve been| have been)(?: (?!that\b|was\b|is\b|were\b|are\b|which\b|who\b|about\b)"
     r"[\w-]+,?){0,6}? (?:trained|developed|created|built|made) by openai\b", (("by openai",),),
     (("trained", "developed", "created", "built", "made"),)),
    ("my training data goes up to ...",
     r"\bmy (?:training data|training|knowledge) (?:only )?(?:goes|extends|runs) (?:up )?(?:to|until|through)\b",
     (("my training", "my knowledge"),), (("training", "knowledge"), ("goes", "extends", "runs"))),
)

_CURLY = ("\u2019", "\u2018", "\u02bc")  # apostrophes read as '


def canonical(phrase: str) -> str:
    """The form phrases are counted under: lower case, straight apostrophes, single spaces."""
    # str.replace runs in C; str.translate with a mapping table calls back into Python for every character
    # (13% of the HTML ingest time on git's manual)
    for quote in _CURLY:
        if quote in phrase:
            phrase = phrase.replace(quote, "'")
    return " ".join(phrase.lower().split())  # str.split() splits on exactly what \s matches, in C


def _inner_words(phrase: str) -> frozenset:
    """Words that are whole words of any canonical text holding `phrase`: its inner words (spaces on both
    sides) without an apostrophe (so that they are words of the text before its apostrophes are straightened
    too). Empty for a phrase of one or two words."""
    return frozenset(w for w in phrase.split(" ")[1:-1] if "'" not in w)


def read_phrase_file(path: str) -> list[str]:
    """One phrase a line; blank lines and lines starting with # are skipped."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise DataError(f"cannot read the slop phrase file `{path}`: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DataError(f"the slop phrase file `{path}` is not UTF-8 text") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _phrase_pattern(phrase: str) -> str:
    words = canonical(phrase).split(" ")
    parts = [re.escape(w).replace("'", "['\u2019\u2018\u02bc]") for w in words]
    # \b only where the phrase starts/ends with a word character, so "as an ai, i" still matches
    head = r"\b" if re.match(r"\w", words[0]) else ""
    tail = r"\b" if re.search(r"\w$", words[-1]) else ""
    return head + r"\s+".join(parts) + tail


@dataclass
class SlopMatcher:
    """Finds slop phrases in text; `phrases` maps each canonical phrase to itself for counting."""

    regex: re.Pattern | None
    phrases: frozenset
    ordered: tuple = ()  # canonical phrases, longest first
    patterns: tuple = ()  # (label, compiled regex over the canonical text, gates, frozensets of words)
    needs: tuple = ()  # per phrase of `ordered`, its _inner_words() (empty: always searched)
    gate_words: frozenset = frozenset()  # every word of `needs` and of the patterns' words
    # (text, " ".join(text.split()).lower()) of the last find(): dedup's key of the same text
    # (Cleaner.prepare) is the canonical text before its apostrophes are straightened
    last_spaced: tuple = field(default=(None, None), repr=False, compare=False)

    @classmethod
    def build(cls, builtin: bool = True, extra: tuple = (), files: tuple = ()) -> "SlopMatcher":
        phrases = list(DEFAULT_PHRASES) if builtin else []
        phrases += list(extra)
        for path in files:
            phrases += read_phrase_file(path)
        canon = sorted({canonical(p) for p in phrases if p.strip()}, key=len, reverse=True)
        if not canon:
            return cls(None, frozenset())
        regex = re.compile("|".join(_phrase_pattern(p) for p in canon), re.IGNORECASE)
        patterns = tuple((label, re.compile(rx), gates, tuple(map(frozenset, words)))
                         for label, rx, gates, words in DEFAULT_PATTERNS) if builtin else ()
        needs = tuple(_inner_words(p) for p in canon)
        gate_words = frozenset().union(*needs, *(group for *_, words in patterns for group in words))
        return cls(regex, frozenset(canon), tuple(canon), patterns, needs, gate_words)

    def find(self, text: str) -> list[str]:
        """Canonical phrases found in `text`, one entry per occurrence (the longest phrase wins an overlap).

        Plain substring search on the canonical text: ~25x faster than the big alternation regex. Only the
        phrases whose inner words are all words of the text are searched, and only the patterns one of whose
        words is: one set intersection over the text's words instead of a str.find per phrase."""
        if self.regex is None:
            return []
        # canonical(text), in another order: lower() and the apostrophes commute (they have no case, and
        # Greek final sigma reads them as it reads "'"), and so do lower() and the spaces (lower() turns no
        # character into whitespace or back: checked over every code point; final sigma reads no context
        # across a space). The text before straightening is " ".join(text.split()).lower(): dedup's key.
        words = text.lower().split()
        spaced = canon = " ".join(words)
        for quote in _CURLY:
            if quote in canon:
                canon = canon.replace(quote, "'")
        self.last_spaced = (text, spaced)
        present = self.gate_words.intersection(words)
        found, taken = [], []
        for phrase, need in zip(self.ordered, self.needs):
            if not need <= present:
                continue
            start = canon.find(phrase)
            while start >= 0:
                end = start + len(phrase)
                if _bounded(canon, start, end, phrase) and not any(a < end and start < b for a, b in taken):
                    found.append(phrase)
                    taken.append((start, end))
                start = canon.find(phrase, start + 1)
        for label, rx, gates, pattern_words in self.patterns:  # after the phrases: an overlap counts once
            if any(group.isdisjoint(present) for group in pattern_words) or not all(
                    _any_in(group, canon) for group in gates):
                continue
            for m in rx.finditer(canon):
                if not any(a < m.end() and m.start() < b for a, b in taken):
                    found.append(label)
                    taken.append(m.span())
        return found

    def spaced_lower(self, text: str) -> str:
        """" ".join(text.split()).lower(), from the last find() when that was of this very text."""
        last, spaced = self.last_spaced
        return spaced if text is last else " ".join(text.split()).lower()

    def strip(self, text: str) -> tuple[str, list[str]]:
        """`text` without the sentences that hold a phrase, and the phrases removed."""
        if self.regex is None or not self.find(text):
            return text, []
        found: list[str] = []
        kept_lines = []
        for line in text.split("\n"):
            if not self.find(line):
                kept_lines.append(line)
                continue
            sentences = _SENTENCE.split(line)
            kept = []
            for sentence in sentences:
                hits = self.find(sentence)
                found += hits
                if not hits:
                    kept.append(sentence)
            if kept:
                kept_lines.append(" ".join(s.strip() for s in kept))
        return "\n".join(kept_lines).strip(), found


def _any_in(strings: tuple, text: str) -> bool:
    for string in strings:  # a loop, not any(generator): this runs for every record
        if string in text:
            return True
    return False


def _bounded(text: str, start: int, end: int, phrase: str) -> bool:
    """Word boundaries where the phrase starts / ends with a word character ("openai" not in "openaish")."""
    if phrase[0].isalnum() and start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        return False
    return not (phrase[-1].isalnum() and end < len(text) and (text[end].isalnum() or text[end] == "_"))


# A sentence ends at . ! or ? followed by whitespace (good enough for prose; code has no slop phrases).
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
