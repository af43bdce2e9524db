"""Shards: the same weights on any number of ranks (the train-phase profile key ``shards: K``).

Length: one mechanism in two halves that only work together: the data side (which samples form shard ``s`` of
step ``k``) and the step side (how one shard is computed and how the shards are summed).

Data-parallel training usually changes its weights with the number of ranks ``W``: each rank normalises its
BatchNorm layers over ``batch / W`` images, computes its loss terms over them, and the gradient all-reduce sums
``W`` partial sums in an order the communication library picks. With ``shards: K`` the unit of work is fixed
instead, whatever ``W`` divides ``K`` (1 included, with no launcher at all):

- **Data.** Each global step takes the next ``batch`` samples of one order that depends on (seed, epoch) only
  (the order a single process shuffles, :class:`ShardedBatchSampler`), and cuts them into ``K`` shards of
  ``batch / K`` samples by position. The last, shorter step is padded to a multiple of ``K`` with the order's
  first samples (as ``DistributedSampler`` pads). Rank ``r`` loads shards ``r K/W .. (r+1) K/W - 1``;
  every augmentation draw is keyed by (seed, epoch, sample index), mix partners included (drawn over the whole
  dataset), so a shard's images are the same on any rank. :class:`ShardCollate` collates each shard on its own
  into a :class:`ShardedBatch`.
- **Step.** :class:`ShardedStep` wraps the model. For each of its shards it runs forward (BatchNorm over the
  shard's images; dropout and other random layers from a generator keyed by (seed, epoch, step, shard)), the
  loss of the shard and its backward, and keeps the shard's gradients, its BatchNorm batch statistics and its
  loss values. The ranks then gather all ``K`` shards' rows (``all_gather``: data movement, no arithmetic) and
  every rank sums them in shard order ``0, 1, ..., K-1``: the gradients are added to the parameters'
  ``.grad`` (accumulation across steps as before), every BatchNorm layer's running statistics are updated once
  with the mean of the ``K`` shards' statistics, and the loss values are summed (the loss) and averaged (the
  logged parts). Every rank holds the same model after every step, so no DDP all-reduce and no buffer
  broadcast is needed.

What it costs against DDP: each step sends every rank ``K`` gradient rows instead of all-reducing one
(``K x`` the parameter count in communication and ``K/W + K`` rows of memory for the gather), and a forward
and backward per shard instead of one per rank. What it changes against a plain run: BatchNorm normalises
over ``batch / K`` images, and the loss of each shard is normalised over that shard (what ``K`` GPUs of
``batch / K`` images each give under DDP).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import RandomSampler

from ..core.errors import ConfigError
from ..core.profiles import shard_layout_problem
from ..core.seeding import epoch_data_seed
from . import data_invariance as _data

__all__ = [
    "ShardCollate",
    "ShardLayout",
    "ShardedBatch",
    "ShardedBatchSampler",
    "ShardedStep",
    "broadcast_state",
    "sharded_loader",
    "shard_seed",
]

_PERSON = b"yolo-det/shard"


@dataclass(frozen=True)
class ShardLayout:
    """Which shards a rank computes.

    Attributes:
        shards: ``K``, the shards of every global step.
        world: ``W``, the ranks (a divisor of ``K``).
        rank: This rank (0 for a single process).
        batch: The global batch (a multiple of ``K``).
    """

    shards: int
    world: int
    rank: int
    batch: int

    @classmethod
    def checked(cls, shards: int, world: int, rank: int, batch: int) -> ShardLayout:
        """A layout, or :class:`ConfigError` saying in one line what does not fit."""
        world, rank = max(int(world), 1), max(int(rank), 0)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ConfigError(f"shards must be a positive integer, got {shards!r}")
        problem = shard_layout_problem(shards, world, batch)
        if problem:
            raise ConfigError(problem)
        if rank >= world:
            raise ConfigError(f"rank {rank} is outside a job of {world} ranks")
        return cls(int(shards), world, rank, int(batch))

    @property
    def per_rank(self) -> int:
        """Shards each rank computes."""
        return self.shards // self.world

    @property
    def first(self) -> int:
        """The index of this rank's first shard."""
        return self.rank * self.per_rank

    @property
    def shard_size(self) -> int:
        """Samples per shard in a full step."""
        return self.batch // self.shards


def shard_seed(seed: int, epoch: int, step: int, shard: int) -> int:
    """The seed of shard ``shard``'s random layers at step ``step`` of ``epoch`` (a 63-bit int; rank-free)."""
    key = b"%d|%d|%d|%d" % (int(seed), int(epoch), int(step), int(shard))
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, person=_PERSON).digest(), "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------------------------------------------------
# data


class ShardedBatchSampler(_data.KeyedBatchSampler):
    """The batch sampler of one rank under ``shards``: per global step, this rank's shards (see the module).

    The order of epoch ``e`` is the one a single process shuffles with the run's seed (rank 0's data seed),
    whatever the rank and the number of ranks.
    """

    def __init__(
        self, inner: Any, *, seed: int, layout: ShardLayout, epoch: int = 0, generator: Any = None, repeat: bool = False
    ) -> None:
        super().__init__(inner, seed=seed, rank=0, epoch=epoch, generator=generator, repeat=repeat)
        self.layout = layout
        sampler = getattr(inner, "sampler", None)
        self.dataset_size = len(getattr(sampler, "dataset", None) or sampler)  # type: ignore[arg-type]
        self.shuffle = isinstance(sampler, RandomSampler) or bool(getattr(sampler, "shuffle", False))

    def __len__(self) -> int:
        return math.ceil(self.dataset_size / self.layout.batch)

    def order(self, epoch: int) -> list[int]:
        """The samples of epoch ``epoch`` in the order the steps take them."""
        n = self.dataset_size
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator()
        generator.manual_seed(epoch_data_seed(self.seed, 0, epoch))
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # as a single process's loader draws
        return torch.randperm(n, generator=generator).tolist()

    def steps(self, epoch: int) -> Iterator[list[int]]:
        """This rank's samples of each step of epoch ``epoch`` (its shards, one after the other)."""
        order, layout = self.order(epoch), self.layout
        for k in range(len(self)):
            step = order[k * layout.batch : (k + 1) * layout.batch]
            size = math.ceil(len(step) / layout.shards)
            missing = size * layout.shards - len(step)
            if missing:  # the last step: padded with the order's first samples, as DistributedSampler pads
                step = step + (order * math.ceil(missing / len(order)))[:missing]
            yield step[layout.first * size : (layout.first + layout.per_rank) * size]

    def batches(self, epoch: int) -> Iterator[list[int]]:
        return self.steps(epoch)


class ShardedBatch(dict[str, Any]):
    """One step's input on one rank: :attr:`shards`, this rank's shards in shard order, each a batch of its own.

    As a mapping it is the first shard (what a trainer logs or plots about "the batch").
    """

    def __init__(self, shards: list[Any]) -> None:
        if not shards:
            raise ValueError("a sharded batch needs at least one shard")
        super().__init__(shards[0] if isinstance(shards[0], dict) else {})
        self.shards = list(shards)


class ShardCollate:
    """A loader's ``collate_fn`` under ``shards``: the samples of a step cut into ``parts`` equal shards, each
    collated by ``inner`` on its own."""

    def __init__(self, inner: Callable[[list[Any]], Any], parts: int) -> None:
        self.inner = inner
        self.parts = int(parts)

    def __call__(self, samples: list[Any]) -> ShardedBatch:
        samples = list(samples)
        if not samples or len(samples) % self.parts:
            raise RuntimeError(
                f"a sharded step holds {len(samples)} samples, not a multiple of its {self.parts} shards: "
                "the loader's batch sampler was replaced after yolo-det set it up"
            )
        size = len(samples) // self.parts
        return ShardedBatch([self.inner(samples[j * size : (j + 1) * size]) for j in range(self.parts)])


def sharded_loader(like: Any, seed: int, layout: ShardLayout, *, epoch: int = 0) -> Any:
    """A loader built like ``like`` that yields this rank's shards of every step, with worker-invariant data (see
    :func:`~yolo_det.fixes.data_invariance.keyed_loader`).

    Raises:
        ConfigError: ``like`` has no collate_fn, yields single samples, or its dataset cannot be keyed.
    """
    collate = getattr(like, "collate_fn", None)
    if not callable(collate):
        raise ConfigError("shards needs a loader with a collate_fn")
    keys = _data.keyed_sampler(like, seed, kind=ShardedBatchSampler, layout=layout, epoch=epoch)
    return _data.build_keyed(like, keys, collate_fn=ShardCollate(collate, layout.per_rank))


# ---------------------------------------------------------------------------------------------------------
# step


def _norms(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        and m.training
        and m.track_running_stats
        and m.running_mean is not None
        and m.running_var is not None
    ]


def _running(m: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """A BatchNorm layer's running mean and variance (:func:`_norms` keeps only layers that have them)."""
    mean, var = m.running_mean, m.running_var
    if mean is None or var is None:
        raise RuntimeError(f"{type(m).__name__} keeps no running statistics")
    return mean, var


@contextmanager
def _batch_statistics(norms: list[nn.modules.batchnorm._BatchNorm], out: list[torch.Tensor]) -> Iterator[None]:
    """While the block runs, each BatchNorm layer's running statistics become its batch statistics (momentum 1:
    the kernel's own mean and unbiased variance); afterwards they go to ``out`` and the layers get their running
    statistics, counters and momentum back, also when the block raises."""
    saved: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    for m in norms:
        count, (mean, var) = m.num_batches_tracked, _running(m)
        saved.append((m.momentum, mean.clone(), var.clone(), None if count is None else count.clone()))
    for m in norms:
        m.momentum = 1.0
    ok = False
    try:
        yield
        ok = True
    finally:
        for m, (momentum, mean, var, count) in zip(norms, saved):
            running_mean, running_var = _running(m)
            if ok:
                out.append(running_mean.detach().reshape(-1).float().clone())
                out.append(running_var.detach().reshape(-1).float().clone())
            m.momentum = momentum
            with torch.no_grad():
                running_mean.copy_(mean)
                running_var.copy_(var)
                if count is not None and m.num_batches_tracked is not None:
                    m.num_batches_tracked.copy_(count)


@contextmanager
def _shard_generator(seed: int, device: torch.device) -> Iterator[None]:
    """The default generators (CPU, and the device's) seeded with ``seed`` while the block runs; put back after."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    torch.random.default_generator.manual_seed(seed)
    if cuda is not None:
        torch.cuda.default_generators[device.index or 0].manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def _values(items: Any) -> list[Any]:
    """A loss's logged parts (a tensor, a tuple of tensors or a name mapping) in order."""
    if isinstance(items, dict):
        return list(items.values())
    return list(items) if isinstance(items, (list, tuple)) else [items]


def _flat_items(items: Any) -> torch.Tensor:
    """A loss's logged parts as one float vector."""
    values = _values(items)
    return torch.cat([torch.as_tensor(v).detach().reshape(-1).float() for v in values]) if values else torch.zeros(0)


def _shaped_items(like: Any, flat: torch.Tensor) -> Any:
    """``flat`` in the structure of ``like`` (see :func:`_flat_items`)."""
    parts, i = [], 0
    for v in map(torch.as_tensor, _values(like)):
        parts.append(flat[i : i + v.numel()].reshape(v.shape).to(v.dtype))
        i += v.numel()
    if isinstance(like, dict):
        return dict(zip(like, parts))
    return type(like)(parts) if isinstance(like, (list, tuple)) else parts[0]


def broadcast_state(module: nn.Module, group: Any = None) -> None:
    """Every rank takes rank 0's parameters and buffers (in the module's order; a collective)."""
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0, group=group)


class ShardedStep(nn.Module):
    """A model under ``shards``: called with a :class:`ShardedBatch`, it computes this rank's shards, gathers every
    rank's and applies their sum in shard order (see the module); called with anything else, it is the model.

    ``forward(batch)`` returns what the model returns for a batch, ``(loss, parts)``: the loss summed over all
    shards (a tensor that requires grad but reaches no parameter: its backward changes nothing, the gradients
    are in place already) divided by ``loss_scale`` (the caller multiplies it back), and the parts averaged.

    Args:
        module: The model; ``module(shard)`` returns ``(loss, parts)``.
        layout: This rank's shards.
        seed: The run's seed (random layers are keyed by it).
        scaler: ``() -> object with scale(loss)``: the loss scaler each shard's backward goes through (None: none).
        epoch: ``() -> int``: the epoch in progress (random layers are keyed by it).
        loss_scale: What the caller multiplies the returned loss by (the world size, for Ultralytics' DDP rule).
        group: The process group (None: the default one when ``layout.world > 1``).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        layout: ShardLayout,
        seed: int,
        scaler: Callable[[], Any] | None = None,
        epoch: Callable[[], int] | None = None,
        loss_scale: float = 1.0,
        group: Any = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.layout = layout
        self.seed = int(seed)
        self._scaler = scaler
        self._epoch = epoch
        self.loss_scale = float(loss_scale)
        self.group = group
        self._step_epoch: int | None = None
        self.steps_in_epoch = 0
        self.shard_rows = 0  # rows gathered by the last step (K)

    def forward(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(batch, ShardedBatch):
            return self.module(batch, *args, **kwargs)
        if len(batch.shards) != self.layout.per_rank:
            raise RuntimeError(
                f"this rank computes {self.layout.per_rank} shard(s) per step, the batch holds {len(batch.shards)}"
            )
        return self._step(batch.shards)

    def _next_step(self) -> tuple[int, int]:
        epoch = int(self._epoch()) if self._epoch is not None else 0
        if epoch != self._step_epoch:
            self._step_epoch, self.steps_in_epoch = epoch, 0
        step = self.steps_in_epoch
        self.steps_in_epoch += 1
        return epoch, step

    def _step(self, shards: list[Any]) -> tuple[torch.Tensor, Any]:
        epoch, step = self._next_step()
        params = [p for p in self.module.parameters() if p.requires_grad]
        earlier = [p.grad for p in params]  # gradients accumulated by earlier steps
        for p in params:
            p.grad = None
        norms = _norms(self.module)
        scaler = self._scaler() if self._scaler is not None else None
        mine: torch.Tensor | None = None  # this rank's rows, one per shard
        like: Any = None
        device = params[0].device if params else torch.device("cpu")
        try:
            for j, shard in enumerate(shards):
                stats: list[torch.Tensor] = []
                # the running statistics are put back after backward, which reads the tensors forward saw
                with _batch_statistics(norms, stats):
                    with _shard_generator(shard_seed(self.seed, epoch, step, self.layout.first + j), device):
                        loss, items = self.module(shard)
                    total = loss.sum()
                    with torch.autocast(device_type=device.type, enabled=False):
                        (scaler.scale(total) if scaler is not None else total).backward()
                like = items
                grads = [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float() for p in params
                ]
                for p in params:
                    p.grad = None
                loss_row = [total.detach().reshape(1).float(), _flat_items(items).to(device)]
                row = torch.cat([*grads, *stats, *loss_row])
                if mine is None:
                    mine = row.new_empty((len(shards), row.numel()))
                mine[j] = row
        except BaseException:
            for p, g in zip(params, earlier):
                p.grad = g
            raise
        if mine is None:
            raise RuntimeError("a sharded step needs at least one shard")
        everything = self._gather(mine)
        self.shard_rows = int(everything.shape[0])
        acc = everything[0].clone()
        for s in range(1, everything.shape[0]):  # shard order, whatever rank computed which shard
            acc += everything[s]
        return self._apply_sum(acc, params, earlier, norms, like)

    def _gather(self, mine: torch.Tensor) -> torch.Tensor:
        if self.layout.world == 1:
            return mine
        import torch.distributed as dist

        everything = mine.new_empty((self.layout.shards, mine.shape[1]))
        # rank r's rows land in rows r*K/W ...: shard order (the chunks are contiguous views of one tensor)
        dist.all_gather(list(everything.chunk(self.layout.world)), mine, group=self.group)
        return everything

    def _apply_sum(
        self,
        acc: torch.Tensor,
        params: list[nn.Parameter],
        earlier: list[torch.Tensor | None],
        norms: list[nn.modules.batchnorm._BatchNorm],
        like: Any,
    ) -> tuple[torch.Tensor, Any]:
        k = float(self.layout.shards)
        i = 0
        with torch.no_grad():
            for p, before in zip(params, earlier):
                n = p.numel()
                g = acc[i : i + n].reshape(p.shape).to(p.dtype)
                i += n
                p.grad = g.clone() if before is None else before.add_(g)
            for m in norms:
                rm, rv = _running(m)
                c = rm.numel()
                mean, var = acc[i : i + c] / k, acc[i + c : i + 2 * c] / k
                i += 2 * c
                count = m.num_batches_tracked
                if m.momentum is None:  # cumulative average
                    rate = 1.0 / (float(count) + 1.0) if count is not None else 1.0
                else:
                    rate = float(m.momentum)
                rm.copy_(mean.reshape(rm.shape).to(rm.dtype) * rate + rm * (1.0 - rate))
                rv.copy_(var.reshape(rv.shape).to(rv.dtype) * rate + rv * (1.0 - rate))
                if count is not None:
                    count.add_(1)
        loss = acc[i].clone() / self.loss_scale
        parts = _shaped_items(like, acc[i + 1 :] / k)
        return loss.requires_grad_(True), parts
