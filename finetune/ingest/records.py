"""Records: the contract between ingestion and training.

JSONL, one object a line, in one of six shapes:
  completion   {"text": ...}
  instruction  {"instruction": ..., "input": ... (optional), "output": ..., "system": ... (optional)}
  chat         {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}, a content being a
               string or a list of text and image parts (finetune/ingest/record_images.py: every layout of images
               in, canonical parts out)
  preference   {"prompt": ..., "chosen": ..., "rejected": ...}, in any form finetune/ingest/preference.py accepts
  unpaired     {"prompt": ..., "completion": ..., "label": true | false} (KTO)
  prompt       {"prompt": "text" | [messages], ...any other columns} (GRPO: the columns go to the reward functions)

Supervised records (the first three) are read as they are; preference and unpaired records come out in their
canonical form (finetune/ingest/preference.py). A file holds one kind: supervised, preference or unpaired.

No torch here: ingestion never imports the training stack.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from finetune.atomic import temp_file
from finetune.errors import DataError
from finetune.ingest.images import ImageRejected
from finetune.ingest.preference import PREFERENCE_SHAPES, ImageSource, RecordProblem, canonical
from finetune.ingest.record_images import PartProblem, canonical_images

SFT_SHAPES = ("completion", "instruction", "chat")
PROMPT_SHAPE = "prompt"
SHAPES = SFT_SHAPES + PREFERENCE_SHAPES + (PROMPT_SHAPE,)
ROLES = ("system", "user", "assistant")


def detect_shape(record: dict) -> str | None:
    """The record's shape from its keys, or None when it has none of the five.

    "chosen"/"rejected" come first: preference data often carries SFT keys too (UltraFeedback's "messages",
    alpaca-style pairs' "instruction"). One side alone is a pair with a side missing, said as such."""
    if "chosen" in record or "rejected" in record:
        return "preference"
    if "messages" in record and "label" in record:  # KTO's conversation and its label (LLaMA-Factory's layout)
        return "unpaired"
    if "messages" in record:
        return "chat"
    if "instruction" in record or "output" in record:
        return "instruction"
    if "text" in record:
        return "completion"
    if "completion" in record and "label" in record:  # TRL's unlabelled {prompt, completion} is no shape here
        return "unpaired"
    if "prompt" in record and "completion" not in record:  # GRPO: a prompt alone (other columns for the rewards)
        return PROMPT_SHAPE
    return None


def family(shape: str) -> str:
    """The kind of record a file holds: supervised (the SFT shapes), preference or unpaired."""
    return "supervised" if shape in SFT_SHAPES else shape


def a_shape(shape: str) -> str:
    """'a chat', 'an instruction': a shape's name with its article, for messages."""
    return f"an {shape}" if shape[0] in "aeiou" else f"a {shape}"


def checked_record(record: object, shape: str, images: ImageSource | None = None) -> tuple[dict | None, str | None]:
    """(the record to use, None) or (None, why it is not a valid record of `shape`). Supervised records are
    used as they are; preference and unpaired records in their canonical form, their prompt's images read from
    `images` (raises ImageRejected for them)."""
    if shape in PREFERENCE_SHAPES and isinstance(record, dict):
        try:
            return canonical(record, shape, images), None
        except RecordProblem as problem:
            return None, str(problem)
    problem = record_problem(record, shape)
    return (None, problem) if problem else (record, None)


def record_problem(record: object, shape: str) -> str | None:
    """Why `record` is not a valid record of `shape`, or None when it is."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    if shape in PREFERENCE_SHAPES:
        try:
            canonical(record, shape)
        except RecordProblem as problem:
            return str(problem)
    elif shape == PROMPT_SHAPE:
        return prompt_problem(record.get("prompt"))
    elif shape == "completion":
        if not isinstance(record.get("text"), str):
            return 'a completion record needs "text" as a string'
        if not record["text"].strip():
            return '"text" is empty'
    elif shape == "instruction":
        for key in ("instruction", "output"):
            if not isinstance(record.get(key), str):
                return f'an instruction record needs "{key}" as a string'
        if not isinstance(record.get("input", ""), (str, type(None))):
            return '"input" must be a string when present'
        if not isinstance(record.get("system", ""), (str, type(None))):
            return '"system" must be a string when present'
        if not record["output"].strip():
            return '"output" is empty: nothing to supervise'
    elif shape == "chat":
        return chat_problem(record.get("messages"))
    else:
        return f"unknown shape {shape!r}"
    return None


def chat_problem(messages: object) -> str | None:
    """Why a chat record's messages are unusable, or None. A content is a string or a list of text and image
    parts (canonical: finetune/ingest/record_images.py)."""
    if not isinstance(messages, list) or not messages:
        return 'a chat record needs "messages" as a non-empty list'
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), (str, list)):
            return f'messages[{i}] needs "role" and "content" (a string, or a list of text and image parts)'
        problem = parts_problem(msg["content"], i) if isinstance(msg["content"], list) else None
        if problem:
            return problem
        if msg.get("role") not in ROLES:
            return (f"messages[{i}].role is {msg.get('role')!r}; expected one of {', '.join(ROLES)} (in a recipe, "
                    f"the dataset's `roles:` maps other names, e.g. `roles: {{{msg.get('role')}: assistant}}`)")
        if msg["role"] == "assistant" and isinstance(msg["content"], list) and any(
                p["type"] == "image" for p in msg["content"]):
            return (f"messages[{i}] is an assistant turn with an image: the model answers in text; put the image "
                    "in the user turn it answers")
        if msg["role"] == "assistant" and not content_text(msg["content"]).strip():
            return (f"messages[{i}] is an empty assistant turn: it would teach the model to answer with nothing "
                    "(the end-of-turn token alone); remove the turn with the question it answers, or the record")
    if not any(m["role"] == "assistant" for m in messages):
        return "the conversation has no assistant turn: nothing to supervise"
    return None


def parts_problem(parts: list, i: int) -> str | None:
    """Why a message's list of parts is not canonical text and image parts, or None."""
    if not parts:
        return f"messages[{i}].content is an empty list"
    for j, part in enumerate(parts):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
            return f'{where} is not a text part {{"type": "text", "text": ...}} or an image part'
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            return f'{where} is a text part without "text" (a string)'
        if part["type"] == "image" and sum(isinstance(part.get(k), str) for k in ("path", "base64")) != 1:
            return f'{where} is an image part without one "path" or "base64" (a string)'
    return None


def content_text(content: str | list) -> str:
    """A message's text: the string, or its text parts joined."""
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")


def prompt_problem(prompt: object) -> str | None:
    """Why a GRPO prompt (a string, or a conversation ending on a user or system turn) is unusable, or None."""
    if isinstance(prompt, str):
        return None if prompt.strip() else '"prompt" is empty'
    if not isinstance(prompt, list) or not prompt:
        return 'a prompt record needs "prompt" as a string or a non-empty list of messages'
    for i, msg in enumerate(prompt):
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str) or msg.get("role") not in ROLES:
            return f'prompt[{i}] needs "role" (system, user or assistant) and "content" (a string)'
    if prompt[-1]["role"] == "assistant":
        return ("the prompt's last message is the assistant's; a prompt ends on the user's turn, and the model "
                "generates the assistant's answer")
    return None


def json_error(exc: json.JSONDecodeError, lineno: int | None = None) -> str:
    """Where and why, whole: 'line 2, column 10: not valid JSON (unterminated string starting at column
    10, near `"oops}`)'. json's `msg` alone ends in a dangling "at"; the position is in lineno/colno."""
    lineno = exc.lineno if lineno is None else lineno
    line = exc.doc.split("\n")[exc.lineno - 1]
    reason = exc.msg[0].lower() + exc.msg[1:]
    reason += f" column {exc.colno}" if reason.endswith(" at") else ""
    near = line[max(0, exc.colno - 21): exc.colno + 20].strip()  # 20 characters either side
    return f"line {lineno}, column {exc.colno}: not valid JSON ({reason}" + (f", near `{near}`)" if near else ")")


def parse_json_list(path: str | os.PathLike, text: str) -> list:
    """The records of a .json file: one JSON list. DataError naming the file and line otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"`{path}` {json_error(exc)}") from None
    if not isinstance(data, list):
        raise DataError(f"`{path}`: a .json record file must hold a list of records")
    return data


def require_records_file(path: str | os.PathLike) -> None:
    """DataError unless `path` is a file: a missing path, and a folder (which holds what, and how to use it)."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in (".jsonl", ".json"))[:5]
        listing = f" ({', '.join(inside)} {'is' if len(inside) == 1 else 'are'} in it)" if inside else ""
        raise DataError(f"`{path}` is a folder, not a records file: a records dataset's `path` is one .jsonl or "
                        f".json file{listing}; list each file under `datasets:`, or for a folder of HTML, CSV or "
                        "SQL sources set the entry's `type` to the source (e.g. `type: html`)")
    if not path.is_file():
        raise DataError(f"no data file at `{path}`; check the dataset path in the recipe")


def iter_json_objects(path: str | os.PathLike) -> Iterator[tuple[str, object]]:
    """(where, parsed value) for each record in a .jsonl file ("line 3") or a .json list ("item 3").

    Raises DataError naming the file and line for anything that is not JSON text."""
    path = Path(path)
    require_records_file(path)
    with open(path, "rb") as fh:
        head = fh.read(8192)
    if b"\x00" in head:
        raise DataError(f"`{path}` looks binary (it contains NUL bytes), not JSON/JSONL text")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"`{path}` is not UTF-8 text (byte {exc.start}: {exc.reason}); re-encode it as UTF-8"
        ) from None
    if path.suffix == ".json":
        yield from ((f"item {i}", item) for i, item in enumerate(parse_json_list(path, text), start=1))
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"`{path}` {json_error(exc, lineno)}") from None


def read_records(path: str | os.PathLike, shape: str = "auto") -> list[tuple[str, dict]]:
    """All records of a file as (shape, record), validated: supervised records as they are, preference and
    unpaired records in their canonical form. Raises DataError at the first bad record, and at the first
    record of another kind than the file's first (supervised, preference and unpaired do not mix)."""
    out, first = [], None  # first: (where, shape) of the file's first record
    for where, record in iter_json_objects(path):
        rec_shape = shape
        if isinstance(record, dict) and "conversations" in record and detect_shape(record) is None:
            record = _sharegpt(path, where, record)
        if shape == "auto":
            rec_shape = detect_shape(record) if isinstance(record, dict) else None
            if rec_shape is None:
                raise DataError(
                    f"`{path}` {where}: cannot tell the record's shape; expected a \"text\", "
                    f'"instruction"/"output" or "messages" key, a preference record\'s "chosen"/"rejected" '
                    f'or "completion"/"label", or a GRPO prompt record\'s "prompt"'
                )
            first = first or (where, rec_shape)
            if family(rec_shape) != family(first[1]):
                raise DataError(_mixed(path, where, rec_shape, *first))
        if rec_shape in SFT_SHAPES and isinstance(record, dict) and (rec_shape == "chat" or "images" in record):
            record = _with_images(path, where, record)
        try:  # a pair's prompt images: paths relative to the file's folder made absolute
            checked, problem = checked_record(record, rec_shape, ImageSource(Path(path).absolute().parent))
        except ImageRejected as rejected:
            raise DataError(f"`{path}` {where}: {rejected.detail}") from None
        if problem:
            raise DataError(f"`{path}` {where}: {problem}")
        out.append((rec_shape, checked))
    if not out:
        raise DataError(f"`{path}` holds no records; it is empty")
    return out


def _sharegpt(path, where: str, record: dict) -> dict:
    """A sharegpt record ({conversations: [{from, value}]}, roles human/gpt) as a chat record."""
    from finetune.ingest.record_map import sharegpt_record

    mapped, why = sharegpt_record(record, where, str(path))
    if mapped is None:
        raise DataError(f"`{path}` {where}: {why}")
    return mapped


def _with_images(path, where: str, record: dict) -> dict:
    """A chat record with its images in canonical parts, paths relative to the file's folder made absolute."""
    try:
        return canonical_images(record, record.get("images"), Path(path).absolute().parent)
    except ImageRejected as rejected:
        raise DataError(f"`{path}` {where}: {rejected.detail}") from None
    except PartProblem as problem:
        raise DataError(f"`{path}` {where}: {problem}") from None


def _mixed(path, where: str, shape: str, first_where: str, first_shape: str) -> str:
    return (f"`{path}` {where}: {a_shape(shape)} record, but the file's first record ({first_where}) "
            f"is {a_shape(first_shape)} record; a file holds supervised records (text, instruction, chat), preference "
            "pairs or unpaired (KTO) records, not a mix: split it into one file per kind and list each under "
            "`datasets:`")


def write_jsonl_atomic(path: str | os.PathLike, records: Iterable[object]) -> int:
    """Write records as JSONL via a temp file + rename: a crash never leaves a truncated file. Returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(path)  # honours the umask, like any other tool's output
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count
