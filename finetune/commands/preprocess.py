"""Tokenize and cache a recipe's datasets; print counts and, with --show N, decoded examples.

A preference recipe (`method: dpo`...) shows each pair's prompt, chosen and rejected response (KTO: prompt,
completion and label) as the model reads them, the supervised response tokens in [[ ]]: exactly one BOS, the
assistant header at the end of the prompt, the end-of-turn token inside the response. A GRPO recipe shows prompts as the
model continues them, and runs every reward function on a few records (exit 2 when one fails)."""

from __future__ import annotations

import argparse
import json

from finetune.commands.args import add_recipe_arguments
from finetune.contract import IGNORE_INDEX
from finetune.recipe import load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="print N decoded training examples with the supervised spans in [[...]]")


def marked(tokenizer, input_ids: list[int], labels: list[int], image_ids=frozenset()) -> str:
    """Decode an example, wrapping each run of supervised tokens in [[ ]]; a run of one of `image_ids` (a vision
    model's image tokens) shows as the token and its count, `<image>x64`, where it sits."""
    from itertools import groupby

    out = []
    key = lambda pair: ("image", pair[0]) if pair[0] in image_ids else ("text", pair[1] != IGNORE_INDEX)  # noqa: E731
    for (kind, value), run in groupby(zip(input_ids, labels), key=key):
        tokens = [token for token, _ in run]
        if kind == "image":
            out.append(f"{tokenizer.convert_ids_to_tokens(value)}x{len(tokens)}")
        else:
            text = tokenizer.decode(tokens)
            out.append(f"[[{text}]]" if value else text)
    return "".join(out)


def show_preference(tokenizer, store, n: int, image_ids=frozenset()) -> None:
    """The first n training items of a preference store: prompt, then each response marked as supervised; a run of
    image tokens in a prompt (a vision-language model's) as the token and its count."""
    for item in range(min(n, store.n_train)):
        sequences = store.sequences(item)
        prompt = sequences[0][0]
        names = [f"completion, {'desirable' if store.labels[item] else 'undesirable'} (label "
                 f"{str(store.labels[item]).lower()})"] if store.unpaired else ["chosen", "rejected"]
        sizes = ", ".join(f"{name.split(',')[0]} {len(response)}" for name, (_, response) in zip(names, sequences))
        print(f"\n--- {'example' if store.unpaired else 'pair'} {item} (prompt {len(prompt)} tokens; {sizes}; "
              "supervised in [[ ]]) ---")
        print(f"[prompt]\n{marked(tokenizer, prompt, [IGNORE_INDEX] * len(prompt), image_ids)}")
        for name, (_, response) in zip(names, sequences):
            print(f"[{name}]\n{marked(tokenizer, response, response)}")


def _preference_counts(recipe, s: dict) -> None:
    unit = "examples" if recipe.method == "kto" else "pairs"
    print(f"records: {s['records']}; dropped: {s['dropped_too_long']} over sequence_len {recipe.sequence_len}, "
          f"{s['dropped_response_too_long']} whose response leaves no room for the prompt; prompts truncated from "
          f"their start: {s['truncated']}")
    for where in s.get("dropped_listed", []):
        print(f"  dropped: {where}")
    for name in ("train", "eval"):
        part = s[name]
        labels = f" ({part['desirable']} desirable, {part['undesirable']} undesirable)" if "desirable" in part else ""
        images = f", {part['image_tokens']:,} image tokens ({part['images']:,} images)" if "image_tokens" in part else ""
        print(f"{name}: {part['examples']} {unit}{labels}, {part['tokens']:,} tokens, "
              f"{part['supervised_tokens']:,} response tokens (supervised){images}")
    if s.get("dropped_images"):  # records left out because of their images, by reason
        print("  left out for their images: " + ", ".join(f"{n:,} {why}" for why, n in s["dropped_images"].items()))
    for name, packed in s.get("packing", {}).items():
        print(f"{name}: packed into {packed['rows']:,} rows of {packed['sequence_len']:,} tokens "
              f"({100 * packed['efficiency']:.0f}% filled)")


def show_grpo(recipe, tokenizer, prepared, n: int) -> int:
    """GRPO: prompt counts, n prompts as the model sees them, and every reward function run on a few records with a
    sample completion (finetune/train/grpo/reward_check.py), so a broken reward shows before a long run. Exit 2
    when a reward function fails there."""
    from finetune.train.grpo.reward_check import SAMPLE_RECORDS, report_rewards

    s = prepared.stats
    print(f"records: {s['records']}; dropped: {s['dropped_too_long']} longer than sequence_len - "
          f"max_completion_length; truncated from their start: {s['truncated']}")
    for where in s.get("dropped_listed", []):
        print(f"  dropped: {where}")
    print(f"train: {s['train']['examples']} prompts, {s['train']['tokens']:,} prompt tokens; "
          f"held out: {s['eval']['examples']} prompts")
    records = [json.loads(prepared.train[i]["record"])
               for i in range(min(max(n, SAMPLE_RECORDS), len(prepared.train)))]
    for i, record in enumerate(records[:n]):
        ids = prepared.train[i]["prompt_ids"]
        print(f"\n--- prompt {i} ({len(ids)} tokens; the model continues after it) ---")
        print(tokenizer.decode(ids))
        print(f"columns for the rewards: {json.dumps({k: v for k, v in record.items() if k != 'prompt'})}")
    print()
    return report_rewards(recipe, records, lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])


def _image_ids(processor) -> frozenset:
    return frozenset(i for i in getattr(processor, "image_token_ids", ()) if i is not None)


def run(args: argparse.Namespace) -> int:
    from finetune.data import build_dataset
    from finetune.model.families import generic_path
    from finetune.model.vision import tokenizer_and_processor

    recipe = generic_path(load_recipe(args.recipe, args.overrides))  # as train: a family's refusal, or no packing
    tokenizer, processor = tokenizer_and_processor(recipe)
    prepared = build_dataset(recipe, tokenizer, processor)
    s = prepared.stats
    print(f"cache: {prepared.cache_path}{' (reused)' if prepared.reused else ' (built)'}")
    if s.get("dropped_duplicates"):
        print(f"dataset_exact_deduplication: {s['dropped_duplicates']:,} records dropped, each the same as an earlier one")
    if recipe.method == "grpo":
        return show_grpo(recipe, tokenizer, prepared, args.show)
    if recipe.method != "sft":
        _preference_counts(recipe, s)
        show_preference(tokenizer, prepared.store, args.show, _image_ids(processor))
        return 0
    print(f"records: {s['records']}; dropped: {s['dropped_too_long']} over sequence_len {recipe.sequence_len}, "
          f"{s['dropped_no_supervised_tokens']} with no supervised tokens; truncated: {s['truncated']}")
    for source in s.get("sources", []):  # per `datasets:` entry; read/kept/dropped where it was read into records
        read = (f" (read {source['read']:,}, kept {source['kept']:,}"
                + "".join(f", {n:,} {why}" for why, n in source["dropped"].items()) + ")") if "read" in source else ""
        print(f"  {source['path']}: {source['records']:,} records{read}")
    if s.get("dropped_images"):  # records left out because of their images, by reason
        print("  left out for their images: " + ", ".join(f"{n:,} {why}" for why, n in s["dropped_images"].items()))
    for name in ("train", "eval"):
        part = s[name]
        images = f", {part['image_tokens']:,} image tokens ({part['images']:,} images)" if "image_tokens" in part else ""
        print(f"{name}: {part['examples']} examples, {part['tokens']:,} tokens, "
              f"{part['supervised_tokens']:,} supervised{images}")
    image_ids = _image_ids(processor)
    for i in range(min(args.show, len(prepared.train))):
        row = prepared.train[i]
        images = (f", {len(json.loads(row['images']))} image(s): each run of image tokens shows as TOKENxCOUNT"
                  if row.get("images") not in (None, "[]") else "")
        print(f"\n--- example {i} ({len(row['input_ids'])} tokens{images}; supervised in [[ ]]) ---")
        print(marked(tokenizer, row["input_ids"], row["labels"], image_ids))
    return 0
