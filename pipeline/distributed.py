"""Data-parallel training across processes: what a training rank needs from torch.distributed, in one place.

A training stage launched under torchrun (`pipeline.launch`) runs the same stage function in every rank. The
ranks draw the same seeded batches; each takes its slice of every batch, DistributedDataParallel averages the
gradients, so the step is the single-process step on the whole batch (`shard` weights each slice's loss by its
share of the batch). Rank 0 alone writes: cache entries, checkpoints (which every rank reads back when resuming)
and the teacher-outputs store; the others build into a throwaway folder. Outside torchrun every helper here is the
identity, and nothing imports torch.distributed.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

# A rank waits this long for the others at a collective (rank 0 may hold a cache lock while another run builds
# the same entry). A dead rank does not make the others wait: torchrun ends the whole group when one fails.
TIMEOUT = datetime.timedelta(hours=6)


def active() -> bool:
    """Inside a process group of more than one rank (never before torch.distributed is imported: the commands
    that do not train stay free of torch)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if active() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if active() else 0


def is_main() -> bool:
    """The rank that writes (rank 0), or the only process."""
    return rank() == 0


def launched_rank() -> bool:
    """This process was started by torchrun (its environment names a rank), group joined or not."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init() -> None:
    """Join torchrun's process group: NCCL with one GPU per local rank where CUDA exists, else gloo."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=TIMEOUT)


def close() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    """Where collective tensors live: the rank's GPU under NCCL, the CPU under gloo."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")


def from_main(flag: bool) -> bool:
    """Rank 0's `flag`, on every rank (a decision only rank 0 may take, such as whether it builds a cache entry)."""
    if not active():
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device=_device())
    dist.broadcast(t, src=0)
    return bool(t.item())


def barrier() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()


def gathered(t: torch.Tensor) -> list[torch.Tensor]:
    """`t` from every rank, in rank order, on the CPU (same shape and dtype on each)."""
    if not active():
        return [t]
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(t, device=_device()) for _ in range(world_size())]
    dist.all_gather(out, t.to(_device()))
    return [o.cpu() for o in out]


def mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar over the ranks (the loss a single process would have logged)."""
    if not active():
        return value
    import torch
    import torch.distributed as dist

    t = value.detach().to(_device(), torch.float32).reshape(1)
    dist.all_reduce(t)
    return t / world_size()


def shard(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
    """This rank's slice of `batch` and the weight of its loss: DDP averages the ranks' gradients, so a slice of
    n of the batch's N rows weighs n * ranks / N and the step is the whole batch's. A rank left without rows (a last
    batch smaller than the world) trains on the first row at weight 0, since every rank must take part."""
    if not active():
        return batch, 1.0
    import torch

    n_rows = len(next(iter(batch.values())))
    rows = torch.tensor_split(torch.arange(n_rows), world_size())[rank()]
    weight = len(rows) * world_size() / n_rows
    if not len(rows):
        rows = torch.arange(1)
    return {k: v.index_select(0, rows.to(v.device)) for k, v in batch.items()}, weight


def replicated(
    model: nn.Module, outside: list[nn.Parameter], loss_fn: Callable[[nn.Module, Any], Any], device: torch.device
) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """`loss_fn(model, batch)` whose backward all-reduces the gradients of the model's and `outside`'s parameters
    (DistributedDataParallel); the plain call in a single process."""
    if not active():
        return lambda batch: loss_fn(model, batch)
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    class Step(nn.Module):
        """The loss of one batch as a module, so DDP sees every trained parameter: the model's own and those
        outside it (distillation's projections, SMP's mask scores), whatever the loss function does with them."""

        def __init__(self) -> None:
            super().__init__()
            self.model, self.outside = model, nn.ParameterList(outside)

        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return loss_fn(self.model, batch)

    gpu = device.index if device.index is not None else torch.cuda.current_device() if device.type == "cuda" else None
    ids = None if gpu is None else [gpu]
    # unused parameters exist by design: a phase may freeze or skip some (a pooler, a pruned head's scores)
    return DistributedDataParallel(Step(), device_ids=ids, find_unused_parameters=True)
