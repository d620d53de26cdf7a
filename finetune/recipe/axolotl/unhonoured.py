"""axolotl keys that change what is trained and that finetune cannot honour: `finetune port` keeps each one, as
written, for the user's decision (exit 1), with what it does (issue 33: they were dropped with exit 0).

Checked against axolotl's schema (src/axolotl/utils/schemas/) at the commit keys.py beside it names: set,
each of these changes the weights, the loss or the tokens trained, so dropping it would train something else.
"""

UNHONOURED = {  # key -> what it does in axolotl
    "use_onebitllms": "replaces the Linear layers with BitNet 1.58-bit ones "
                      "(onebitllms) and trains those",
    "qat": "trains with fake-quantized weights (quantization-aware training, torchao)",
    "fp8": "trains the matmuls in FP8 (torchao); finetune trains in bf16, fp16 or fp32",
    "relora": "merges the LoRA weights into the base and restarts them every "
              "`jagged_restart_steps` (ReLoRA), training a full-rank update",
    "lisa_n_layers": "trains a random few layers at a time, switched every "
                     "`lisa_step_interval` steps (LISA)",
    "neftune_noise_alpha": "adds noise to the input embeddings while training "
                           "(NEFTune)",
    "use_eaft": "replaces the cross-entropy loss with entropy-aware focal training (EAFT)",
    "scaling_softmax": "changes the attention's softmax (SSMax) in the model trained",
    "reinit_weights": "trains from random weights instead of the pretrained ones",
    "embedding_lr": "gives the embeddings their own learning rate",
    "embedding_lr_scale": "gives the embeddings their own learning rate",
    "lr_groups": "gives groups of modules their own learning rates",
    "fix_untrained_tokens": "sets the embedding rows of the listed tokens to the "
                            "mean of the others before training",
    "added_tokens_overrides": "renames the tokenizer's reserved added tokens, "
                              "so the records tokenize differently",
    "chat_template_kwargs": "passes settings to the chat template "
                            "(`enable_thinking`...), so the records render differently",
    "curriculum_sampling": "trains the records in their order (curriculum) where finetune shuffles "
                           "them each epoch",
    "min_sample_len": "drops examples shorter than this many tokens",
    "peft_layer_replication": "replicates decoder layers before the adapter is added",
    "loftq_config": "initialises LoRA with LoftQ (and quantizes the base itself)",
    "peft_layers_to_transform": "adapts only the listed layers; finetune's LoRA adapts the matching "
                                "modules of every layer",
    "peft_layers_pattern": "names the layer list `peft_layers_to_transform` indexes",
    "lora_rank_pattern": "gives some modules their own LoRA rank",
    "lora_alpha_pattern": "gives some modules their own LoRA alpha",
    "peft_trainable_token_indices": "trains the embedding rows of the listed token ids; finetune trains "
                                    "the rows of the tokens the recipe adds (`tokens`, "
                                    "`special_tokens`) only",
}
