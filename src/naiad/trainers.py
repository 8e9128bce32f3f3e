"""What trainers see of the loader: Hugging Face Accelerate's ``prepare()`` and its states.

NOTE [ Accelerate ]
``accelerator.prepare()`` rebuilds every torch DataLoader as its own torch-based one (a
streaming source then fails, a dataset loses naiad's batching), unless the loader says it is
prepared already. naiad's loader says so, and shards by itself: a stream by
``torch.distributed``, a map-style dataset by ``rank``/``world_size``; an unsharded map-style
loader then fails at ``iter()`` with the fix, rather than every process reading every sample
(docs/TRAINERS.md). Accelerate's ``save_state``/``load_state`` save and load the loader's state
when it says it has one (``use_stateful_dataloader``).
"""

from __future__ import annotations

import torch

from naiad.errors import ConfigError

__all__ = ["AccelerateHooks"]


class AccelerateHooks:
    """The attributes Accelerate reads of a loader (NOTE [ Accelerate ]); mixed into
    :class:`naiad.DataLoader`, whose pipeline says whether the loader shards a dataset itself
    (``sharded_by_loader``) and whose options hold the rank it shards for."""

    use_stateful_dataloader = True
    """Tells Accelerate's ``save_state``/``load_state`` to save and load this loader's state."""

    @property
    def _is_accelerate_prepared(self) -> bool:
        self.__dict__["_given_to_accelerate"] = True  # asked by prepare(): given to Accelerate
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self.__dict__["_given_to_accelerate"] = bool(value)  # prepare() marks what it returns

    def _check_sharded_for_accelerate(self, sharded_by_loader: bool, rank: int | None) -> None:
        """Raise if the loader went through ``prepare()`` in a job of several processes while it
        shards a dataset by ``rank``/``world_size`` and was given none (every process would read
        every sample).

        Raises:
            ConfigError: saying how to shard it.
        """
        if not self.__dict__.get("_given_to_accelerate", False) or not sharded_by_loader:
            return
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and rank is None:
            raise ConfigError(
                f"this naiad.DataLoader was given to accelerator.prepare() in a job of "
                f"{dist.get_world_size()} processes but is not sharded, so every process would read "
                "every sample; make it with rank=accelerator.process_index, "
                "world_size=accelerator.num_processes (prepare() keeps naiad's loader as it is)."
            )
