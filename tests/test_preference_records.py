"""Preference records at the ingestion layer: every accepted form -> the one canonical form, every problem as
one message naming file and line, files that mix kinds, and the cleaning of pairs and unpaired records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import write_jsonl
from finetune.contract import ALPACA_NO_INPUT, alpaca_prompt
from finetune.errors import DataError
from finetune.ingest.clean import Cleaner
from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths
from finetune.ingest.preference import canonical
from finetune.ingest.records import detect_shape, read_records, record_problem


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def bot(text: str) -> dict:
    return {"role": "assistant", "content": text}


def system(text: str) -> dict:
    return {"role": "system", "content": text}


PAIR = {"prompt": "What colour is the sky?", "chosen": "Blue.", "rejected": "Green."}
CONV_PAIR = {"prompt": [user("What colour is the sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]}


# --- every accepted form -> the canonical form ---------------------------------------------------------

FORMS = {
    "trl explicit plain, edges kept": (
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green.", "score": 9},
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    ),
    "trl explicit conversational": (
        {"prompt": [system("Be brief."), user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]},
        {"prompt": [system("Be brief."), user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]},
    ),
    "trl conversational, a message alone and extra message keys": (
        {"prompt": [{**user("Sky?"), "name": "x"}], "chosen": bot("Blue."), "rejected": [bot("Green.")]},
        CONV_PAIR | {"prompt": [user("Sky?")]},
    ),
    "trl implicit prompt, multi-turn": (
        {"chosen": [user("Hi"), bot("Hello!"), user("Sky?"), bot("Blue.")],
         "rejected": [user("Hi"), bot("Hello!"), user("Sky?"), bot("Green.")]},
        {"prompt": [user("Hi"), bot("Hello!"), user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]},
    ),
    "trl implicit prompt: messages compared whole, never as substrings": (
        {"chosen": [user("Sky?"), bot("It is blue.")], "rejected": [user("Sky?"), bot("It is green.")]},
        {"prompt": [user("Sky?")], "chosen": [bot("It is blue.")], "rejected": [bot("It is green.")]},
    ),
    "trl implicit prompt: shared assistant turns after the last shared user turn are answers": (
        {"chosen": [user("Sky?"), bot("Well,"), bot("blue.")], "rejected": [user("Sky?"), bot("Well,"), bot("green.")]},
        {"prompt": [user("Sky?")], "chosen": [bot("Well,"), bot("blue.")], "rejected": [bot("Well,"), bot("green.")]},
    ),
    "ultrafeedback: a string prompt beside whole conversations": (
        {"prompt": "Sky?", "chosen": [user("Sky?"), bot("Blue.")], "rejected": [user("Sky?"), bot("Green.")],
         "messages": [user("Sky?"), bot("Blue.")]},
        {"prompt": [user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]},
    ),
    "sharegpt, answers as messages": (
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Sky?"}],
         "chosen": {"from": "gpt", "value": "Blue."}, "rejected": [{"from": "gpt", "value": "Green."}]},
        {"prompt": [system("Be brief."), user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]},
    ),
    "sharegpt, answers as strings, empty system dropped": (
        {"conversations": [{"from": "system", "value": ""}, {"from": "user", "value": "Sky?"}],
         "chosen": "Blue.", "rejected": "Green."},
        CONV_PAIR | {"prompt": [user("Sky?")]},
    ),
    "alpaca with input": (
        {"instruction": "Add.", "input": "1 + 1", "chosen": "2", "rejected": "3"},
        {"prompt": alpaca_prompt({"instruction": "Add.", "input": "1 + 1"}), "chosen": "2", "rejected": "3"},
    ),
    "alpaca without input": (
        {"instruction": "Say hi.", "chosen": "Hi!", "rejected": "No."},
        {"prompt": ALPACA_NO_INPUT.format(instruction="Say hi."), "chosen": "Hi!", "rejected": "No."},
    ),
}


@pytest.mark.parametrize("given, expected", FORMS.values(), ids=FORMS.keys())
def test_every_preference_form_becomes_the_canonical_form(given, expected):
    assert detect_shape(given) == "preference"
    assert canonical(given, "preference") == expected
    assert canonical(expected, "preference") == expected  # the canonical form is itself accepted, unchanged


UNPAIRED = {
    "plain": ({"prompt": "Sky?", "completion": "Blue.", "label": True},
              {"prompt": "Sky?", "completion": "Blue.", "label": True}),
    "conversational": ({"prompt": [user("Sky?")], "completion": [bot("Green.")], "label": False, "id": 3},
                       {"prompt": [user("Sky?")], "completion": [bot("Green.")], "label": False}),
    "sharegpt messages": ({"prompt": [{"from": "human", "value": "Sky?"}],
                           "completion": [{"from": "gpt", "value": "Blue."}], "label": True},
                          {"prompt": [user("Sky?")], "completion": [bot("Blue.")], "label": True}),
    # LLaMA-Factory's KTO layout (its kto_en_demo): the assistant turns ending the conversation are the completion
    # (issue 33 item 9: it was read as a chat record and refused without naming the shape to use)
    "messages and label": ({"messages": [{"role": "system", "content": ""}, user("Hi"), bot("Yo"), user("Sky?"),
                                         bot("Blue.")], "label": False},
                           {"prompt": [user("Hi"), bot("Yo"), user("Sky?")], "completion": [bot("Blue.")],
                            "label": False}),
}


@pytest.mark.parametrize("given, expected", UNPAIRED.values(), ids=UNPAIRED.keys())
def test_unpaired_records_become_the_canonical_form(given, expected):
    assert detect_shape(given) == "unpaired"
    assert canonical(given, "unpaired") == expected
    assert canonical(expected, "unpaired") == expected


def test_alpaca_prompt_is_the_one_sft_instruction_records_render_with():
    from finetune.data import formats

    assert formats.alpaca_prompt is alpaca_prompt  # one template, re-exported where data/ always imported it
    record = {"instruction": "Add.", "input": "1 + 1", "chosen": "2", "rejected": "3"}
    assert canonical(record, "preference")["prompt"] == formats.alpaca_prompt({"instruction": "Add.", "input": "1 + 1"})
    assert canonical(record, "preference")["prompt"].endswith("### Input:\n1 + 1\n\n### Response:\n")


# --- detection and read_records --------------------------------------------------------------------------

def test_auto_detection_returns_canonical_pairs_and_sft_records_unchanged(tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"instruction": "Hi", "output": "Yo", "id": 1}, {"text": "t"}])
    assert read_records(sft) == [("instruction", {"instruction": "Hi", "output": "Yo", "id": 1}),
                                 ("completion", {"text": "t"})]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [v[0] for v in FORMS.values()])
    assert read_records(pairs) == [("preference", v[1]) for v in FORMS.values()]
    unpaired = write_jsonl(tmp_path / "kto.jsonl", [v[0] for v in UNPAIRED.values()])
    assert read_records(unpaired) == [("unpaired", v[1]) for v in UNPAIRED.values()]
    assert read_records(pairs, "preference")[0] == ("preference", list(FORMS.values())[0][1])


def test_preference_keys_win_over_the_sft_keys_they_carry():
    assert detect_shape({"messages": [], "chosen": [], "rejected": []}) == "preference"
    assert detect_shape({"instruction": "x", "chosen": "a", "rejected": "b"}) == "preference"
    assert detect_shape({"chosen": "a"}) == "preference"  # a side missing is said as such, not "unknown shape"
    assert detect_shape({"text": "x", "label": 1}) == "completion"  # an SFT record with a stray label stays SFT
    assert detect_shape({"prompt": "x", "completion": "y", "label": 0}) == "unpaired"  # said: label not a bool
    assert detect_shape({"prompt": "x", "completion": "y"}) is None  # TRL's unlabelled prompt-completion SFT form


PROBLEMS = [
    ({"prompt": "Sky?", "chosen": "Blue."}, '"rejected" is missing'),
    ({"prompt": "Sky?", "chosen": "", "rejected": "Green."}, '"chosen" is empty'),
    ({"prompt": "Sky?", "chosen": "Blue.", "rejected": " \n\t"}, '"rejected" is empty'),
    ({"prompt": "  ", "chosen": "Blue.", "rejected": "Green."}, '"prompt" is empty'),
    ({"prompt": [user("Sky?")], "chosen": [bot(" ")], "rejected": [bot("Green.")]}, "chosen[0] is empty"),
    ({"prompt": [user("Sky?")], "chosen": [], "rejected": [bot("Green.")]}, '"chosen" is empty: it holds no message'),
    ({"prompt": [user("")], "chosen": [bot("a")], "rejected": [bot("b")]}, "prompt message 0 (user) is empty"),
    ({"prompt": "Sky?", "chosen": "Blue.", "rejected": "Blue."}, '"chosen" and "rejected" are the same answer'),
    ({"prompt": "Sky?", "chosen": "Blue  sky.", "rejected": " Blue sky.\n"}, '"chosen" and "rejected" are the same'),
    ({"prompt": [user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Blue.")]}, "are the same answer"),
    ({"prompt": "Sky?", "chosen": [bot("Blue.")], "rejected": "Green."},
     'plain and conversational mixed: "prompt" and "rejected" are strings but "chosen" is a list of messages'),
    ({"instruction": "Sky?", "chosen": [bot("Blue.")], "rejected": "Green."},
     '"chosen" is a list of messages, but an alpaca-style record ("instruction") has a plain-text prompt'),
    ({"prompt": [user("Sky?"), bot("Hm.")], "chosen": [bot("Blue.")], "rejected": [bot("Green.")]},
     "the prompt ends with an assistant message; it must end with the user turn"),
    ({"conversations": [{"from": "human", "value": "Sky?"}, {"from": "gpt", "value": "Hm."}], "chosen": "a",
      "rejected": "b"}, "the prompt ends with an assistant message"),
    ({"prompt": [user("Sky?")], "chosen": [user("Blue.")], "rejected": [bot("Green.")]},
     "chosen[0] is a user message; \"chosen\" holds the assistant's answer only"),
    ({"prompt": [{"role": "bot", "content": "Sky?"}], "chosen": [bot("a")], "rejected": [bot("b")]},
     "prompt[0].role is 'bot'; expected one of system, user, assistant"),
    ({"conversations": [{"from": "robot", "value": "Sky?"}], "chosen": "a", "rejected": "b"},
     "conversations[0].from is 'robot'"),
    ({"chosen": [user("Tell me a joke"), bot("a")], "rejected": [user("Tell me a story"), bot("b")]},
     'no "prompt", and "chosen" and "rejected" do not begin with the same messages up to a user turn'),
    ({"chosen": [user("Hi"), bot("Yo"), user("A?"), bot("a")],
      "rejected": [user("Hi"), bot("Yo"), user("B?"), bot("b")]},
     '"chosen" and "rejected" differ before their last user turn (chosen[2] is a user message'),
    ({"chosen": "The sky is blue.", "rejected": "The sky is green."}, 'plain-text "chosen"/"rejected" need a "prompt"'),
    ({"prompt": "Sky?", "chosen": 3, "rejected": "b"}, '"chosen" must be a string or a list of messages, got int'),
    ({"prompt": "Sky?", "completion": "Blue.", "label": 1}, '"label" must be true or false (a JSON boolean), got 1'),
    ({"prompt": "Sky?", "completion": "Blue.", "label": "true"}, 'got "true"; write true for a desirable completion'),
    ({"prompt": "Sky?", "completion": "", "label": True}, '"completion" is empty'),
    ({"prompt": [user("Sky?")], "completion": "Blue.", "label": True},
     'plain and conversational mixed: "completion" is a string but "prompt" is a list of messages'),
    ({"messages": [user("Sky?")], "label": True}, '"messages" does not end with an assistant turn'),
]


@pytest.mark.parametrize("record, needle", PROBLEMS, ids=[n[:50] for _, n in PROBLEMS])
def test_each_problem_is_one_message_naming_file_and_line(tmp_path, record, needle):
    good = PAIR if "chosen" in record or "rejected" in record else {"prompt": "a", "completion": "b", "label": True}
    path = write_jsonl(tmp_path / "data.jsonl", [good, record])
    with pytest.raises(DataError) as err:
        read_records(path)
    assert str(err.value).startswith(f"`{path}` line 2: ")
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
    assert record_problem(record, detect_shape(record)) == str(err.value).split(": ", 1)[1]


def test_the_declared_type_is_the_shape_every_record_is_read_as(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [PAIR, {"messages": [user("hi"), bot("yo")]}])
    with pytest.raises(DataError, match=f"`{path}` line 2: \"chosen\" is missing"):
        read_records(path, "preference")
    with pytest.raises(DataError, match="line 1: an unpaired record needs \"label\""):
        read_records(path, "unpaired")
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "Sky?", "completion": "Blue."}])
    with pytest.raises(DataError, match="line 1: an unpaired record needs \"label\": true for a desirable"):
        read_records(path, "unpaired")


@pytest.mark.parametrize("records, said", [
    ([{"text": "a"}, {"messages": [user("q"), bot("a")]}, PAIR],
     "line 3: a preference record, but the file's first record (line 1) is a completion record"),
    ([PAIR, PAIR | {"chosen": "Azure."}, {"instruction": "q", "output": "a"}],
     "line 3: an instruction record, but the file's first record (line 1) is a preference record"),
    ([CONV_PAIR, {"prompt": "q", "completion": "a", "label": False}],
     "line 2: an unpaired record, but the file's first record (line 1) is a preference record"),
])
def test_a_file_mixing_kinds_is_one_error_saying_to_split_it(tmp_path, records, said):
    path = write_jsonl(tmp_path / "mixed.jsonl", records)
    with pytest.raises(DataError, match=re.escape(said)) as err:
        read_records(path)
    assert str(err.value).startswith(f"`{path}` line ")
    assert "split it into one file per kind" in str(err.value)


# --- cleaning --------------------------------------------------------------------------------------------

SLOP = "As an AI language model, I cannot say."


def run_ingest(tmp_path: Path, records: list, **opts) -> tuple[object, list, list]:
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    acct = ingest([str(src)], out, IngestOptions(**opts))
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    rejects = [json.loads(line) for line in sidecar_paths(out)[0].read_text().splitlines()]
    return acct, kept, rejects


def test_cleaning_pairs_slop_only_in_chosen_identical_and_empty_sides_and_dedup(tmp_path):
    records = [
        PAIR,                                                                    # 1 kept
        {"prompt": "Capital of France?", "chosen": SLOP, "rejected": "Paris."},   # 2 slop in chosen: dropped
        {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": SLOP},   # 3 slop in rejected: kept
        {"prompt": "Sky?", "chosen": "Blue.", "rejected": "Blue."},              # 4 identical_pair
        {"prompt": "Sky?", "chosen": "Blue\u200b.", "rejected": "Blue."},        # 5 identical once normalized
        {"prompt": "Sky?", "chosen": "", "rejected": "Green."},                  # 6 empty_side
        {"prompt": [user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("\u200b")]},  # 7 empty, normalized
        PAIR,                                                                    # 8 duplicate
        {"prompt": PAIR["prompt"], "chosen": "  BLUE. ", "rejected": "Green."},  # 9 duplicate (case, spaces)
        {"prompt": PAIR["prompt"], "chosen": "Green.", "rejected": "Blue."},     # 10 swapped: a different record
    ]
    acct, kept, rejects = run_ingest(tmp_path, records)
    assert acct.records_in == 10 and acct.records_out == 3
    assert acct.dropped == {"slop": 1, "identical_pair": 2, "empty_side": 2, "duplicate": 2}
    assert kept == [PAIR, records[2], records[9]]
    assert [(r["where"].rsplit(" ", 1)[1], r["reason"]) for r in rejects] == [
        ("2", "slop"), ("4", "identical_pair"), ("5", "identical_pair"), ("6", "empty_side"), ("7", "empty_side"),
        ("8", "duplicate"), ("9", "duplicate")]
    assert rejects[2]["detail"].startswith("after normalization: ")
    report = json.loads(sidecar_paths(tmp_path / "out.jsonl")[1].read_text())
    assert report["dropped"] == {"duplicate": 2, "empty_side": 2, "identical_pair": 2, "slop": 1}
    assert read_records(tmp_path / "out.jsonl") == [("preference", r) for r in kept]  # ingest output reads back


def test_cleaning_writes_the_canonical_form_normalized_with_plain_edges_kept(tmp_path):
    records = [
        {"prompt": "The  sky\r\nis", "chosen": " blue\u200b.", "rejected": " green.", "score": 3},
        {"conversations": [{"from": "human", "value": "Sky?  "}], "chosen": "Blue.", "rejected": "Green\u00a0 ."},
        {"instruction": "Add.", "input": "1 + 1", "chosen": "2", "rejected": "3"},
    ]
    _, kept, _ = run_ingest(tmp_path, records)
    assert kept == [
        {"prompt": "The sky\nis", "chosen": " blue.", "rejected": " green."},
        {"prompt": [user("Sky?")], "chosen": [bot("Blue.")], "rejected": [bot("Green .")]},
        {"prompt": alpaca_prompt({"instruction": "Add.", "input": "1 + 1"}), "chosen": "2", "rejected": "3"},
    ]


def test_slop_strip_touches_chosen_only(tmp_path):
    record = {"prompt": "Sky?", "chosen": f"Blue. {SLOP}", "rejected": f"Green. {SLOP}"}
    acct, kept, _ = run_ingest(tmp_path, [record], slop="strip")
    assert kept == [{"prompt": "Sky?", "chosen": "Blue.", "rejected": f"Green. {SLOP}"}]
    assert acct.slop_stripped == 1
    # a chosen answer that is all slop leaves nothing to teach
    acct, kept, rejects = run_ingest(tmp_path, [PAIR, {"prompt": "Sky?", "chosen": SLOP, "rejected": "Green."}],
                                     slop="strip")
    assert kept == [PAIR] and acct.dropped == {"slop": 1}
    assert rejects[0]["detail"].startswith("nothing left after stripping slop sentences (\"chosen\" is empty")


def test_unpaired_slop_is_looked_for_only_in_completions_labelled_true(tmp_path):
    records = [
        {"prompt": "Sky?", "completion": SLOP, "label": True},    # taught: dropped
        {"prompt": "Sky?", "completion": SLOP, "label": False},   # an undesirable example: kept
        {"prompt": "Sky?", "completion": "Blue.", "label": True},
        {"prompt": "Sky?", "completion": "Blue.", "label": False},  # same text, opposite label: not a duplicate
        {"prompt": "Sky?", "completion": "Blue.", "label": True},   # duplicate
        {"prompt": "Sky?", "completion": " ", "label": True},       # empty_side
        {"prompt": "Sky?", "completion": "Blue.", "label": 1},      # invalid_record
    ]
    acct, kept, _ = run_ingest(tmp_path, records)
    assert kept == [records[1], records[2], records[3]]
    assert acct.dropped == {"slop": 1, "duplicate": 1, "empty_side": 1, "invalid_record": 1}


def test_near_dedup_and_length_bounds_see_the_whole_pair(tmp_path):
    answer = "the quick brown fox jumps over the lazy dog near the river bank while the sun sets slowly " * 3
    records = [
        {"prompt": "Tell me about foxes.", "chosen": answer, "rejected": "No."},
        {"prompt": "Tell me about foxes.", "chosen": answer.replace("slowly", "quickly", 1), "rejected": "No."},
        {"prompt": "Hi", "chosen": "a", "rejected": "b"},  # 4 characters in all
    ]
    acct, kept, _ = run_ingest(tmp_path, records, near_dedup=0.8, min_chars=10)
    assert kept == [records[0]]
    assert acct.dropped == {"near_duplicate": 1, "too_short": 1}


def test_ingesting_mixed_kinds_stops_naming_both_records(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "a note"}, {"text": "more"}, PAIR])
    with pytest.raises(DataError, match=r"in.jsonl line 3: a preference record, but \S*in.jsonl line 1 is a "
                                        r"completion record; .* ingest each kind into its own file"):
        ingest([str(src)], tmp_path / "out.jsonl", IngestOptions())
    assert not (tmp_path / "out.jsonl").exists()
    # a line too broken to have a kind is a reject, not a reason to stop
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "a note"}, {"chosen": 5, "rejected": "b"}])
    assert ingest([str(src)], tmp_path / "out.jsonl", IngestOptions()).dropped == {"invalid_record": 1}


def test_cleaner_apply_on_a_pair():
    cleaner = Cleaner(IngestOptions())
    assert cleaner.apply({"chosen": [user("Sky?"), bot("Blue.")], "rejected": [user("Sky?"), bot("Green.")]}) == (
        CONV_PAIR | {"prompt": [user("Sky?")]}, None)
    record, (reason, detail) = cleaner.apply({"prompt": "Sky?", "chosen": "Blue.", "rejected": "Blue."})
    assert record is None and reason == "identical_pair" and "same answer" in detail


def test_a_kto_recipe_on_chat_records_names_the_layouts_it_reads(tmp_path, tiny_model_dir):
    from finetune.data import build_dataset
    from finetune.model.loader import load_tokenizer
    from finetune.recipe import load_recipe

    write_jsonl(tmp_path / "chat.jsonl", [{"messages": [user("Sky?"), bot("Blue.")]}])
    (tmp_path / "r.yml").write_text(json.dumps({
        "base_model": str(tiny_model_dir), "method": "kto", "datasets": [{"path": "chat.jsonl"}],
        "output_dir": "out", "cache_dir": "cache", "report_to": ["none"]}))
    recipe = load_recipe(tmp_path / "r.yml")
    with pytest.raises(DataError, match=r"is a chat record; .*\{prompt, completion, label\} or \{messages, label\}"):
        build_dataset(recipe, load_tokenizer(recipe))
