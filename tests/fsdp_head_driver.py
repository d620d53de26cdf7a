"""One gloo process: the tiny model sharded with FSDP2 the way accelerate 1.15 does it (each decoder layer, then
[final norm, lm_head] as one unit, then the root), supervised-only logits attached with 1-row chunks; prints
whether the head was chunked and the loss, against the same model unsharded (tests/test_fsdp.py)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from finetune.model.supervised_logits import SupervisedLogits

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
result = {}
for sharded in (False, True):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    if sharded:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False)
        fully_shard(model)
    hooks = SupervisedLogits(model, chunk_rows=1)
    rows = []  # logits rows of each head call: 0 first when the loss runs the head chunk by chunk
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(out.reshape(-1, out.shape[-1]).shape[0]))
    ids = torch.randint(1, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :5] = -100
    model.train()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    result["fsdp" if sharded else "plain"] = {"loss": loss.item(), "head_rows": rows}
print(json.dumps(result))
dist.destroy_process_group()
