"""Generation checks: greedy answers to held-out prompts, base and tuned side by side, each checked.

A prompt is written in the format the run trained with (finetune/model/prompt_format.py): a chat record's
conversation up to its last assistant turn through the chat template (a vision-language run's through its
processor, with the record's images); an instruction record's alpaca prompt,
exactly as the encoder writes it; the first half of a completion text; a preference record's prompt. Each
answer is checked:

- ended: the model emitted a stop token (end of sequence, its end-of-turn token) within max_new_tokens. An
  answer that never ends is the classic sign of a run that did not learn where a turn stops (or of a template
  that never supervises the end-of-turn token);
- empty: nothing but whitespace before the stop;
- loops: one n-gram of LOOP_NGRAM tokens occurs LOOP_REPEATS times or more (degenerate repetition).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from finetune.contract import alpaca_prompt

LOOP_NGRAM = 4  # tokens: short enough to catch "the the the the", long enough that prose rarely repeats one
LOOP_REPEATS = 3  # occurrences of one n-gram that count as a loop


def prompt_of(shape: str, record: dict) -> tuple[list[dict] | str, str]:
    """(the prompt: messages or text, the reference answer) of one held-out record."""
    if shape == "chat":
        messages = record["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return messages[:last], messages[last]["content"]
    if shape == "instruction":
        return alpaca_prompt(record), record["output"]
    if shape == "completion":
        words = record["text"].split(" ")
        half = max(1, len(words) // 2)
        return " ".join(words[:half]), " ".join(words[half:])
    if shape in ("preference", "unpaired"):
        answer = record.get("chosen", record.get("completion"))
        if isinstance(answer, list):
            answer = " ".join(m["content"] for m in answer)
        return record["prompt"], answer
    raise ValueError(f"no prompt in a {shape} record")


def prompt_ids(tokenizer, prompt, prompt_format: str) -> list[int]:
    """Token ids ending where the answer starts: the chat template's generation prompt for messages, the text
    with the tokenizer's special tokens otherwise (the alpaca prompt is already written out)."""
    if isinstance(prompt, list):
        if prompt_format == "chat" and tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        prompt = "\n".join(m["content"] for m in prompt)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def model_prompt(models, prompt, prompt_format: str) -> tuple[list[int], dict]:
    """(prompt token ids, the model's other inputs): a vision-language run's conversation through its processor,
    with its images' pixels (finetune/model/vision_prompt.py); anything else prompt_ids' ids alone."""
    if models.processor is not None and isinstance(prompt, list) and prompt_format == "chat":
        from finetune.model.vision_prompt import pixel_budget, prompt_inputs

        return prompt_inputs(models.processor, prompt, *pixel_budget(models.subject.recipe))
    return prompt_ids(models.tokenizer, prompt, prompt_format), {}


def shown(prompt) -> tuple[str, list[str]]:
    """(the prompt as the report shows it: a conversation one `role: text` line a message, each image as
    `<image N>`; the images in order: a file's path, or what a base64 image is)."""
    if isinstance(prompt, str):
        return prompt, []
    images: list[str] = []

    def text(content) -> str:
        if isinstance(content, str):
            return content
        out = []
        for part in content:
            if part.get("type") == "image":
                images.append(part.get("path") or f"a base64 image ({len(part.get('base64') or '')} characters)")
                out.append(f"<image {len(images)}>")
            else:
                out.append(part.get("text", ""))
        return "".join(out)

    return "\n".join(f"{m['role']}: {text(m['content'])}" for m in prompt), images


def image_lines(images: list[str], out_dir: Path | None) -> list[str]:
    """A prompt's images as a list under it: each file linked relative to the report (a markdown viewer shows it);
    an image without a file (base64 in the records) as what it is."""
    from urllib.parse import quote

    lines = []
    for i, image in enumerate(images, 1):
        if out_dir is not None and os.path.isabs(image):
            target = quote(os.path.relpath(image, out_dir).replace(os.sep, "/"))
            lines.append(f"- <image {i}>: [{Path(image).name}]({target}) (`{image}`)")
        else:
            lines.append(f"- <image {i}>: {image}")
    return ["images:", "", *lines, ""]


def loops(ids: list[int]) -> bool:
    grams = Counter(tuple(ids[i:i + LOOP_NGRAM]) for i in range(len(ids) - LOOP_NGRAM + 1))
    return bool(grams) and max(grams.values()) >= LOOP_REPEATS


def generate_checked(model, tokenizer, ids: list[int], max_new_tokens: int, seed: int, extra: dict | None = None
                     ) -> dict:
    """One greedy answer and its checks. `extra`: the model's other inputs (a vision-language model's pixels)."""
    import torch

    from finetune.model.inference import stop_token_ids

    stop = stop_token_ids(model, tokenizer)
    torch.manual_seed(seed)  # greedy needs no randomness; seeded so a sampling generation_config repeats too
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=stop,
                             **{k: v.to(device) for k, v in (extra or {}).items()},
                             pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0])
    new = out[0, len(ids):].tolist()
    ended = any(token in stop for token in new)
    if ended:
        new = new[:next(i for i, t in enumerate(new) if t in stop)]
    text = tokenizer.decode(new, skip_special_tokens=True).strip()
    return {"answer": text, "tokens": len(new), "ended": ended, "empty": not text, "loops": loops(new)}


def summary(checked: list[dict]) -> dict:
    n = len(checked)
    return {"answers": n, "never_ended": sum(not c["ended"] for c in checked),
            "empty": sum(c["empty"] for c in checked), "looping": sum(c["loops"] for c in checked),
            "mean_tokens": sum(c["tokens"] for c in checked) / n if n else 0.0}


def generation_checks(models, sides: list[tuple[str, object]], held, prompt_format: str, n: int,
                      max_new_tokens: int, seed: int) -> dict:
    """{"prompts": [{prompt, reference, <side>: checks}...], "summary": {<side>: counts}} for the first n
    held-out records. `sides`: (name, context manager factory giving that side's model)."""
    tokenizer = models.tokenizer
    chosen = held.records[:n]
    rows, inputs = [], []
    for shape, record in chosen:
        prompt, reference = prompt_of(shape, record)
        text, images = shown(prompt)
        rows.append({"prompt": text, "reference": reference, **({"images": images} if images else {})})
        inputs.append(model_prompt(models, prompt, prompt_format))
    for name, open_side in sides:
        with open_side() as model:
            for row, (ids, extra) in zip(rows, inputs):
                row[name] = generate_checked(model, tokenizer, ids, max_new_tokens, seed, extra)
    return {"prompts": rows, "summary": {name: summary([row[name] for row in rows]) for name, _ in sides},
            "max_new_tokens": max_new_tokens, "prompt_format": prompt_format}
