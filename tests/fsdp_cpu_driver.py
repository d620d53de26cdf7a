"""FSDP2 itself on 2 CPU processes (gloo), outside the Trainer (which runs no FSDP on CPU; tests/test_fsdp.py):

    torchrun --nproc_per_node 2 tests/fsdp_cpu_driver.py MODEL_DIR RESULTS_DIR

The tiny model sharded the way accelerate 1.15 shards it (each decoder layer, then [final norm, lm_head] as one
unit, then the root). Each rank writes RESULTS_DIR/rank{R}.json with
- head: the rows of each LM-head call with supervised-only logits attached (1-row chunks), and the loss, sharded and
  unsharded: under FSDP2 the head must run once (a per-process number of calls of a sharded head could hang);
- bytes: what this rank holds of the fp32 full fine-tune's weights, gradients and AdamW states after one step, for
  the memory plan's per-GPU numbers;
- lora: 4 AdamW steps of a LoRA model over a global batch of 4 (2 rows a process) against the same steps unsharded
  on all 4 rows in one process, the losses of both, and the adapter saved whole the way the Trainer's final save
  does it under FSDP2 (accelerate's get_state_dict: a full state dict, then PeftModel.save_pretrained), written
  into RESULTS_DIR/fsdp and RESULTS_DIR/single.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from finetune.model.supervised_logits import SupervisedLogits


def shard_like_accelerate(model) -> None:
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False)
    fully_shard(model)


def local_bytes(tensor) -> int:
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def train_lora(model_dir: str, out: Path, sharded: bool) -> list[float]:
    from peft import LoraConfig, get_peft_model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(0)  # the same LoRA init in both runs and on both processes
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    ids = torch.randint(1, 512, (4, 16), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :6] = -100  # the same supervised count in every row: a process's mean is a share of the global one
    if sharded:
        shard_like_accelerate(model.base_model.model)
        rank = dist.get_rank()
        ids, labels = ids[2 * rank:2 * rank + 2], labels[2 * rank:2 * rank + 2]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(4):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()  # FSDP2 averages the gradients over the processes
        optimizer.step()
        optimizer.zero_grad()
        if sharded:
            dist.all_reduce(loss := loss.detach().clone(), op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) \
        if sharded else model.state_dict()
    if not sharded or dist.get_rank() == 0:
        model.save_pretrained(str(out), state_dict=state)
    return losses


def main() -> None:
    model_dir, results = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    ids = torch.randint(1, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :5] = -100
    head = {}
    for sharded in (False, True):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if sharded:
            shard_like_accelerate(model)
        hooks = SupervisedLogits(model, chunk_rows=1)
        rows = []  # logits rows of each head call: 0 first when the loss runs the head chunk by chunk
        model.lm_head.register_forward_hook(lambda m, a, out: rows.append(out.reshape(-1, out.shape[-1]).shape[0]))
        model.train()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        hooks.detach()
        head["fsdp" if sharded else "plain"] = {"loss": loss.item(), "head_rows": rows}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the sharded model: its DTensor shards
    optimizer.step()
    held = {"weights": sum(local_bytes(p) for p in model.parameters()),
            "gradients": sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None),
            "optimizer states": sum(local_bytes(v) for s in optimizer.state.values() for k, v in s.items()
                                    if k != "step"),
            "tensors": sum(1 for _ in model.parameters())}
    rank = dist.get_rank()
    lora = {"single": train_lora(model_dir, results / "single", sharded=False),
            "fsdp": train_lora(model_dir, results / "fsdp", sharded=True)}
    (results / f"rank{rank}.json").write_text(json.dumps({"head": head, "bytes": held, "lora": lora}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
