"""The training run, top to bottom: count the data, resolve every setting once, build TrainingArguments
from them, build the model, train, evaluate, save, record what ran.

    run_training(recipe)
      start_process_group   the process group (one process: a group of one); only rank 0 tokenizes
      hold_output_dir       one run per output folder: a second run into it is refused (train/output_lock.py)
      count_data            tokenizer + tokenized (and packed) data, counted
      resolve               ONE frozen Resolved: precision, attention, optimizer, learning rate with its plan,
                            packing, step numbers, world size, the DeepSpeed JSON (finetune/train/settings.py);
                            each GPU fast path it chooses is probed on the device first (train/fast_paths.py)
      training_arguments    TrainingArguments, once, from the recipe and the Resolved (train/arguments.py)
      prepare_model         the model (+ the packing guard, the supervised-logits probe, compile), the collator
      train                 Trainer: eval before, train, the final eval (once)
      save_and_record       model, tokenizer, recipe.resolved.yml, run.json, loss curve (train/record.py)

The command line (`finetune train`, `python -m finetune.train`, `accelerate launch -m finetune.train`)
lives in finetune/commands/train.py; this module is the library it calls.

Everything that can fail because of the user (recipe, data, base model) is checked before output_dir
is created, so a bad run leaves nothing half-written behind.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import NamedTuple

from finetune.log import get_logger
from finetune.train.fast_paths import say
from finetune.train.arguments import training_arguments
from finetune.train.record import save_and_record
from finetune.train.run_report import report_settings
from finetune.train.stop_record import recording_stops
from finetune.train.settings import Resolved, cuda_available, plan_numbers, resolve

log = get_logger(__name__)

__all__ = ["plan_numbers", "run_training", "training_arguments"]


def count_data(recipe, state):
    """(tokenizer, Prepared): only the main process converts the model and tokenizes; the others wait at
    the barrier, then read the cache."""
    from finetune.data import build_dataset
    from finetune.model.vision import tokenizer_and_processor

    with state.main_process_first():
        tokenizer, processor = tokenizer_and_processor(recipe)
        prepared = build_dataset(recipe, tokenizer, processor)
    stats = prepared.stats
    if stats.get("dropped_duplicates"):
        log.info(f"dataset_exact_deduplication: {stats['dropped_duplicates']:,} records dropped, each the same as an "
                 "earlier one")
    if stats.get("dropped_images"):  # records left out because of their images, by reason
        log.info("data: left out for their images: " + ", ".join(f"{n:,} {why}" for why, n in
                                                                  stats["dropped_images"].items()))
    if recipe.method == "grpo":
        from finetune.data.grpo.prompts import template_note
        from finetune.train.grpo.reward_check import check_signatures

        log.info(f"data: {stats['records']} records -> {stats['train']['examples']} train / {stats['eval']['examples']} "
                 f"held-out prompts; dropped {stats['dropped_too_long']} too long, truncated {stats['truncated']}"
                 f"{' (cached)' if prepared.reused else ''}")
        note = template_note(stats, tokenizer)
        if note:
            log.warning(note)
        first = json.loads(prepared.train[0]["record"])
        check_signatures(recipe, first)  # the records' columns: before the model
        if any(entry.model for entry in recipe.rewards):
            from finetune.train.grpo.reward_models import check_model_prompts

            check_model_prompts(recipe, isinstance(first["prompt"], list))
        return tokenizer, prepared
    if prepared.store is not None:
        kind = "examples" if prepared.store.unpaired else "pairs"
        log.info(f"data: {stats['records']} records -> {stats['train']['examples']} train / {stats['eval']['examples']} "
                 f"eval {kind}; dropped {stats['dropped_too_long']} too long, {stats['dropped_response_too_long']} "
                 f"whose response leaves no room for the prompt; prompt cut from its start in {stats['truncated']}"
                 f"{' (cached)' if prepared.reused else ''}")
        return tokenizer, prepared
    log.info(f"data: {stats['records']} records -> {stats['train']['examples']} train / "
             f"{stats['eval']['examples']} eval examples; dropped {stats['dropped_too_long']} too long, "
             f"{stats['dropped_no_supervised_tokens']} with no supervised tokens; truncated {stats['truncated']}"
             f"{' (cached)' if prepared.reused else ''}")
    return tokenizer, prepared


def probe_model(model, collator, attn: str, packed: bool, seed: int) -> None:
    """What needs a forward pass of the real model: proving packed examples isolated (refusing to train
    otherwise), and the supervised-only logits, enabled only where a probe shows the loss unchanged."""
    from finetune.model.supervised_logits import attach

    if packed:
        from finetune.model.isolation import guard_packing

        leak = guard_packing(model, collator, attn)
        log.info(f"packed examples are isolated: logits of a packed example match it alone (leak {leak:.1e} of "
                 "full cross-attention)")
    if attach(model, seed) is not None:
        log.info("loss on supervised positions only: the LM head skips prompt, padding and boundary positions")
    else:
        log.info("LM head on every position: this model's forward does not allow gathering supervised positions")


class Built(NamedTuple):
    """What prepare_model hands the Trainer."""

    model: object
    tokenizer: object
    collator: object
    callbacks: list  # the model's own (ZeRO-3 probes, compile time), then the caller's
    # preference methods: log-probs from the model's full logits (sequence_logps.py); under ZeRO-3 the probe that
    # answers it, run by the trainer once the engine holds the weights
    full_logits: object = False
    # PiSSA / OLoRA: the adapter's starting tensors, for the final save's conversion (model/lora_variants.py)
    initial_adapter: dict | None = None


def prepare_model(recipe, tokenizer, settings: Resolved, device, store=None, eva_rows=None, processor=None) -> Built:
    """The model, tokenizer, collator and the model's callbacks for the Trainer. The packing guard and the
    supervised-logits probe run here, on the device that trains, before anything is written, except under
    ZeRO-3 and FSDP2, where they wait for the engine to shard and gather the weights; then the decoder layers are
    compiled when asked."""
    from transformers import set_seed

    from finetune.data.collate import Collator
    from finetune.model import base_causal_lm, build_model
    from finetune.model.loader import adapter_folder
    from finetune.model.lora_variants import initial_adapter
    from finetune.model.varlen_attention import use_varlen_attention
    from finetune.recipe.adapter import mutates_base, uses_eva
    from finetune.train.callbacks.experts import prepare_experts_for_training
    from finetune.train.callbacks.stages import AtTrainBegin

    set_seed(recipe.seed)  # LoRA / new-embedding init draws from the global RNG: seed it like the Trainer does
    model, tokenizer = build_model(recipe, tokenizer, settings.precision, settings.attn_implementation)
    # PiSSA / OLoRA made here (not an adapter continued from base_model): keep the start for the final save
    made_here = adapter_folder(recipe.base_model) is None  # a continued adapter keeps its own init (model/__init__.py)
    initial = initial_adapter(model) if mutates_base(recipe) and made_here else None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # flash-attn reads example boundaries from position_ids only in a batch of one row: flatten for it
    flatten = settings.attn_implementation == "flash_attention_2"
    collator, pixels = Collator(pad_id, flatten=flatten), None
    if processor is not None:  # a vision-language model: the text batch plus its rows' pixels
        from finetune.data.vision.collate import Pixels, VisionCollator

        collator = VisionCollator(collator, processor, recipe.image_max_pixels, recipe.image_min_pixels)
        pixels = Pixels(processor, recipe.image_max_pixels, recipe.image_min_pixels)
    attn = settings.attn_implementation
    # GRPO scores its completions in packed rows of its own, with or without sample_packing
    varlen = ((settings.packed or recipe.method == "grpo") and attn == "sdpa" and device.type == "cpu"
              and use_varlen_attention(base_causal_lm(model)))
    if varlen:
        log.info("packed rows on CPU: attention runs example by example (no masked-out work)")
    # LoRA dropout's backward mask as bool, not float32: the same numbers, 1/4 the bytes; not under compile, where
    # inductor generates the dropout itself (and traced MaskDropout gave a nan gradient at step 1)
    if device.type == "cpu" and not settings.compile:
        from finetune.model.mask_dropout import use_mask_dropout

        use_mask_dropout(model)
    if recipe.method == "grpo":  # prompts: the trainer generates and scores in rows of its own (train/grpo/)
        from finetune.train.grpo.setup import PromptCollator, probe_grpo

        collator, probe = PromptCollator(), probe_grpo
    elif store is not None:  # preference methods and reward models: rows of pair ids into the token store
        from finetune.train.preference.setup import preference_collator, probe_preference
        from finetune.train.reward.setup import probe_reward

        # only the per-example path runs a response as a branch of the prompt before it: flash-attn, flex_attention
        # and a masked SDPA read every segment as an example of its own, so there each response keeps its prompt
        # and on that path a micro batch of packed rows is one row: no padding to its longest row (padding went
        # through every layer: a third of a SmolLM2 DPO step's activation memory, docs/performance.md)
        collator = preference_collator(store, pad_id, flatten or varlen, branches=varlen, pixels=pixels)
        probe = functools.partial(probe_reward if recipe.method == "reward" else probe_preference,
                                  collator=collator, pad_id=pad_id, attn=attn, packed=settings.packed)
    else:
        probe = functools.partial(probe_model, collator=collator, attn=attn, packed=settings.packed, seed=recipe.seed)
    at_train_begin, full_logits = [], False
    if settings.weights_partitioned and store is not None and recipe.method != "reward":
        full_logits = probe  # ZeRO-3: the trainer probes at its first loss, before the reference pass needs the answer
    elif settings.weights_partitioned:  # ZeRO-3 / FSDP2: after the engine shards the model and gathers the weights
        at_train_begin.append(AtTrainBegin(probe))
    else:
        if device.type != "cpu" and not getattr(model, "hf_device_map", None):
            # where the Trainer would put it, so the probes run the kernels that train (flex_attention and
            # flash-attn have no CPU path to probe); a quantized base is on its GPU already (device_map)
            model.to(device)
        if eva_rows is not None and uses_eva(recipe) and made_here:  # on the device, before the probes (SFT only)
            from finetune.model.lora_variants import eva_initialise

            eva_initialise(model, collator, eva_rows, recipe.micro_batch_size)
        full_logits = bool(probe(model))  # before anything is written: a refusal costs nothing
    # mixture-of-experts: router_aux_loss and expert load in the logs, ZeRO-3 leaves (train/callbacks/experts.py)
    experts = prepare_experts_for_training(model, recipe, settings.deepspeed)
    # after the probes: they run eager, in eval mode or with no grad
    return Built(model, tokenizer, collator, [*at_train_begin, *experts, *compile_model(model, settings)],
                 full_logits, initial)


def compile_model(model, settings: Resolved) -> list:
    """Compile the decoder layers when the settings say so (`compile: auto`: on CUDA); [the callback that
    reports the compile time once] or []."""
    from finetune.model.regional_compile import compile_decoder_layers
    from finetune.train.callbacks.compile_time import CompileTimeCallback

    if not settings.compile:
        say(f"compile: off ({settings.compile_reason})", settings.probes.get("compile"))
        return []
    layers = compile_decoder_layers(model)
    say(f"compile: {layers} decoder layers with torch.compile ({settings.compile_reason}); the first step "
        "includes compiling", settings.probes.get("compile"))
    return [CompileTimeCallback(layers, log.info)]


def final_eval_loss(trainer) -> float:
    """The eval loss after training, evaluated once. The Trainer evaluates on its own schedule (each
    epoch's end, or every eval_steps); when its last evaluation was at the final step, that is the final
    eval loss, and evaluating again would only repeat the same pass (issue 14, item 6). Otherwise (an
    eval_steps that does not divide the steps, a resumed run with nothing left to train) evaluate now."""
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    if evals and evals[-1]["step"] == trainer.state.global_step:
        return evals[-1]["eval_loss"]
    return trainer.evaluate()["eval_loss"]


def run_training(recipe, extra_callbacks: list = ()) -> dict:
    """Train as the recipe says; returns what run.json records. `extra_callbacks`: more TrainerCallbacks
    (run after finetune's own), for tools and tests."""
    from finetune.train.launch import start_process_group
    from finetune.train.output_lock import hold_output_dir

    started = time.time()
    cuda = cuda_available()
    state = start_process_group(recipe, cuda)
    # one run per output folder: held from here to the end, by the main process for every process of the run
    with hold_output_dir(recipe.output_dir, main=state.is_main_process):
        return _run_training(recipe, state, cuda, started, extra_callbacks)


def _run_training(recipe, state, cuda: bool, started: float, extra_callbacks) -> dict:
    from finetune.model.families import generic_path
    from finetune.train.checkpoints import Layout, find_resume, run_fingerprint, weights_recipe

    # the family table (finetune/model/families.py): packing refused for a family that cannot isolate packed rows;
    # a family with no row trains on the generic path, saying so once
    recipe = generic_path(recipe)
    tokenizer, prepared = count_data(recipe, state)
    settings = resolve(recipe, prepared, state.num_processes, cuda)
    report_settings(recipe, prepared, settings)
    # before the model loads: under ZeRO-3 these arguments tell from_pretrained to load each rank's shard
    args = training_arguments(recipe, settings)
    layout = Layout(Path(recipe.output_dir))
    fingerprint = run_fingerprint(recipe, prepared.key, settings.world_size)
    # before the model loads: a refusal (changed setting, nothing left to train) costs nothing
    resume_from = find_resume(recipe, fingerprint, settings.numbers["total_steps"])
    if resume_from:
        log.info(f"resuming from {resume_from}")
    reference = None
    if prepared.store is not None:  # before the model loads: a resume without its reference table is refused
        from finetune.train.preference.setup import reference_for

        reference = reference_for(recipe, prepared, settings.precision, resume_from)
    built = prepare_model(weights_recipe(recipe, resume_from), tokenizer, settings, args.device, prepared.store,
                          eva_rows=prepared.train, processor=prepared.processor)
    built = built._replace(callbacks=[*built.callbacks, *extra_callbacks])
    run = train(recipe, args, settings, layout, fingerprint, built, prepared, resume_from, reference)
    with recording_stops(layout, lambda: run["trainer"].state.global_step, main=state.is_main_process,
                         recorded=lambda: run.get("recorded", False)):
        return save_and_record(recipe, settings, layout, prepared, run, started)


def train(recipe, args, settings: Resolved, layout, fingerprint, built: Built, prepared, resume_from,
          reference=None) -> dict:
    """Claim output_dir (created here, the first thing the run writes), then fit: whatever stops the run from here
    (an error, Ctrl-C) leaves its reason in output_dir/stopped.json (train/stop_record.py)."""
    from finetune.train.checkpoints import claim_output_dir, remove_stale_staging
    from finetune.train.record import write_resolved_recipe
    from finetune.train.stop_record import clear_stop

    claim_output_dir(Path(recipe.output_dir))  # marks it finetune's first: a crashed run's folder is still recognised
    main = args.process_index == 0
    if main:  # what this run trains with (also when it stops early), and no earlier run's stop record
        clear_stop(layout)
        write_resolved_recipe(recipe, layout.output_dir)
    for stale in remove_stale_staging(layout):
        log.info(f"removed {stale}: an incomplete checkpoint left by an interrupted run")
    made: list = []  # fit() puts its Trainer here: the step a stop happened at
    with recording_stops(layout, lambda: made[0].state.global_step if made else 0, main=main):
        return fit(recipe, args, settings, layout, fingerprint, built, prepared, resume_from, reference, made)


def fit(recipe, args, settings: Resolved, layout, fingerprint, built: Built, prepared, resume_from, reference,
        made: list) -> dict:
    """The Trainer (appended to `made`): eval loss before, training, the final eval loss."""
    from transformers import Trainer

    from finetune.model import base_causal_lm, count_parameters
    from finetune.plan.run_memory import planned_memory
    from finetune.train.callbacks import build_callbacks
    from finetune.train.callbacks.checkpoint import clear_write_errors
    from finetune.train.callbacks.interrupt import Interrupted, interrupted_message
    from finetune.train.callbacks.step_loss import StepLossCallback
    from finetune.train.callbacks.throughput import ThroughputCallback
    from finetune.train.fast_paths import kernel_failures
    from finetune.train.loraplus import optimizer_cls_and_kwargs as loraplus_optimizer

    model, tokenizer = built.model, built.tokenizer
    trainable, total = count_parameters(model)
    guard, interrupt, saver = own = build_callbacks(recipe, layout, fingerprint, settings.precision)
    # tokens/s, supervised tokens/s, TFLOP/s (MFU where the GPU is known), peak memory beside the plan's
    # the planner counts text models; a vision-language model's tower is not in its tables yet: no plan for it
    planned = None if prepared.processor is not None else planned_memory(
        recipe, base_causal_lm(model).config, settings.precision, settings.attn_implementation, settings.optimizer,
        settings.world_size)
    throughput = ThroughputCallback(planned_memory=planned)
    step_losses = StepLossCallback()  # every optimizer step's loss, for the learning curve
    trainer_class, own_kwargs, train_dataset = Trainer, {}, prepared.train
    collator = throughput.wrap(built.collator)
    if recipe.method == "grpo":  # online RL: generation, rewards and the loss through the Trainer's public hooks
        from finetune.train.grpo.setup import grpo_trainer_kwargs, with_index
        from finetune.train.grpo.trainer import GRPOTrainer

        from finetune.model.families import packs

        trainer_class, train_dataset = GRPOTrainer, with_index(prepared.train)
        own_kwargs = grpo_trainer_kwargs(recipe, prepared, tokenizer, settings.world_size, built.full_logits,
                                         packs(base_causal_lm(model).config), device=args.device,
                                         precision=settings.precision)
    elif recipe.method == "reward":  # a reward model: the pairs' scores, the Bradley-Terry loss, through public hooks
        from finetune.train.reward.setup import reward_trainer_kwargs
        from finetune.train.reward.trainer import RewardTrainer

        plain = "completion" in (prepared.stats.get("formats") or {})  # plain-text pairs end with EOS
        trainer_class, own_kwargs = RewardTrainer, reward_trainer_kwargs(recipe, tokenizer, plain)
    elif prepared.store is not None:  # preference tuning: the same Trainer, its loss through public hooks
        from finetune.train.preference.trainer import PreferenceTrainer
        from finetune.train.preference.setup import preference_trainer_kwargs

        trainer_class, own_kwargs = PreferenceTrainer, preference_trainer_kwargs(recipe, built, prepared, reference)
    trainer = trainer_class(
        **own_kwargs,
        optimizer_cls_and_kwargs=loraplus_optimizer(recipe, args),  # None unless LoRA+ (train/loraplus.py)
        callbacks=[*own, throughput, step_losses, *built.callbacks],
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=prepared.eval if settings.has_eval else None,
        data_collator=collator,
        processing_class=prepared.processor or tokenizer,  # checkpoints hold the processor of a vision model
    )
    made.append(trainer)
    # a fast path's kernel that fails on a shape the probes did not see: one message naming the key to set
    with kernel_failures(settings, layout, step=lambda: trainer.state.global_step + 1):
        before = trainer.evaluate() if settings.has_eval else {}
        eval_before = before.get("eval_loss")
        if eval_before is not None:  # a preference run's reference pass, when it ran here, is timed apart
            passed = before.get("reference_pass_s")
            ref = f"; before it, the reference pass {passed:.1f} s" if passed is not None else ""
            log.info(f"eval loss before training: {eval_before:.4f} ({before.get('eval_runtime', 0):.1f} s{ref})")
        with interrupt.catching_sigint(), clear_write_errors(layout, "a checkpoint"):
            result = trainer.train(resume_from_checkpoint=resume_from)
        if interrupt.fired:
            raise Interrupted(interrupted_message(interrupt, layout))
        eval_after = final_eval_loss(trainer) if settings.has_eval else None
    return {"trainer": trainer, "tokenizer": prepared.processor or tokenizer, "result": result, "eval_before": eval_before,
            "eval_after": eval_after, "resumed_from": resume_from,
            "trainable": trainable, "total": total, "guard": guard, "saver": saver, "throughput": throughput,
            "initial_adapter": built.initial_adapter, "collator": built.collator}


