"""LoRA dropout on CPU keeps its backward mask as bool (finetune/model/mask_dropout.py): the same numbers as
nn.Dropout bit for bit, a quarter of the bytes. A CPU training run swaps peft's dropouts for it:
tests/test_preference_shared_prompt.py::test_a_packed_preference_run_on_cpu_trains_on_flattened_micro_batches."""

from __future__ import annotations

import pytest
import torch

from finetune.model.mask_dropout import MaskDropout


def _saved_bytes(fn, x) -> int:
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(seen.values())


@pytest.mark.parametrize("p", [0.05, 0.5])
def test_the_same_output_and_gradient_as_nn_dropout_with_a_byte_per_element_kept(p):
    x = torch.randn(64, 96, requires_grad=True)
    grad = torch.randn(64, 96)
    results = []
    for module in (torch.nn.Dropout(p), MaskDropout(p)):
        torch.manual_seed(7)
        out = module.train()(x)
        results.append((out, torch.autograd.grad(out, x, grad)[0]))
    (out_a, grad_a), (out_b, grad_b) = results
    assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b) and (out_b == 0).any()
    assert _saved_bytes(torch.nn.Dropout(p).train(), x) == 4 * x.numel()  # ATen's CPU dropout: the float noise
    assert _saved_bytes(MaskDropout(p).train(), x) == x.numel()
    assert torch.equal(MaskDropout(p).eval()(x), x) and torch.equal(MaskDropout(1.0).train()(x), x * 0)
    assert isinstance(MaskDropout(p), torch.nn.Dropout)  # what recognises a dropout module still does
