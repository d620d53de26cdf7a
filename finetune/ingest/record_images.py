"""Images in chat records: every layout in, one canonical form out (the contract the data stage reads).

A message's `content` is a string or a list of typed parts. In the canonical form a part is
  {"type": "text", "text": "..."}
  {"type": "image", "path": "/absolute/path.jpg"}  or  {"type": "image", "base64": "..."}
and a message whose parts are all text has its text joined back into one string, so a text-only record reads the
same whichever way it was written. What is read (and turned into that):

  parts       {"type": "image", "path": "images/a.png"}   a path relative to the data file's folder (or absolute)
              {"type": "image", "base64": "..."}           also a `data:image/...;base64,` URL
              {"type": "image", "image": ...}              a path, the bytes, a PIL image, or datasets' Image
                                                           value ({"bytes", "path"})
              {"type": "image_url", "image_url": {"url": "data:..."}}   OpenAI's part (a data URL; a web URL is
                                                           refused)
  TRL         an `images` column, and {"type": "image"} placeholders in the messages, filled in order
  LLaMA-Factory  `<image>` in a message's text, and an `images` list, filled in order
  images only  an `images` column and no placeholder anywhere: the images lead the first user turn (as TRL does)

A different count of placeholders and images is a counted reject (image_count_mismatch); a URL is an
ImageRejected (image_url_offline) that the readers turn into one error: finetune reads local files only. With a
`store` (the records cache), bytes, PIL images (a datasets Image column) and base64 are written to the cache,
content-addressed, and the part points to that file: the cached JSONL stays small, and an image shared by many
records is written once. Without one (a records file read directly), base64 stays base64.

No torch here: ingestion never imports the training stack.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path

from finetune.ingest.images import ImageRejected, image_bytes, is_url, open_bytes, url_message

IMAGE_TAG = "<image>"  # LLaMA-Factory's placeholder in a message's text
SOURCE_KEYS = ("path", "base64", "image", "url")  # what an image part may carry its image under

PNG_MODES = ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA")

Store = Callable[[bytes], str]  # image bytes -> the absolute path they were written to


class PartProblem(ValueError):
    """A part that is not a text or image part: an invalid record (the message says where)."""


def image_parts(record: dict) -> list[dict]:
    """The image parts of a record, in order (every message's list content, first to last): a chat record's
    messages, or a preference record's prompt."""
    messages = record.get("messages")
    if messages is None and isinstance(record.get("prompt"), list):
        messages = record["prompt"]
    return [part for message in messages or [] if isinstance(message, dict)
            and isinstance(message.get("content"), list) for part in message["content"]
            if isinstance(part, dict) and part.get("type") == "image"]


def has_images(record: dict) -> bool:
    return bool(image_parts(record))


def canonical_images(record: dict, images: object, base_dir: Path, store: Store | None = None) -> dict:
    """`record` (a chat record) with its images in canonical parts and `images` (its images column: a list,
    one image, or None) placed. Raises ImageRejected (image_count_mismatch, image_url_offline, or an image
    `store` cannot read) or PartProblem (a part of an unknown type)."""
    listed = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
    record = {k: v for k, v in record.items() if k != "images"}
    messages = record.get("messages")
    if not isinstance(messages, list):
        if listed:
            raise PartProblem("an `images` column goes with a chat record (messages); map the row's text to turns "
                              "(`map: {user: ..., assistant: ..., images: ...}`) or its conversation")
        return record
    split_tags = images is not None  # `<image>` is a placeholder only where the record lists its images
    messages = [_message_parts(m, i, split_tags) if isinstance(m, dict) else m for i, m in enumerate(messages)]
    slots = sum(1 for part in _parts(messages) if _is_placeholder(part))
    if listed and not any(_is_image(part) for part in _parts(messages)):
        messages = _lead_first_user_turn(messages, len(listed))
    elif slots != len(listed):
        raise ImageRejected("image_count_mismatch", f"{slots} image placeholder{'s' * (slots != 1)} "
                            f"({IMAGE_TAG} or {{\"type\": \"image\"}}) but {len(listed)} image"
                            f"{'s' * (len(listed) != 1)} in the record's `images`")
    fill = iter(listed)
    out = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            parts = [_canonical_part(next(fill) if _is_placeholder(p) else p, base_dir, store)
                     if _is_image(p) else p for p in message["content"]]
            message = {**message, "content": _joined(parts)}
        out.append(message)
    return {**record, "messages": out}


def prompt_images(prompt: list[dict], images: object, base_dir: Path, store: Store | None = None) -> list[dict]:
    """A preference record's prompt messages with their images placed and canonical, as a chat record's are
    (`images`: the record's `images` column). An image belongs to a user turn. Raises ImageRejected or PartProblem."""
    try:
        prompt = canonical_images({"messages": prompt}, images, base_dir, store)["messages"]
    except PartProblem as problem:
        raise PartProblem(f"prompt: {str(problem).replace('messages[', 'prompt[')}") from None
    for i, message in enumerate(prompt):
        if message.get("role") != "user" and image_parts({"messages": [message]}):
            raise PartProblem(f"prompt[{i}] is {'an' if message.get('role') == 'assistant' else 'a'} "
                              f"{message.get('role')} message with an image: images go in the user turns the answers "
                              "reply to")
    return prompt


def _parts(messages: list) -> list:
    return [p for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list) for p in m["content"]]


def _message_parts(message: dict, index: int, split_tags: bool) -> dict:
    """The message with its parts cleaned (arrow's None-valued keys dropped, OpenAI's image_url an image part) and
    `<image>` in its text split into placeholders when the record lists its images."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": _split_tags(content)} if split_tags and IMAGE_TAG in content else message
    if not isinstance(content, list):
        return message
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise PartProblem(f"messages[{index}].content[{j}] is not an object")
        part = {k: v for k, v in part.items() if v is not None}  # arrow gives every struct every key
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.extend(_split_tags(part["text"]) if split_tags and IMAGE_TAG in part["text"] else [part])
        elif kind == "image_url" and isinstance(part.get("image_url"), dict) and "url" in part["image_url"]:
            parts.append({"type": "image", "url": part["image_url"]["url"]})
        elif kind == "image":
            if len([k for k in SOURCE_KEYS if k in part]) > 1:
                raise PartProblem(f"messages[{index}].content[{j}] gives its image twice "
                                  f"({', '.join(k for k in SOURCE_KEYS if k in part)}); give one")
            parts.append(part)
        else:
            raise PartProblem(f"messages[{index}].content[{j}] is not a text part {{\"type\": \"text\", \"text\": "
                              f"...}} or an image part {{\"type\": \"image\", \"path\": ...}} (its type: {kind!r})")
    return {**message, "content": parts}


def _split_tags(text: str) -> list[dict]:
    parts = []
    for i, piece in enumerate(text.split(IMAGE_TAG)):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _is_image(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"


def _is_placeholder(part: object) -> bool:
    return _is_image(part) and not any(k in part for k in SOURCE_KEYS)


def _lead_first_user_turn(messages: list, n: int) -> list:
    """The images (n placeholders) at the start of the first user turn; TRL's rule for an `images` column."""
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            return messages[:i] + [{**message, "content": [{"type": "image"}] * n + text}] + messages[i + 1:]
    raise ImageRejected("image_count_mismatch", f"{n} image{'s' * (n != 1)} in `images` but no user turn to show "
                        "them in")


def _canonical_part(value: object, base_dir: Path, store: Store | None) -> dict:
    """An image part, or a value from an `images` column, as {"type": "image", "path" | "base64": ...}."""
    if isinstance(value, dict) and value.get("type") == "image":
        for key in ("path", "base64", "url"):
            if key in value:
                return _from_string(value[key], base_dir, key, store)
        value = value.get("image")
    if isinstance(value, str):
        return _from_string(value, base_dir, "path", store)
    if isinstance(value, dict) and ("bytes" in value or "path" in value):  # datasets' Image(decode=False)
        if value.get("bytes"):
            return _stored(value["bytes"], store)
        if value.get("path"):
            return _from_string(value["path"], base_dir, "path", store)
        raise ImageRejected("empty_image", "an image value with neither bytes nor a path")
    if isinstance(value, (bytes, bytearray)):
        return _stored(bytes(value), store)
    if type(value).__module__.startswith("PIL."):  # a decoded datasets Image, or a PIL image built in memory
        buffer = io.BytesIO()  # lossless: PNG, or TIFF for the modes PNG cannot hold (CMYK, float)
        value.save(buffer, format="PNG" if value.mode in PNG_MODES else "TIFF")
        return _stored(buffer.getvalue(), store)
    raise ImageRejected("unreadable_image", f"an image given as {type(value).__name__}; an image is a path, base64, "
                        "bytes or a PIL image")


def _from_string(value: str, base_dir: Path, key: str, store: Store | None) -> dict:
    if value.startswith("data:"):
        head, _, value = value.partition(",")
        if not head.endswith(";base64"):
            raise ImageRejected("unreadable_image", f"a data URL that is not base64 ({head[:40]})")
        key = "base64"
    elif is_url(value) or key == "url":
        raise ImageRejected("image_url_offline", url_message(value))
    if key == "base64":
        if store is None:
            return {"type": "image", "base64": value}
        return _stored(image_bytes({"base64": value}), store)
    path = Path(os.path.expanduser(value))
    return {"type": "image", "path": str(path if path.is_absolute() else (base_dir / path).absolute())}


def _stored(data: bytes, store: Store | None) -> dict:
    if store is None:  # read without a records cache (a plain JSON file cannot hold bytes anyway)
        import base64

        return {"type": "image", "base64": base64.b64encode(data).decode("ascii")}
    return {"type": "image", "path": store(data)}


def _joined(parts: list[dict]) -> str | list[dict]:
    """A list of text parts alone as one string; parts with an image as they are."""
    if any(p.get("type") != "text" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def image_store(folder: Path) -> Store:
    """A Store writing each image once, named by its content: `folder/<sha256>.<format>`. The bytes are opened
    (header only) first, so an unreadable image is an ImageRejected, not a file in the cache."""
    def store(data: bytes) -> str:
        image = open_bytes(data, f"an image of {len(data):,} bytes")
        name = f"{hashlib.sha256(data).hexdigest()}.{(image.format or 'img').lower()}"
        target = folder / name
        if not target.is_file():
            from finetune.atomic import temp_file

            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = temp_file(target)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        return str(target.absolute())

    return store
