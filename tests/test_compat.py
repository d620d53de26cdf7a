"""finetune/compat.py against the installed libraries: each private attribute or patched behaviour it
relies on still exists and still does what finetune uses it for. A failure here names what moved."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from finetune import compat


@pytest.fixture
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(config)


def test_attn_implementation_reads_what_set_attn_implementation_wrote(tiny_llama):
    assert "_attn_implementation" in vars(tiny_llama.config) or hasattr(tiny_llama.config, "_attn_implementation")
    tiny_llama.set_attn_implementation("eager")
    assert compat.attn_implementation(tiny_llama.config) == "eager"
    tiny_llama.set_attn_implementation("sdpa")
    assert compat.attn_implementation(tiny_llama.config) == "sdpa"


def test_sdpa_functions_keep_the_signatures_the_per_example_path_calls():
    forward, mask = compat.sdpa_functions()
    assert list(inspect.signature(forward).parameters)[:5] == ["module", "query", "key", "value", "attention_mask"]
    assert {"dropout", "scaling", "is_causal"} <= set(inspect.signature(forward).parameters)
    assert {"batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function",
            "attention_mask"} <= set(inspect.signature(mask).parameters)


def test_loss_function_is_settable_and_called_with_logits_labels_vocab_size(tiny_llama):
    from transformers import PreTrainedModel

    prop = inspect.getattr_static(PreTrainedModel, "loss_function")
    assert isinstance(prop, property) and prop.fset is not None
    seen = {}

    def loss(logits, labels, vocab_size, **kwargs):
        seen.update(logits=logits.shape, vocab_size=vocab_size, kwargs=set(kwargs))
        return logits.sum() * 0

    default = tiny_llama.loss_function
    compat.set_loss_function(tiny_llama, loss)
    ids = torch.randint(1, 64, (1, 6))
    tiny_llama(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(5))
    assert seen["logits"] == (1, 6, 64) and seen["vocab_size"] == 64 and "num_items_in_batch" in seen["kwargs"]
    compat.set_loss_function(tiny_llama, default)
    assert tiny_llama(input_ids=ids, labels=ids).loss.item() > 0


def test_transformers_builds_a_document_mask_from_packed_position_ids():
    """What attn_implementation flex_attention relies on for packed rows (finetune/model/attention.py)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, find_packed_sequence_indices
    from transformers.modeling_layers import GradientCheckpointingLayer  # regional compile's unit

    assert "flex_attention" in AttentionInterface._global_mapping and "flex_attention" in ALL_MASK_ATTENTION_FUNCTIONS
    ids = find_packed_sequence_indices(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert inspect.isclass(GradientCheckpointingLayer)


def test_drop_quantizer_clears_what_save_pretrained_reads(tiny_llama, tmp_path):
    from peft import peft_model
    from transformers import PreTrainedModel

    # a quantized load sets these on the instance; save_pretrained and peft read them with getattr
    assert "hf_quantizer" in inspect.getsource(PreTrainedModel.save_pretrained)
    assert 'getattr(model, "is_quantized", False)' in inspect.getsource(peft_model)
    tiny_llama.hf_quantizer, tiny_llama.is_quantized = object(), True
    tiny_llama.config.quantization_config = {"quant_method": "gguf"}
    compat.drop_quantizer(tiny_llama)
    assert tiny_llama.hf_quantizer is None and not tiny_llama.is_quantized
    tiny_llama.save_pretrained(tmp_path)
    assert "quantization_config" not in (tmp_path / "config.json").read_text()


def test_save_new_token_rows_only_keeps_the_resized_matrices_out_of_the_adapter(tiny_llama, tmp_path):
    """What it relies on: with the vocabulary resized, peft's save_pretrained ("auto") adds both whole matrices to
    an adapter whose new rows are trainable tokens; the Trainer's call (no save_embedding_layers) then leaves
    them out."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from transformers import AutoModelForCausalLM

    tiny_llama.save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # peft compares with this folder's vocab_size
    base.resize_token_embeddings(66)
    config = LoraConfig(r=2, target_modules=["q_proj"],
                        trainable_token_indices={"embed_tokens": [64, 65], "lm_head": [64, 65]})
    model = get_peft_model(base, config)
    model.save_pretrained(tmp_path / "auto")
    assert any(v.shape[0] == 66 for v in load_file(tmp_path / "auto" / "adapter_model.safetensors").values())
    compat.save_new_token_rows_only(model)
    model.save_pretrained(tmp_path / "rows", state_dict=None, is_main_process=True)  # as Trainer._save calls it
    saved = load_file(tmp_path / "rows" / "adapter_model.safetensors")
    assert not any(v.shape[0] == 66 for v in saved.values())
    assert sum("trainable_tokens_delta" in k for k in saved) == 2


def test_replace_forward_changes_one_instance_only():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    compat.replace_forward(a, lambda x: x * 0 + 7)
    assert a(torch.ones(1, 2)).tolist() == [[7.0, 7.0]]
    assert b(torch.ones(1, 2)).tolist() != [[7.0, 7.0]]


def test_reset_accelerate_state_forgets_the_shared_state():
    from accelerate import PartialState
    from accelerate.state import AcceleratorState

    assert "reset_partial_state" in inspect.signature(AcceleratorState._reset_state).parameters
    PartialState(cpu=True)
    assert PartialState._shared_state
    compat.reset_accelerate_state()
    assert not PartialState._shared_state and not AcceleratorState._shared_state


def test_parameter_count_knows_4bit_and_zero3_parameters():
    import importlib.util

    assert compat.parameter_count(torch.nn.Parameter(torch.zeros(3, 4))) == 12
    if importlib.util.find_spec("bitsandbytes") is not None:
        from bitsandbytes.nn import Params4bit

        assert Params4bit.__name__ == "Params4bit"
    if importlib.util.find_spec("deepspeed") is not None:
        from deepspeed.runtime.zero import partition_parameters

        assert "param.ds_numel =" in inspect.getsource(partition_parameters)


def test_tqdm_monitor_interval_zero_starts_no_monitor_thread():
    from tqdm import tqdm

    saved = tqdm.monitor_interval
    if tqdm.monitor is not None:  # a bar of an earlier test in this process started one: not this test's doing
        tqdm.monitor.exit()
        tqdm.monitor = None
    try:
        compat.disable_tqdm_monitor(tqdm)
        with tqdm(total=2, disable=False, file=open("/dev/null", "w")) as bar:
            bar.update(1)
            assert tqdm.monitor is None
    finally:
        tqdm.monitor_interval = saved


def test_the_head_swap_report_is_kept_out_of_the_log_and_any_other_report_stays(tiny_llama, tmp_path, caplog):
    """transformers logs its load report as one warning of `transformers.modeling_utils` naming lm_head.* UNEXPECTED
    and score.weight MISSING when a causal LM loads as its sequence-classification class; with another key in it
    (here a layer the checkpoint lacks) the report stays."""
    import logging

    from transformers import AutoModelForSequenceClassification

    tiny_llama.save_pretrained(tmp_path / "lm")
    with caplog.at_level(logging.WARNING, logger="transformers.modeling_utils"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=1)
    assert any("LOAD REPORT" in r.getMessage() and "score.weight" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="transformers.modeling_utils"), compat.quiet_head_swap_report():
        AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=1)
    assert not any("LOAD REPORT" in r.getMessage() for r in caplog.records)
    tiny_llama.config.num_hidden_layers = 2  # the checkpoint has one layer: the second is missing too
    tiny_llama.config.save_pretrained(tmp_path / "lm")
    with caplog.at_level(logging.WARNING, logger="transformers.modeling_utils"), compat.quiet_head_swap_report():
        AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=1)
    assert any("LOAD REPORT" in r.getMessage() and "layers.1" in r.getMessage() for r in caplog.records)


def test_lm_eval_load_yaml_merges_an_include_relative_to_the_file(tmp_path):
    pytest.importorskip("lm_eval")
    (tmp_path / "base.yaml").write_text("output_type: multiple_choice\ndoc_to_text: '{{q}}'\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "task.yaml").write_text("include: base.yaml\ntask: mine\ndoc_to_text: '{{question}}'\n")
    config = compat.lm_eval_load_yaml(tmp_path / "task.yaml")
    assert config == {"output_type": "multiple_choice", "doc_to_text": "{{question}}", "task": "mine"}


@pytest.fixture(scope="module")
def tokenizer():
    from tiny import build_tokenizer

    return build_tokenizer()


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "mixtral", "olmoe"])
def test_moe_forward_weighs_its_aux_loss_by_the_instance_coefficient(family, tokenizer):
    from transformers import AutoModelForCausalLM

    from tiny import family_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(family, tokenizer), attn_implementation="eager")
    ids = torch.randint(1, 100, (1, 8))
    compat.set_router_aux_loss_coef(model, 0.0)
    plain = model(input_ids=ids, labels=ids, output_router_logits=True)
    compat.set_router_aux_loss_coef(model, torch.tensor(2.0))
    weighted = model(input_ids=ids, labels=ids, output_router_logits=True)
    torch.testing.assert_close(weighted.loss, plain.loss + 2.0 * plain.aux_loss)


def test_peft_moe_conversion_is_the_one_peft_applies_and_twice_is_once(tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tiny import family_config

    model = AutoModelForCausalLM.from_config(family_config("qwen3_moe", tokenizer))
    config = LoraConfig(r=4, lora_dropout=0.0, target_modules="all-linear")
    compat.peft_moe_conversion(config, model)
    assert {"gate_up_proj", "down_proj", "gate.weight"} <= set(config.target_parameters)
    assert config.rank_pattern == {r".*\.gate_up_proj": 8}
    once = (sorted(config.target_modules), sorted(config.target_parameters), dict(config.rank_pattern))
    compat.peft_moe_conversion(config, model)
    assert (sorted(config.target_modules), sorted(config.target_parameters), dict(config.rank_pattern)) == once
    built = get_peft_model(model, LoraConfig(r=4, lora_dropout=0.0, target_modules="all-linear")).peft_config
    assert (sorted(built["default"].target_modules), sorted(built["default"].target_parameters)) == once[:2]


def test_peft_says_a_fused_experts_rank_pattern_was_ignored_and_peft_wrapping_silences_exactly_that(tokenizer,
                                                                                                     tmp_path):
    """Review 1, finding 14: every fused-expert LoRA run printed peft's "rank_pattern keys ... were ignored" (and
    alpha_pattern's) although the pattern took effect. peft still says it (else drop the silence); with the
    adapter's config, or its saved folder, peft_wrapping hides it; a key that matches nothing is still said."""
    import warnings

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from tiny import family_config

    def converted(model, **extra):  # what build_model hands peft: gate_up_proj at rank 2r
        lora = LoraConfig(r=4, lora_dropout=0.0, target_modules="all-linear", **extra)
        compat.peft_moe_conversion(lora, model)
        return lora

    def said(adapter, wrap: bool, **extra) -> tuple[list[str], object]:
        """(peft's "did not match" warnings, the PeftModel) for `adapter`: "config" builds one, a folder loads it."""
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(family_config("qwen3_moe", tokenizer))
        adapter = converted(model, **extra) if adapter == "config" else adapter
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with compat.peft_wrapping(adapter) if wrap else warnings.catch_warnings():
                built = (get_peft_model(model, adapter) if isinstance(adapter, LoraConfig)
                         else PeftModel.from_pretrained(model, str(adapter)))
        return [str(w.message) for w in caught if "did not match any targeted module" in str(w.message)], built

    assert len(said("config", wrap=False)[0]) == 2  # rank_pattern's and alpha_pattern's, for r".*\.gate_up_proj"
    messages, built = said("config", wrap=True)
    assert messages == []
    experts = built.base_model.model.model.layers[0].mlp.experts
    assert experts.base_layer.lora_A["default"].weight.shape[0] == 2 * 4 * 4  # applied: rank 2r, 4 experts
    built.save_pretrained(tmp_path / "adapter")
    assert len(said(tmp_path / "adapter", wrap=False)[0]) == 2 and said(tmp_path / "adapter", wrap=True)[0] == []
    stray, _ = said("config", wrap=True, rank_pattern={"no_such_layer": 2})
    assert len(stray) == 1 and "no_such_layer" in stray[0]


def test_peft_reads_the_deprecated_checkpointing_alias_and_peft_wrapping_silences_only_that(tiny_llama):
    """Issue 43, item 14: a transformers FutureWarning on every command that builds or loads an adapter."""
    import warnings

    from peft import LoraConfig, get_peft_model

    def built(wrap: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if wrap:
                with compat.peft_wrapping():
                    get_peft_model(tiny_llama, LoraConfig(r=2, target_modules=["q_proj"]))
                warnings.warn("still shown", FutureWarning)  # the filter ends with the context
            else:
                get_peft_model(tiny_llama, LoraConfig(r=2, target_modules=["q_proj"]))
        return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]

    assert any("is_gradient_checkpointing" in m for m in built(wrap=False))  # gone from peft: drop peft_wrapping
    assert built(wrap=True) == ["still shown"]


def test_building_and_loading_an_adapter_prints_no_future_warning(tmp_path, make_recipe):
    import warnings

    from finetune.model import build_model
    from finetune.model.loader import load_tokenizer
    from finetune.recipe import load_recipe

    recipe = load_recipe(make_recipe(adapter="lora", lora_r=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = build_model(recipe, load_tokenizer(recipe), "fp32", "sdpa")
        model.save_pretrained(tmp_path / "adapter")
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]


def test_set_hub_offline_is_what_the_downloads_check_and_what_a_started_process_reads(monkeypatch):
    from huggingface_hub import constants, is_offline_mode
    from transformers.utils import hub as transformers_hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # restored after the test, as the environment below
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert compat.set_hub_offline(True) is False
    assert is_offline_mode() and transformers_hub.is_offline_mode() and os.environ["HF_HUB_OFFLINE"] == "1"
    assert compat.set_hub_offline(False) is True
    assert not is_offline_mode() and "HF_HUB_OFFLINE" not in os.environ


def test_keep_4bit_layout_switches_off_the_cpu_repacking_linear4bit_forward_reads():
    import bitsandbytes as bnb

    assert "support_avx512bf16_for_cpu" in inspect.getsource(bnb.nn.Linear4bit.forward)
    layer = bnb.nn.Linear4bit(8, 8)
    assert compat.keep_4bit_layout(torch.nn.Sequential(layer, torch.nn.Linear(8, 8))) == 1
    assert layer.support_avx512bf16_for_cpu is False
