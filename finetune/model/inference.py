"""Load what a run trained and generate text with it: used by `finetune chat` and `finetune generate`.

A vision-language run loads with its own Auto class and its saved processor (finetune/model/trained.py), and its
prompts may carry images (finetune/model/vision_prompt.py): load_for_inference then returns the processor in the
tokenizer's place, and reply() reads the images of the messages' image parts."""

from __future__ import annotations

from finetune.contract import alpaca_prompt
from finetune.model.trained import Trained, load_adapter_model, locate, saved_processor, saved_tokenizer
from finetune.model.prompt_format import served_format


def device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_for_inference(target: str, overrides: list[str] = ()):
    """(model, tokenizer) in eval mode from a recipe, an adapter folder or a model folder; for a vision-language
    run (model, processor): the processor holds the run's tokenizer.

    An adapter runs on its base as it was trained: 4-bit for QLoRA (when bitsandbytes can run here), in the
    training precision otherwise."""
    trained: Trained = locate(target, overrides)
    if trained.is_adapter:
        model, tokenizer = load_adapter_model(trained, *base_settings(trained.recipe))
    else:
        tokenizer = saved_tokenizer(trained.folder)
        model = trained.model_class().from_pretrained(str(trained.folder))
    tokenizer = saved_processor(trained) or tokenizer
    if getattr(model, "hf_device_map", None) is None:
        model.to(device())
    model.eval()
    return model, tokenizer


def served_format_of(target: str, overrides: list[str] = ()) -> tuple[str, str]:
    """served_format of what a recipe / folder holds (finetune.model.trained.locate)."""
    return served_format(locate(target, overrides).folder)


def base_settings(recipe) -> tuple[str, object]:
    """(dtype name, quantization config or None) for the base under an adapter."""
    if recipe is None:
        return "fp32" if device() == "cpu" else "bf16", None
    from finetune.model import get_quantization_config, resolve_precision
    from finetune.model.trained import torch_dtype

    precision = resolve_precision(recipe)
    return precision, get_quantization_config(recipe, torch_dtype(precision))


def encode_prompt(tokenizer, messages: list[dict], use_template: bool, prompt_format: str = "chat") -> list[int]:
    """Token ids for the conversation so far, ending where the assistant's reply starts, in the format the run
    trained with: the chat template, the alpaca prompt of the last user message (exactly as training encodes an
    instruction's prompt), or (`use_template` False, or "raw") the messages' text."""
    if use_template and prompt_format == "alpaca":
        last = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        return tokenizer(alpaca_prompt({"instruction": last}), add_special_tokens=True)["input_ids"]
    if use_template and prompt_format == "chat" and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def stop_token_ids(model, tokenizer) -> list[int]:
    """End of sequence, the model's own end-of-turn ids, and ChatML's <|im_end|> when the vocabulary has it."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, list) else [configured]) | {tokenizer.eos_token_id}
    ids.add(tokenizer.get_vocab().get("<|im_end|>"))
    return sorted(i for i in ids if isinstance(i, int))


def reply(model, tokenizer, messages: list[dict], max_new_tokens: int = 128, temperature: float = 0.0,
          use_template: bool = True, prompt_format: str = "chat", pixels: tuple = (None, None)) -> str:
    """The model's answer to `messages` (greedy when temperature is 0), without the prompt. `tokenizer`: the run's,
    or a vision-language run's processor, which reads the messages' image parts with `pixels` (image_max_pixels,
    image_min_pixels: the run's budget, finetune.model.vision_prompt.run_pixel_budget)."""
    import torch

    from finetune.model.vision_prompt import is_processor, prompt_inputs

    extra, processor = {}, tokenizer if is_processor(tokenizer) else None
    if processor is not None:
        tokenizer = processor.tokenizer
    if processor is not None and use_template:  # the template places the images; --raw text reads none
        ids, extra = prompt_inputs(processor, messages, *pixels)
    else:
        ids = encode_prompt(tokenizer, messages, use_template, prompt_format)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    stop = stop_token_ids(model, tokenizer)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id,
                             **{k: v.to(device) for k, v in extra.items()}, **sampling)
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True).strip()
