"""Recipe loading: every problem at once, with key path, line, value and fix."""

from __future__ import annotations

import pytest
import yaml

from finetune.cli import main as cli_main
from finetune.errors import RecipeError
from finetune.recipe.load import apply_override, load_recipe


def write(tmp_path, text: str):
    path = tmp_path / "r.yml"
    path.write_text(text)
    return path


BASE = "base_model: some/model\ndatasets:\n  - path: d.jsonl\n"


def problems(tmp_path, text, **kw) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, text), **kw)
    return info.value.problems


def test_unknown_key_suggests_the_right_one_with_its_line(tmp_path):
    (p,) = problems(tmp_path, BASE + "lerning_rate: 1e-4\n")
    assert "`lerning_rate` (line 4)" in p and "did you mean `learning_rate`" in p


def test_unknown_key_inside_a_dataset_entry(tmp_path):
    (p,) = problems(tmp_path, "base_model: m\ndatasets:\n  - path: d.jsonl\n    typ: chat\n")
    assert "`datasets[0].typ` (line 4)" in p and "did you mean `type`" in p


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems(tmp_path, BASE + "micro_batch_size: -1\nadapter: lorra\nlora_r: many\nnum_epoch: 2\n")
    joined = "\n".join(found)
    assert len(found) == 4
    assert "`micro_batch_size` (line 4): got -1" in joined
    assert "`adapter` (line 5): got 'lorra'" in joined and "'lora'" in joined
    assert "`lora_r` (line 6): got 'many'" in joined
    assert "did you mean `num_epochs`" in joined


def test_missing_required_keys(tmp_path):
    found = problems(tmp_path, "learning_rate: 1e-4\n")
    assert any("`base_model`: required" in p for p in found)
    assert any("`datasets`: required" in p for p in found)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ("warmup_steps: 10\nwarmup_ratio: 0.1\n", "`warmup_steps` and `warmup_ratio`"),
        ("load_in_4bit: true\n", "cannot be fully fine-tuned"),
        ("chat_template: jinja\n", "needs the template in `chat_template_jinja`"),
        ("global_batch_size: 10\nmicro_batch_size: 4\n", "not a multiple"),
        ("global_batch_size: 16\nmicro_batch_size: 4\ngradient_accumulation_steps: 2\n", "!= micro_batch_size 4"),
        ("cosine_min_lr_ratio: 0.1\nlr_scheduler: linear\n", "only applies to `lr_scheduler: cosine`"),
    ],
)
def test_cross_field_checks(tmp_path, extra, needle):
    assert any(needle in p for p in problems(tmp_path, BASE + extra))


def test_global_batch_derives_accumulation_from_processes(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE + "global_batch_size: 32\nmicro_batch_size: 4\n"), world_size=2)
    assert recipe.gradient_accumulation_steps == 4  # 4 micro x 4 accumulation x 2 processes = 32


def test_relative_paths_resolve_against_the_recipe_folder(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE))
    assert recipe.datasets[0].path == str(tmp_path / "d.jsonl")
    assert recipe.output_dir == str(tmp_path / "outputs")
    assert recipe.base_model == "some/model"  # a hub id stays as written


def test_overrides_set_any_key_with_yaml_values(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE), ["learning_rate=3e-5", "datasets.0.type=chat", "lora_target_modules=[q_proj]"])
    assert recipe.learning_rate == 3e-5 and recipe.datasets[0].type == "chat"
    assert recipe.lora_target_modules == ["q_proj"]
    with pytest.raises(RecipeError, match="does not exist"):
        apply_override(yaml.safe_load(BASE), "datasets.3.path=x")


def test_override_with_a_misspelt_key_is_caught(tmp_path):
    found = problems(tmp_path, BASE, overrides=["learnng_rate=1"])
    assert any("did you mean `learning_rate`" in p for p in found)


@pytest.mark.parametrize("text, needle", [
    ("", "empty"), ("- a\n- b\n", "mapping"), ("base_model: [unclosed\n", "not valid YAML at line"),
])
def test_broken_files(tmp_path, text, needle):
    assert any(needle in p for p in problems(tmp_path, text))


def test_validate_cli_exits_2_with_one_readable_message(tmp_path, capsys):
    path = write(tmp_path, BASE + "lerning_rate: 1e-4\n")
    assert cli_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "did you mean `learning_rate`" in err and "Traceback" not in err


def test_validate_cli_prints_resolved_recipe(tmp_path, capsys):
    # --recipe-only: `some/model` is a hub id no test machine has (tests/test_preflight.py checks the machine)
    assert cli_main(["validate", str(write(tmp_path, BASE)), "--set", "lora_r=32", "--recipe-only"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["lora_r"] == 32 and resolved["learning_rate"] == 2e-4


def test_docs_recipe_md_is_current():
    from pathlib import Path

    from finetune.commands.schema import recipe_markdown

    docs = Path(__file__).parent.parent / "docs" / "recipe.md"
    assert docs.read_text() == recipe_markdown(), "docs/recipe.md is stale: finetune schema --markdown > docs/recipe.md"


def test_schema_is_json_with_every_field(capsys):
    import json

    assert cli_main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"base_model", "datasets", "learning_rate", "lora_r"} <= set(schema["properties"])


def test_a_key_set_twice_is_an_error_naming_both_lines(tmp_path):
    # YAML keeps the last value silently: lora_r 8 would train at 64 with no word
    found = problems(tmp_path, BASE + "lora_r: 8\nlearning_rate: 1e-4\nlora_r: 64\n")
    assert found == ["`lora_r` is set twice (lines 4 and 6); YAML keeps only the last value: delete one"]
    nested = problems(tmp_path, "base_model: m\ndatasets:\n  - path: d.jsonl\n    type: chat\n    type: text\n")
    assert nested == ["`datasets[0].type` is set twice (lines 4 and 5); YAML keeps only the last value: delete one"]


def test_a_bad_override_is_reported_as_the_command_lines_not_at_the_yaml_line_it_replaced(tmp_path):
    (p,) = problems(tmp_path, BASE + "lora_r: 8\n", overrides=["lora_r=many"])
    assert p.startswith("`lora_r` (--set lora_r=many): got 'many'") and "line" not in p
    (p,) = problems(tmp_path, BASE, overrides=["datasets.0.typ=chat"])
    assert p.startswith("`datasets[0].typ` (--set datasets.0.typ=chat): unknown key")
    # a key under a replaced mapping is no longer at its YAML line either
    (p,) = problems(tmp_path, BASE, overrides=["datasets=[{path: d.jsonl, typ: chat}]"])
    assert "(line" not in p and "--set datasets=" in p
