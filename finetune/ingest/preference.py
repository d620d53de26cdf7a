"""Preference records: every accepted input form normalized into one canonical form, and a record's problems.

Canonical forms, the contract the data stage reads (`read_records` returns them, nothing else):

  preference, plain           {"prompt": str, "chosen": str, "rejected": str}
  preference, conversational  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}
                              either with an optional "margin": a number, how much better chosen is (a reward
                              model's loss reads it: finetune/train/reward/loss.py; the other methods ignore it)
  unpaired (KTO)              {"prompt": str | [messages], "completion": str | [messages], "label": bool}

Messages are exactly {"role": "system" | "user" | "assistant", "content": str}; a prompt's user message may
instead hold a list of text and image parts (the chat records' canonical parts, finetune/ingest/record_images.py),
its images placed from any layout the chat records accept: parts, TRL's `images` column with {"type": "image"}
placeholders (or none: the images lead the first user turn), LLaMA-Factory's `<image>` tags with `images`. An
answer is text: an image in chosen, rejected or a completion is refused. A conversational prompt is
non-empty and ends with a user message; chosen, rejected and a conversational completion are non-empty and
hold assistant messages only. Prompt and answers are both plain or both conversational. Plain strings are
kept verbatim, whitespace at their edges included: the prompt and an answer join as written (TRL's plain
examples put the space in the answer: "The sky is" + " blue.").

Accepted preference inputs (the first key found decides the form):
  "conversations"  sharegpt: [{"from", "value"}...] is the prompt; chosen/rejected a {"from", "value"}
                   message, a list of them, or a string (the assistant's answer)
  "instruction"    alpaca: the prompt is the alpaca prompt exactly as SFT renders it (finetune/contract.py)
  "prompt"         TRL's explicit form, plain or conversational
  neither          TRL's implicit prompt: chosen and rejected are whole conversations; the prompt is the
                   longest run of whole messages both begin with, up to its last user turn
A string "prompt" beside whole conversations (UltraFeedback's layout) is read as the implicit form, as TRL
does. Messages may be written {"role", "content"} or sharegpt's {"from", "value"} (human, gpt) anywhere; an
empty system message in a prompt is dropped. Unpaired: {"prompt", "completion", "label": true | false}, or
{"messages", "label"} (LLaMA-Factory's KTO layout): the assistant turns ending the conversation are the completion.

Pure Python: no torch, no data/.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from finetune.contract import alpaca_prompt
from finetune.ingest.record_images import PartProblem, Store, image_parts, prompt_images

PREFERENCE_SHAPES = ("preference", "unpaired")
SIDES = {"preference": ("prompt", "chosen", "rejected"), "unpaired": ("prompt", "completion")}
# input role -> canonical role; sharegpt writes human / gpt
ROLE_NAMES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
_ROLES_SAID = "system, user, assistant (sharegpt: human, gpt)"


class RecordProblem(ValueError):
    """Why a record cannot be used, in one line; `reason` is the rejects-file key of the cleaning stage."""

    def __init__(self, message: str, reason: str = "invalid_record"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ImageSource:
    """Where a record's images are read from: relative paths start at `base_dir` (the data file's folder); with a
    `store` (the records cache), image bytes are written there and the part points to the file."""

    base_dir: Path
    store: Store | None = None


def canonical(record: dict, shape: str, images: ImageSource | None = None) -> dict:
    """The canonical form of a preference or unpaired record. Raises RecordProblem, or ImageRejected for its images
    (`images`: where they are read from; None refuses a record with images)."""
    return canonical_preference(record, images) if shape == "preference" else canonical_unpaired(record, images)


def canonical_preference(record: dict, images: ImageSource | None = None) -> dict:
    """{prompt, chosen, rejected} from any accepted pair form. Raises RecordProblem."""
    if "conversations" in record:
        pair = _sharegpt(record)
    elif "instruction" in record:
        pair = _alpaca(record)
    elif record.get("prompt") is not None and not _whole_conversations(record):
        pair = _explicit(record, SIDES["preference"])
    else:
        pair = _implicit(record)
    pair = _placed(pair, record.get("images"), images, ("chosen", "rejected"))
    _check_prompt(pair["prompt"])
    for key in ("chosen", "rejected"):
        _check_answer(pair[key], key)
    if _comparable(pair["chosen"]) == _comparable(pair["rejected"]):
        raise RecordProblem('"chosen" and "rejected" are the same answer; a pair must differ', "identical_pair")
    if record.get("margin") is not None:
        pair["margin"] = _margin(record["margin"])
    return pair


def _margin(value) -> float:
    """A pair's margin: a finite number (TRL's `margin` column)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordProblem(f'"margin" must be a finite number (how much better "chosen" is than "rejected"), got '
                            f"{json.dumps(value)}")
    return float(value)


def canonical_unpaired(record: dict, images: ImageSource | None = None) -> dict:
    """{prompt, completion, label} from KTO's form. Raises RecordProblem."""
    if "label" not in record:
        raise RecordProblem('an unpaired record needs "label": true for a desirable completion, false for an '
                            "undesirable one")
    label = record["label"]
    if not isinstance(label, bool):
        raise RecordProblem(f'"label" must be true or false (a JSON boolean), got {json.dumps(label)}; write true '
                            "for a desirable completion, false for an undesirable one")
    out = _split_conversation(record) if "messages" in record and "completion" not in record \
        else _explicit(record, SIDES["unpaired"])
    out = _placed(out, record.get("images"), images, ("completion",))
    _check_prompt(out["prompt"])
    _check_answer(out["completion"], "completion")
    return {**out, "label": label}


def texts(record: dict, shape: str, taught_only: bool = False) -> list[str]:
    """The strings of a canonical record, in a fixed order; with `taught_only`, only those training would
    teach: a pair's chosen answer, an unpaired completion labelled true (never a rejected answer). For the cleaning
    steps, which read records without images (canonical() refuses those without an ImageSource)."""
    return [t for key in _keys(record, shape, taught_only) for t in _side_texts(record[key])]


def map_texts(record: dict, shape: str, fn, taught_only: bool = False) -> dict:
    """A copy of a canonical record with `fn` applied to its strings (see `texts` for `taught_only`). A plain
    string keeps the whitespace at its edges: it is where the prompt and the answer join."""
    out = dict(record)
    for key in _keys(record, shape, taught_only):
        value = record[key]
        if isinstance(value, str):
            out[key] = _keep_edges(fn, value)
        else:
            out[key] = [{**m, "content": fn(m["content"])} for m in value]
    return out


def sides_key(record: dict, shape: str) -> list[str]:
    """One string per side (each message with its role), then the label: what dedup compares, so swapping
    chosen and rejected, or flipping a label, makes a different record."""
    parts = [_side_key(record[key]) for key in SIDES[shape]]
    return parts + ([str(record["label"])] if shape == "unpaired" else [])


# --- the input forms ----------------------------------------------------------------------------------

def _sharegpt(record: dict) -> dict:
    conversation = record["conversations"]
    if not isinstance(conversation, list):
        raise RecordProblem('"conversations" must be a list of {"from", "value"} messages')
    prompt = _drop_empty_system(_messages(conversation, "conversations"))
    pair = {"prompt": prompt}
    for key in ("chosen", "rejected"):
        value = _present(record, key)
        pair[key] = [{"role": "assistant", "content": value}] if isinstance(value, str) else _messages(value, key)
    return pair


def _alpaca(record: dict) -> dict:
    instruction, given = record["instruction"], record.get("input")
    if not isinstance(instruction, str):
        raise RecordProblem('"instruction" must be a string')
    if not instruction.strip():
        raise RecordProblem('"instruction" is empty', "empty_side")
    if given is not None and not isinstance(given, str):
        raise RecordProblem('"input" must be a string when present')
    pair = {"prompt": alpaca_prompt({"instruction": instruction, "input": given})}
    for key in ("chosen", "rejected"):
        value = _present(record, key)
        if not isinstance(value, str):
            raise RecordProblem(f'"{key}" is {_kind(value)}, but an alpaca-style record ("instruction") has a '
                                f'plain-text prompt: plain and conversational mixed; give "{key}" as a string')
        pair[key] = value
    return pair


def _explicit(record: dict, keys: tuple[str, ...]) -> dict:
    out = {}
    for key in keys:
        value = _present(record, key)
        out[key] = value if isinstance(value, str) else _messages(value, key)
    plain = [f'"{k}"' for k, value in out.items() if isinstance(value, str)]
    listed = [f'"{k}"' for k, value in out.items() if not isinstance(value, str)]
    if plain and listed:
        raise RecordProblem(f"plain and conversational mixed: {_these(plain, 'a string', 'strings')} but "
                            f"{_these(listed, 'a list of messages', 'lists of messages')}; write them all as "
                            "strings or all as lists of messages")
    if isinstance(out["prompt"], list):
        out["prompt"] = _drop_empty_system(out["prompt"])
    return out


def _implicit(record: dict) -> dict:
    chosen, rejected = _present(record, "chosen"), _present(record, "rejected")
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise RecordProblem('plain-text "chosen"/"rejected" need a "prompt" (where a prompt ends inside a string '
                            'is not guessed); add "prompt", or give both as whole conversations (lists of messages)')
    chosen = _drop_empty_system(_messages(chosen, "chosen"))
    rejected = _drop_empty_system(_messages(rejected, "rejected"))
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    users = [i for i in range(shared) if chosen[i]["role"] == "user"]
    if not users:
        raise RecordProblem('no "prompt", and "chosen" and "rejected" do not begin with the same messages up to a '
                            "user turn (with no prompt, the prompt is the whole messages both conversations begin "
                            'with); add "prompt", or start both conversations with the same turns')
    cut = users[-1] + 1
    for key, messages in (("chosen", chosen), ("rejected", rejected)):
        for i, message in enumerate(messages[cut:], start=cut):
            if message["role"] != "assistant":
                raise RecordProblem(f'"chosen" and "rejected" differ before their last user turn ({key}[{i}] is '
                                    f"{_a(message['role'])} message after the shared prompt); a pair answers one "
                                    "prompt with two assistant replies")
    return {"prompt": chosen[:cut], "chosen": chosen[cut:], "rejected": rejected[cut:]}


def _split_conversation(record: dict) -> dict:
    """KTO's {messages, label} (LLaMA-Factory's layout): the assistant turns that end the conversation are the
    completion, the turns before them the prompt."""
    messages = record["messages"]
    if not isinstance(messages, list):
        raise RecordProblem('"messages" must be a list of messages')
    messages = _drop_empty_system(_messages(messages, "messages"))
    cut = len(messages)
    while cut and messages[cut - 1]["role"] == "assistant":
        cut -= 1
    if cut == len(messages):
        raise RecordProblem('"messages" does not end with an assistant turn: in a {messages, label} record the '
                            "assistant turns at the end are the completion the label judges", "empty_side")
    return {"prompt": messages[:cut], "completion": messages[cut:]}


def _whole_conversations(record: dict) -> bool:
    """A string prompt beside chosen/rejected that are whole conversations (they hold a non-assistant turn)."""
    sides = [record.get("chosen"), record.get("rejected")]
    if not isinstance(record.get("prompt"), str) or not all(isinstance(s, list) for s in sides):
        return False
    return any(isinstance(m, dict) and _role(m) not in ("assistant", "gpt") for side in sides for m in side)


# --- messages and checks ------------------------------------------------------------------------------

def _present(record: dict, key: str):
    value = record.get(key)
    if value is None:
        raise RecordProblem(f'"{key}" is missing', "empty_side")
    if not isinstance(value, (str, list, dict)):
        raise RecordProblem(f'"{key}" must be a string or a list of messages, got {_kind(value)}')
    return value


def _messages(value: list | dict, key: str) -> list[dict]:
    """Canonical messages from a list of messages, or one message alone."""
    if isinstance(value, dict):
        return [_message(value, key)]
    return [_message(item, f"{key}[{i}]") for i, item in enumerate(value)]


def _message(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecordProblem(f'{where} must be a message {{"role": ..., "content": ...}}, got {_kind(value)}')
    role_key, content_key = ("from", "value") if "from" in value and "role" not in value else ("role", "content")
    content = value.get(content_key)
    if role_key not in value or not (isinstance(content, str) or (content_key == "content" and isinstance(content, list))):
        raise RecordProblem(f'{where} needs "{role_key}" and "{content_key}" (a string, or a list of text and image '
                            'parts)')
    role = value[role_key]
    if not isinstance(role, str) or role not in ROLE_NAMES:
        raise RecordProblem(f"{where}.{role_key} is {role!r}; expected one of {_ROLES_SAID}")
    return {"role": ROLE_NAMES[role], "content": content}


def _role(message: dict) -> object:
    return message.get("role", message.get("from"))


def _drop_empty_system(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] != "system" or not isinstance(m["content"], str) or m["content"].strip()]


def _placed(out: dict, listed: object, source: ImageSource | None, answers: tuple[str, ...]) -> dict:
    """`out` with its answers as text and its prompt's images in canonical parts (`listed`: the record's `images`
    column). Raises RecordProblem, or ImageRejected (a bad count of placeholders, a URL, bytes the store cannot
    read)."""
    out = {**out, **{key: _answer(out[key], key) for key in answers}}
    prompt, given = out["prompt"], listed is not None and listed != []
    if isinstance(prompt, str):
        if given:
            raise RecordProblem('a record with "images" needs a conversational prompt (a list of messages) to show '
                                "them in; a plain-text prompt has no place for an image")
        return out
    if listed is None and not any(isinstance(m["content"], list) for m in prompt):
        return out
    if source is None:  # text parts only: joined back into each message's string
        if given or image_parts({"prompt": prompt}):
            raise RecordProblem("a preference record with images: the cleaning steps (`type: records`) read text "
                                "only; list the file as a records dataset (`type: auto`), which reads its images")
        source, listed = ImageSource(Path(".")), None
    try:
        return {**out, "prompt": prompt_images(prompt, listed, source.base_dir, source.store)}
    except PartProblem as problem:
        raise RecordProblem(str(problem)) from None


def _answer(side: str | list[dict], key: str) -> str | list[dict]:
    """An answer's messages with their text parts joined into one string; an image in an answer is refused."""
    if isinstance(side, str):
        return side
    out = []
    for i, message in enumerate(side):
        content = message["content"]
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str)
                   for p in content):
                raise RecordProblem(f'{key}[{i}] holds an image (or a part that is not text): "{key}" is the '
                                    "model's answer, in text; images go in the prompt's user turn")
            content = "".join(p["text"] for p in content)
        out.append({**message, "content": content})
    return out


def _text(content: str | list[dict]) -> str:
    """A message's text: the string, or its text parts joined."""
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content
                                                              if p.get("type") == "text")


def _check_prompt(prompt: str | list[dict]) -> None:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RecordProblem('"prompt" is empty', "empty_side")
        return
    if not prompt:
        raise RecordProblem('the prompt is empty: it needs at least one user message', "empty_side")
    for i, message in enumerate(prompt):
        if not _text(message["content"]).strip() and not isinstance(message["content"], list):
            raise RecordProblem(f"prompt message {i} ({message['role']}) is empty", "empty_side")
    if prompt[-1]["role"] != "user":
        raise RecordProblem(f"the prompt ends with {_a(prompt[-1]['role'])} message; it must end with the user turn "
                            "the answers reply to")


def _check_answer(answer: str | list[dict], key: str) -> None:
    if isinstance(answer, str):
        if not answer.strip():
            raise RecordProblem(f'"{key}" is empty', "empty_side")
        return
    if not answer:
        raise RecordProblem(f'"{key}" is empty: it holds no message', "empty_side")
    for i, message in enumerate(answer):
        if message["role"] != "assistant":
            raise RecordProblem(f'{key}[{i}] is {_a(message["role"])} message; "{key}" holds the assistant\'s answer '
                                "only (the conversation before it is the prompt)")
        if not message["content"].strip():
            raise RecordProblem(f"{key}[{i}] is empty", "empty_side")


def _comparable(side: str | list[dict]) -> tuple:
    """A side as compared for identity: whitespace runs count as one space."""
    if isinstance(side, str):
        return (" ".join(side.split()),)
    return tuple((m["role"], " ".join(m["content"].split())) for m in side)


def _side_key(side: str | list[dict]) -> str:
    return side if isinstance(side, str) else "\n".join(f"{m['role']}: {m['content']}" for m in side)


def _side_texts(side: str | list[dict]) -> list[str]:
    return [side] if isinstance(side, str) else [m["content"] for m in side]


def _keys(record: dict, shape: str, taught_only: bool) -> tuple[str, ...]:
    if not taught_only:
        return SIDES[shape]
    if shape == "preference":
        return ("chosen",)
    return ("completion",) if record["label"] else ()


def _keep_edges(fn, text: str) -> str:
    """fn over the text inside its edge whitespace, which is kept (newlines as \\n)."""
    core = text.strip()
    new = fn(core)
    if not core or not new.strip():
        return new
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
    return _newlines(lead) + new + _newlines(trail)


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _these(keys: list[str], one: str, many: str) -> str:
    return f"{keys[0]} is {one}" if len(keys) == 1 else f"{' and '.join(keys)} are {many}"


def _a(role: str) -> str:
    return f"an {role}" if role == "assistant" else f"a {role}"


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list of messages"
    return {dict: "an object", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)
