"""Mixture-of-experts in the step logs, and the router's load-balancing loss in the objective with its right weight.

    monitor = ExpertMonitor.attach(model, recipe)    # None for a dense model
    trainer = Trainer(..., callbacks=[..., monitor])

Each training log gains:
- `router_aux_loss`: the model's own load-balancing loss (transformers' `load_balancing_loss_func` of that family,
  over every MoE layer), averaged over the micro-batches since the last log;
- `expert_load_min` / `expert_load_max`: the fraction of tokens routed to the least and the most used expert (over
  every MoE layer and expert, same window). Each token goes to top_k of num_experts experts: perfect balance puts
  top_k / num_experts of the tokens on every expert (2 / 8 = 0.25); an expert at 0 is never used.

The aux loss in the objective. transformers 5.23's MoE causal LMs add `router_aux_loss_coef x aux` to the loss when
`output_router_logits` is on; every shipped config has it off (an inference setting: it also returns the logits).
Like TRL's SFTTrainer, training turns it on with the coefficient the config declares (the recipe's
`router_aux_loss_coef` overrides it; 0 turns it off). The Trainer sums each micro-batch's loss over gradient
accumulation and (averaging tokens across processes) scales it by the process count: the model's term would weigh
accumulation steps x processes times too much. So each micro-batch's coefficient is scaled by its share of the
step's supervised tokens (n / num_items_in_batch, the same share the cross-entropy uses), which sums to one
coefficient x the step's token-weighted mean aux loss. In evaluation the loss is the cross-entropy alone.
"""

from __future__ import annotations

from transformers import TrainerCallback

from finetune.compat import set_router_aux_loss_coef
from finetune.contract import IGNORE_INDEX
from finetune.log import get_logger
from finetune.train.callbacks.throughput import add_to_log

log = get_logger(__name__)


def model_aux_coefficient(causal_lm, recipe_value: float | None) -> float:
    """The coefficient the run trains with: the recipe's, else the config's, else 0 (no aux loss defined)."""
    if not hasattr(causal_lm, "router_aux_loss_coef"):
        return 0.0  # the model's forward adds none (deepseek_v3: balanced without an aux loss)
    if recipe_value is not None:
        return float(recipe_value)
    return float(getattr(causal_lm.config, "router_aux_loss_coef", None) or 0.0)


class ExpertMonitor(TrainerCallback):
    def __init__(self, causal_lm, layout, coefficient: float):
        self.causal_lm, self.layout, self.coefficient = causal_lm, layout, coefficient
        self.aux_sum, self.aux_count = None, 0
        self.loads: dict[str, object] = {}  # experts module name -> tokens routed to each expert (device tensor)
        self.tokens: dict[str, int] = {}
        self.handles = [
            causal_lm.register_forward_pre_hook(self._before, with_kwargs=True),
            causal_lm.register_forward_hook(self._after),
        ]
        for name, module in causal_lm.named_modules():  # under peft: the outermost wrapper of each experts module
            if name in layout.expert_modules and layout.fused:  # forward(hidden_states, top_k_index, top_k_weights)
                self.handles.append(module.register_forward_pre_hook(self._routed(name)))

    @classmethod
    def attach(cls, model, recipe) -> "ExpertMonitor | None":
        from finetune.model import base_causal_lm
        from finetune.plan.moe import moe_layout

        causal_lm = base_causal_lm(model)
        layout = moe_layout(causal_lm)
        if layout is None:
            return None
        if recipe.method != "sft":  # preference and GRPO losses are their own, from log-probabilities: none added
            say = log.warning if recipe.router_aux_loss_coef else log.info
            say(f"router load-balancing loss: not in {recipe.method}'s loss (computed from log-probabilities; "
                "`router_aux_loss_coef` weighs it in SFT's); the expert load is logged")
            return cls(causal_lm, layout, 0.0)
        coefficient = model_aux_coefficient(causal_lm, recipe.router_aux_loss_coef)
        log.info(f"router load-balancing loss: {coefficient:g} x aux in the training loss" if coefficient else
                 "router load-balancing loss: off (router_aux_loss_coef 0, or the model defines none)")
        return cls(causal_lm, layout, coefficient)

    def _before(self, module, args, kwargs):
        labels = kwargs.get("labels")
        if not (module.training and self.coefficient and labels is not None):
            if hasattr(module, "router_aux_loss_coef"):
                set_router_aux_loss_coef(module, 0.0)  # eval: the cross-entropy alone
            return None
        total = kwargs.get("num_items_in_batch")
        if total is None:  # the Trainer divides this micro-batch's loss by the accumulation steps itself
            share = 1.0
        else:  # this micro-batch's share of the step's supervised tokens, as the cross-entropy counts them
            share = (labels[..., 1:] != IGNORE_INDEX).sum() / total
        set_router_aux_loss_coef(module, self.coefficient * share)
        return args, {**kwargs, "output_router_logits": True}

    def _after(self, module, args, output):
        aux = getattr(output, "aux_loss", None)
        if module.training and aux is not None:
            aux = aux.detach().float()
            self.aux_sum = aux if self.aux_sum is None else self.aux_sum + aux
            self.aux_count += 1

    def _routed(self, name: str):
        def hook(module, args):
            if not module.training or len(args) < 2:
                return None
            index = args[1].reshape(-1)  # (tokens x top_k) expert ids; ids >= num_experts: not routed here
            counts = index.bincount(minlength=self.layout.num_experts)[: self.layout.num_experts]
            self.loads[name] = counts if name not in self.loads else self.loads[name] + counts
            self.tokens[name] = self.tokens.get(name, 0) + args[0].shape[0]
            return None
        return hook

    def metrics(self) -> dict:
        out = {}
        if self.aux_count:
            out["router_aux_loss"] = float(self.aux_sum) / self.aux_count
        fractions = [(counts.float() / self.tokens[name]) for name, counts in self.loads.items() if self.tokens[name]]
        if fractions:
            out["expert_load_min"] = min(float(f.min()) for f in fractions)
            out["expert_load_max"] = max(float(f.max()) for f in fractions)
        self.aux_sum, self.aux_count, self.loads, self.tokens = None, 0, {}, {}
        return out

    def on_train_begin(self, args, state, control, **kwargs):
        self.metrics()  # forget forward passes before training (ZeRO-3's probes run at train begin, in train mode)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        add_to_log(state, logs, self.metrics())

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()



def prepare_experts_for_training(model, recipe, deepspeed: dict | None) -> list:
    """A mixture-of-experts model's part of the run: under DeepSpeed ZeRO-3 each MoE block one gathered unit
    (model/moe.py), and the monitor. [] for a dense model."""
    from finetune.train.deepspeed_config import zero_stage

    monitor = ExpertMonitor.attach(model, recipe)
    if monitor is None:
        return []
    if deepspeed is not None and zero_stage(deepspeed) == 3:
        from finetune.model.moe import set_zero3_leaves

        blocks = set_zero3_leaves(model)
        log.info(f"ZeRO-3: {len(blocks)} MoE blocks gathered whole (DeepSpeed leaf modules), not expert by expert")
    return [monitor]
