"""torch's FSDP2 offload policies. mpitensor keeps every array in host memory, so
the parameters, gradients and optimizer state that ``CPUOffloadPolicy`` moves to
the CPU in torch are there already: fully_shard accepts the policy, checks its
type, and runs exactly as without it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OffloadPolicy", "CPUOffloadPolicy"]


@dataclass(frozen=True)
class OffloadPolicy:
    """No offloading: torch's default ``offload_policy`` of fully_shard. Local (a value).

    Example: ``fully_shard(model, offload_policy=OffloadPolicy())``.
    """


@dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """torch's ``CPUOffloadPolicy``: sharded parameters, their gradients and the
    optimizer step on the CPU. In mpitensor they always are, so this changes
    nothing; ``pin_memory`` (page-locked host memory for device copies) has no
    device to copy to. Local (a value).

    Example: ``fully_shard(model, offload_policy=CPUOffloadPolicy())``.
    """

    pin_memory: bool = True
