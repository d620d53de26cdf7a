"""Report once how long compiling the decoder layers took (finetune/model/regional_compile.py).

torch.compile works lazily, inside the first forward and backward passes, so the cost shows up as a slow
first step. This callback times the first two optimizer steps and logs the difference once: step 1 pays
the compilation, step 2 runs the compiled graphs (a shape not seen before, such as a shorter last batch or
the eval rows, may compile once more later; that is not counted here).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class CompileTimeCallback(TrainerCallback):
    def __init__(self, layers: int, log):
        self.layers = layers
        self.log = log
        self.step_seconds: list[float] = []
        self._started = None
        self.compile_seconds: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        if len(self.step_seconds) < 2:
            self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._started is None or len(self.step_seconds) >= 2:
            return
        self.step_seconds.append(time.perf_counter() - self._started)
        self._started = None
        if len(self.step_seconds) == 2:
            first, second = self.step_seconds
            self.compile_seconds = max(first - second, 0.0)
            self.log(f"compile: {self.layers} decoder layers compiled in ~{self.compile_seconds:.1f} s "
                     f"(step 1 took {first:.2f} s, step 2 {second:.2f} s)")
