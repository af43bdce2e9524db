"""``shards: K``: the data side (which samples form each shard) and the step side (each shard computed alone, the
shards summed in shard order) give the same weights on 1, 2 and 4 ranks (gloo process groups on the CPU here;
whole Ultralytics runs under torchrun are in tests/test_shards_torchrun.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from yolo_det.core.errors import ConfigError, ProfileError
from yolo_det.core.profiles import load_profile
from yolo_det.fixes import data_invariance as _data
from yolo_det.fixes.shards import (
    ShardCollate,
    ShardedBatch,
    ShardedBatchSampler,
    ShardedStep,
    ShardLayout,
    sharded_loader,
)

# -- the layout --------------------------------------------------------------------------------------------


def test_layout_refuses_a_world_that_does_not_divide_the_shards_in_one_line() -> None:
    with pytest.raises(ConfigError) as e:
        ShardLayout.checked(4, 3, 0, 8)
    assert "\n" not in str(e.value)
    assert "divides 4 (1, 2, 4), this job has 3" in str(e.value)


def test_layout_refuses_a_batch_that_is_not_a_multiple_of_the_shards() -> None:
    with pytest.raises(ConfigError, match=r"multiple of 4, got batch=6; use batch=4"):
        ShardLayout.checked(4, 2, 0, 6)


def test_a_layout_that_cannot_fit_is_refused_before_anything_is_built_or_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from yolo_det.cli import main
    from yolo_det.tools.prepare import prepare

    profile = tmp_path / "shards4.yaml"
    profile.write_text("name: shards4\nextends: repro\ntrain:\n  shards: 4\n")
    runs = tmp_path / "runs"
    code = main(["train", "--profile", str(profile), "epochs=1", "batch=6", f"project={runs}", "name=ragged"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "needs a batch that is a multiple of 4, got batch=6; use batch=4" in err[0]
    assert not runs.exists()  # no run folder, no failed record: nothing was built
    # the ranks of a torchrun job that do not divide the shards: refused by the same pre-check
    for name, value in {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"divides 4 \(1, 2, 4\), this job has 3"):
        prepare(str(profile), ["epochs=1", "batch=8", f"project={runs}"])
    # control: a layout that fits passes (two ranks, a batch of 8)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert prepare(str(profile), ["epochs=1", "batch=8", f"project={runs}"])[1]["batch"] == 8
    assert not runs.exists()


def test_layout_gives_each_rank_its_contiguous_shards() -> None:
    assert [(ShardLayout.checked(4, 2, r, 8).first, ShardLayout.checked(4, 2, r, 8).per_rank) for r in (0, 1)] == [
        (0, 2),
        (2, 2),
    ]
    assert ShardLayout.checked(4, 1, -1, 8).first == 0  # a single process (rank -1) computes every shard


def test_profile_key_shards_is_validated(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: s\nextends: repro\ntrain:\n  shards: 4\n")
    profile = load_profile(str(good))
    assert profile.train.extra["shards"] == 4
    assert load_profile("repro").train.extra["shards"] is None  # off unless asked
    for bad in ("0", "true", "2.5", "'4'"):
        path = tmp_path / "bad.yaml"
        path.write_text(f"name: s\nextends: repro\ntrain:\n  shards: {bad}\n")
        with pytest.raises(ProfileError, match="shards"):
            load_profile(str(path))


# -- the data ------------------------------------------------------------------------------------------------


class _Numbers(torch.utils.data.Dataset[Any]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"img": torch.tensor([float(index), float(torch.rand(()))]), "index": index}


def _steps(n: int, batch: int, shards: int, world: int, shuffle: bool = True) -> list[list[int]]:
    """The samples of every step, the ranks' shares put together in rank order."""
    per_rank = []
    for rank in range(world):
        inner = BatchSampler(RandomSampler(range(n)) if shuffle else SequentialSampler(range(n)), batch // world, False)
        sampler = ShardedBatchSampler(inner, seed=5, layout=ShardLayout.checked(shards, world, rank, batch))
        per_rank.append([[i for _, i in step] for step in sampler])
        assert len(sampler) == math.ceil(n / batch)
    return [sum((ranks[k] for ranks in per_rank), []) for k in range(len(per_rank[0]))]


@pytest.mark.parametrize("n", [16, 19, 5])
def test_every_number_of_ranks_takes_the_same_samples_per_step(n: int) -> None:
    one = _steps(n, 8, 4, 1)
    assert _steps(n, 8, 4, 2) == one
    assert _steps(n, 8, 4, 4) == one
    assert sorted(set(sum(one, []))) == list(range(n))  # every sample, each step a multiple of the shards
    assert all(len(step) % 4 == 0 for step in one)
    assert one != _steps(n, 8, 4, 1, shuffle=False) or n < 3  # the order is shuffled (control)


def test_the_last_short_step_is_padded_with_the_first_samples_of_the_order() -> None:
    steps = _steps(19, 8, 4, 1)
    assert [len(s) for s in steps] == [8, 8, 4]  # 3 samples left, padded to one per shard
    order = steps[0] + steps[1]
    assert steps[2][3] == order[0]
    assert len(set(steps[2][:3]) & set(order)) == 0


def test_collate_cuts_a_step_into_equal_shards_and_refuses_a_ragged_one() -> None:
    collate = ShardCollate(lambda samples: {"n": [s for s in samples]}, 2)
    batch = collate([1, 2, 3, 4])
    assert isinstance(batch, ShardedBatch)
    assert [s["n"] for s in batch.shards] == [[1, 2], [3, 4]]
    assert batch["n"] == [1, 2]  # as a mapping it is the first shard
    with pytest.raises(RuntimeError, match="not a multiple of its 2 shards"):
        collate([1, 2, 3])


def test_a_sharded_loader_yields_the_rank_s_shards_with_keyed_draws_and_leaves_the_one_it_was_built_like() -> None:
    dataset = _Numbers(12)
    seen: dict[int, list[list[Any]]] = {}
    for world in (1, 2):
        rows: list[list[Any]] = []
        for rank in range(world):
            loader = DataLoader(dataset, batch_size=4 // world, shuffle=True, generator=torch.Generator())
            before = (loader.collate_fn, loader.batch_sampler)
            sharded = sharded_loader(loader, 7, ShardLayout.checked(2, world, rank, 4))
            batches = list(sharded)
            assert (loader.collate_fn, loader.batch_sampler) == before
            assert isinstance(sharded.collate_fn, ShardCollate)
            assert isinstance(sharded.keys, ShardedBatchSampler)
            assert sharded.batch_size == 4 // world
            rows.append([[s["img"].tolist() for s in b.shards] for b in batches])
        seen[world] = [sum((r[k] for r in rows), []) for k in range(len(rows[0]))]
    assert seen[1] == seen[2]  # the same shards, the same keyed random draws, on 1 and 2 ranks
    assert len({tuple(v[1] for shard in step for v in shard) for step in seen[1]}) == 3


def _pixels_by_sample(world: int, shards: int | None) -> dict[str, bytes]:
    """Each sample's image (mosaic and mixup on) in one epoch of Ultralytics' demo data, by file: under ``shards``
    on ``world`` ranks (every rank's loader), or from a loader made invariant without shards."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import DEFAULT_CFG

    from yolo_det.tools.demo import demo_data_yaml

    cfg = get_cfg(DEFAULT_CFG, {"imgsz": 64, "mosaic": 1.0, "mixup": 0.5, "fliplr": 0.5})
    data = check_det_dataset(str(demo_data_yaml()))
    dataset = build_yolo_dataset(cfg, data["train"], 8, data, mode="train", stride=32)
    out: dict[str, bytes] = {}
    for rank in range(world):
        loader = DataLoader(
            dataset, batch_size=8 // world, shuffle=True, collate_fn=dataset.collate_fn, generator=torch.Generator()
        )
        if shards is None:
            batches = list(_data.keyed_loader(loader, 7))
        else:
            sharded = sharded_loader(loader, 7, ShardLayout.checked(shards, world, rank, 8))
            batches = [shard for b in sharded for shard in b.shards]
        for b in batches:
            for file, img in zip(b["im_file"], b["img"]):
                out[file] = img.numpy().tobytes()
    return out


def test_a_sample_s_pixels_mix_partners_included_are_the_same_for_any_number_of_ranks_and_shards() -> None:
    alone = _pixels_by_sample(1, None)
    assert len(alone) == 48  # every demo image once
    assert _pixels_by_sample(1, 2) == alone
    assert _pixels_by_sample(2, 4) == alone
    assert _pixels_by_sample(2, 2) == alone


# -- the step --------------------------------------------------------------------------------------------------


class _Net(nn.Module):
    """A BatchNorm layer, a dropout and a loss whose parts are a name mapping (as Ultralytics 8.4's)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(4, 1)

    def forward(self, batch: Any) -> Any:
        if not isinstance(batch, dict):
            return self.head(self.bn(self.conv(batch)).mean((2, 3)))
        x = self.drop(torch.relu(self.bn(self.conv(batch["img"])))).mean((2, 3))
        err = (self.head(x).squeeze(1) - batch["y"]) ** 2
        parts = torch.stack([err.mean(), err.max()])
        return parts * len(err), {"mse": parts[0].detach(), "worst": parts[1].detach()}


def _batches(steps: int, batch: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [
        {"img": torch.randn(batch, 3, 6, 6, generator=g), "y": torch.randn(batch, generator=g)} for _ in range(steps)
    ]


def _train(rank: int, world: int, shards: int, out: str, port: int) -> None:
    """One rank of a tiny sharded run (3 steps, accumulating over 2 of them); rank 0 saves the model."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)  # other start weights on every rank: the step starts from rank 0's
        net = _Net()
        layout = ShardLayout.checked(shards, world, rank, 8)
        if world > 1:
            from yolo_det.fixes.shards import broadcast_state

            broadcast_state(net)
        step = ShardedStep(net, layout=layout, seed=3)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        logged = []
        for k, batch in enumerate(_batches(3, 8)):
            size = layout.shard_size
            shards_of_rank = [
                {key: v[(layout.first + j) * size : (layout.first + j + 1) * size] for key, v in batch.items()}
                for j in range(layout.per_rank)
            ]
            loss, parts = step(ShardedBatch(shards_of_rank))
            loss.sum().backward()  # reaches no parameter
            logged.append((loss.item(), parts["mse"].item()))
            if k != 0:  # steps 0+1 accumulate
                opt.step()
                opt.zero_grad()
        if rank == 0:
            torch.save({"state": net.state_dict(), "logged": logged, "rows": step.shard_rows}, out)
    finally:
        if world > 1:
            dist.destroy_process_group()


def _run(tmp_path: Path, world: int, shards: int) -> dict[str, Any]:
    from torchrun_jobs import free_port

    out = str(tmp_path / f"w{world}-k{shards}.pt")
    if world == 1:
        _train(0, 1, shards, out, 0)
    else:
        torch.multiprocessing.spawn(_train, args=(world, shards, out, free_port()), nprocs=world)
    return torch.load(out)


@pytest.mark.slow
def test_one_two_and_four_ranks_give_bitwise_equal_weights_and_statistics(tmp_path: Path) -> None:
    torch.manual_seed(0)
    start = _Net().state_dict()  # rank 0's start weights
    one, two, four = (_run(tmp_path, w, 4) for w in (1, 2, 4))
    assert one["rows"] == two["rows"] == four["rows"] == 4
    for other in (two, four):
        assert other["logged"] == one["logged"]  # the loss and its parts too
        for key, value in one["state"].items():
            assert torch.equal(value, other["state"][key]), key
    assert not torch.equal(one["state"]["conv.weight"], start["conv.weight"])  # it trained
    assert not torch.equal(one["state"]["bn.running_mean"], start["bn.running_mean"])
    assert int(one["state"]["bn.num_batches_tracked"]) == 3  # one update per step
    two_shards = _run(tmp_path, 1, 2)
    assert not torch.equal(two_shards["state"]["conv.weight"], one["state"]["conv.weight"])  # control: K matters


def test_a_failing_shard_leaves_gradients_statistics_and_generators_as_they_were() -> None:
    net = _Net()
    step = ShardedStep(net, layout=ShardLayout.checked(2, 1, 0, 4), seed=0)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    good = {"img": torch.randn(2, 3, 6, 6), "y": torch.randn(2)}
    bad = {"img": torch.randn(2, 3, 6, 6)}  # no targets: its loss raises
    rng = torch.random.get_rng_state()
    with pytest.raises(KeyError):
        step(ShardedBatch([good, bad]))
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in net.parameters())
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    assert net.bn.momentum == 0.1
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_gradients_of_earlier_steps_are_accumulated_and_plain_calls_pass_through() -> None:
    net = _Net()
    net.drop.p = 0.0  # each step then computes the same gradients
    step = ShardedStep(net, layout=ShardLayout.checked(2, 1, 0, 4), seed=0)
    batch = {"img": torch.randn(4, 3, 6, 6), "y": torch.randn(4)}
    shards = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    step(ShardedBatch(shards))
    first = net.conv.weight.grad.clone()
    step(ShardedBatch(shards))
    assert not torch.equal(net.conv.weight.grad, first)
    assert torch.equal(net.conv.weight.grad, first + first)  # added to what the earlier step left
    assert step(batch["img"]).shape == (4, 1)  # a tensor: the model itself


class _Trainer:
    """The parts of an Ultralytics trainer the shard step touches (its constructor's arguments too: the seam's
    launcher passes them on)."""

    def __init__(self, cfg: Any = None, overrides: Any = None, _callbacks: Any = None) -> None:
        self.model = _Net()
        self.world_size = 1
        self.batch_size = 4
        self.epoch = 0
        self.args = type("Args", (), {"rect": False, "multi_scale": 0.0, "compile": False})()

    def preprocess_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, "img": batch["img"] * 2}


def _seamed() -> Any:
    """A :class:`_Trainer` through the trainer seam (what yolo-det's routes train with)."""
    from yolo_det.integrations.ultralytics.seam import SeamTrainer

    return type("Seamed", (SeamTrainer, _Trainer), {})()


def test_install_wraps_the_model_the_seam_preprocesses_each_shard_and_uninstall_gives_the_model_back() -> None:
    from yolo_det.integrations.ultralytics import shards as ul_shards

    trainer = _seamed()
    net = trainer.model
    layout = ul_shards.check(trainer, 2, -1, 1)
    step = ul_shards.install(trainer, layout, seed=0)
    assert trainer.model is step
    assert step.module is net
    batch = ShardedBatch([{"img": torch.ones(2, 3, 6, 6), "y": torch.zeros(2)}] * 2)
    out = trainer.preprocess_batch(batch)
    assert isinstance(out, ShardedBatch)
    assert [float(s["img"].max()) for s in out.shards] == [2.0, 2.0]  # each shard through the trainer's own
    ul_shards.uninstall(trainer)
    assert trainer.model is net
    assert "preprocess_batch" not in vars(trainer)


def test_what_shards_cannot_make_rank_free_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from yolo_det.core import compat
    from yolo_det.integrations.ultralytics import shards as ul_shards

    trainer = _seamed()
    trainer.args.rect = True
    with pytest.raises(ConfigError, match="cannot train with rect=True"):
        ul_shards.check(trainer, 2, -1, 1)
    trainer.args.rect = False
    monkeypatch.setattr(compat, "sees_through", lambda wrapper, inner: False)  # an Ultralytics without it
    net = trainer.model
    with pytest.raises(ConfigError, match="finds its model inside a wrapper"):
        ul_shards.install(trainer, ul_shards.check(trainer, 2, -1, 1), seed=0)
    assert trainer.model is net  # nothing changed
    with pytest.raises(ConfigError, match=r"^shards: 2 needs yolo-det's trainer seam.*base=YourTrainer\)\)$"):
        ul_shards.check(_Trainer(), 2, -1, 1)  # callbacks alone: refused, never trained unsharded
