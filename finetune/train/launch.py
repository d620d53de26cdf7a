"""`finetune train recipe.yml --num-processes N`: start N training processes the right way for this machine.

    GPUs:  accelerate launch --multi_gpu --num_processes N -m finetune.train recipe.yml   (NCCL)
    CPU:   torchrun --nproc_per_node N -m finetune.train recipe.yml                     (gloo)

(`accelerate launch --cpu --num_processes N` starts a single process, so CPU runs go through torchrun.)
Each child re-reads the recipe with WORLD_SIZE set, so `global_batch_size` derives the accumulation for
the real process count. DeepSpeed needs no launcher of its own: the HF Trainer starts the engine from the
recipe's `deepspeed:` config inside each process; a lone process only needs the rendezvous variables that
a launcher would have set (single_process_env).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from importlib.util import find_spec

from finetune.errors import FinetuneError
from finetune.log import get_logger

# set for the workers launch() starts: `finetune train` checked the machine (train/preflight.py) before starting them
MACHINE_CHECKED = "FINETUNE_MACHINE_CHECKED"

log = get_logger(__name__)


class LaunchError(FinetuneError):
    """A launch that cannot work on this machine."""


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("several processes (docs/distributed.md)")
    group.add_argument("--num-processes", type=int, default=None, metavar="N",
                       help="training processes over all machines: one per GPU, or CPU processes (gloo)")
    group.add_argument("--num-machines", type=int, default=1, metavar="M", help="machines (nodes) in the run")
    group.add_argument("--machine-rank", type=int, default=0, metavar="R", help="this machine's rank, 0..M-1")
    group.add_argument("--main-process-ip", default="127.0.0.1", metavar="IP",
                       help="address of the machine with rank 0 (several machines)")
    group.add_argument("--main-process-port", type=int, default=None, metavar="PORT",
                       help="rendezvous port on the main machine (default: a free one; give one for several machines)")


def inside_launch() -> bool:
    """True in a process started by torchrun / accelerate / deepspeed (they set WORLD_SIZE)."""
    return "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def single_process_env() -> dict[str, str]:
    """The rendezvous variables one process needs for torch.distributed (DeepSpeed) without a launcher;
    without them DeepSpeed looks for MPI (mpi4py)."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def check_deepspeed_installed(recipe) -> None:
    if recipe.deepspeed is not None and find_spec("deepspeed") is None:
        raise LaunchError("the recipe sets `deepspeed:` but DeepSpeed is not installed; "
                          "`pip install 'finetune[deepspeed]'` (or remove `deepspeed:` from the recipe)")


def launch_command(train_argv: list[str], num_processes: int, cuda_devices: int, *, num_machines: int = 1,
                   machine_rank: int = 0, main_process_ip: str = "127.0.0.1", main_process_port: int = 29500,
                   ) -> list[str]:
    """The command line that starts `python -m finetune.train *train_argv` in every process."""
    if num_processes < 1 or num_machines < 1:
        raise LaunchError(f"--num-processes {num_processes} and --num-machines {num_machines} must be at least 1")
    if num_processes % num_machines:
        raise LaunchError(f"--num-processes {num_processes} (all machines together) is not a multiple of "
                          f"--num-machines {num_machines}; every machine runs the same number of processes")
    if not 0 <= machine_rank < num_machines:
        raise LaunchError(f"--machine-rank {machine_rank} must be between 0 and {num_machines - 1}")
    per_machine = num_processes // num_machines
    if cuda_devices:
        if per_machine > cuda_devices:
            raise LaunchError(
                f"{per_machine} processes per machine but this machine has {cuda_devices} GPU(s); one process "
                f"drives one GPU: use --num-processes {cuda_devices * num_machines} or fewer"
            )
        return [sys.executable, "-m", "accelerate.commands.launch", *(["--multi_gpu"] if num_processes > 1 else []),
                "--num_processes", str(num_processes), "--num_machines", str(num_machines),
                "--machine_rank", str(machine_rank), "--main_process_ip", main_process_ip,
                "--main_process_port", str(main_process_port), "--mixed_precision", "no",  # the recipe decides
                "--dynamo_backend", "no", "-m", "finetune.train", *train_argv]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(per_machine),
            "--nnodes", str(num_machines), "--node_rank", str(machine_rank), "--master_addr", main_process_ip,
            "--master_port", str(main_process_port), "-m", "finetune.train", *train_argv]


def launch(args: argparse.Namespace, recipe) -> int:
    """Start the processes for `finetune train --num-processes N` and wait; returns their exit code."""
    import torch  # only here: the launcher needs the device count

    from finetune.train.fsdp_config import check_fsdp_device

    check_deepspeed_installed(recipe)
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    check_fsdp_device(recipe, bool(cuda_devices))  # before any process starts
    port = args.main_process_port
    if port is None:
        if args.num_machines > 1:
            raise LaunchError("several machines need an agreed rendezvous port: pass --main-process-port "
                              "(the same on every machine)")
        port = free_port()
    train_argv = [str(args.recipe), *(arg for item in args.overrides for arg in ("--set", item)),
                  *(["--quiet"] if getattr(args, "quiet", False) else []),  # each child logs as told here
                  *(["--verbose"] if getattr(args, "verbose", False) else [])]
    command = launch_command(train_argv, args.num_processes, cuda_devices, num_machines=args.num_machines,
                             machine_rank=args.machine_rank, main_process_ip=args.main_process_ip,
                             main_process_port=port)
    env = dict(os.environ)
    env[MACHINE_CHECKED] = "1"  # the caller (finetune train) checked the machine: its workers need not again
    if not cuda_devices:
        # torch would otherwise start ~all-cores threads in each process and oversubscribe the CPU
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) * args.num_machines // args.num_processes)))
    log.info(f"launching {args.num_processes} process(es): {' '.join(command)}")
    return subprocess.run(command, env=env).returncode


def start_process_group(recipe, cuda: bool):
    """Form this run's process group (a group of one without a launcher) before the data is counted, the way
    TrainingArguments would, and return accelerate's PartialState: its barrier lets only the main process
    tokenize while the others wait. TrainingArguments(accelerator_config={"use_configured_state": True}),
    built once the settings are resolved, then adopts this group instead of forming another.

    On CPU: several processes need `cpu=True` (accelerate then makes a gloo group); DeepSpeed brings its own
    CPU backend and must not be told `cpu`, and without a device backend accelerate would call every
    process a world of one (each would then train on all the data), so it is given `gloo` by name.
    """
    from datetime import timedelta

    from accelerate import PartialState

    from finetune.compat import reset_accelerate_state

    # a state left by an earlier run in this process would be reused as it is (TrainingArguments resets it too)
    reset_accelerate_state()
    timeout = timedelta(seconds=recipe.ddp_timeout)  # ranks wait at a barrier while the main process tokenizes
    if recipe.deepspeed is None:
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
        return PartialState(cpu=not cuda and several, timeout=timeout)
    if not cuda:
        # `accelerate launch` with `use_cpu: true` sets ACCELERATE_USE_CPU, which makes accelerate skip
        # DeepSpeed altogether (its state then breaks in the Trainer); the group formed here is a CPU one
        os.environ.pop("ACCELERATE_USE_CPU", None)
    before = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # what TrainingArguments sets around the same call
    try:
        return PartialState(timeout=timeout, **({} if cuda else {"backend": "gloo"}))
    finally:
        if before is None:
            del os.environ["ACCELERATE_USE_DEEPSPEED"]
        else:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = before
