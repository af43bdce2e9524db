"""Resume on the real yolov5 package (a patched copy of the installed one): interrupted after epoch 2 of 4 and
resumed with ``train.py --resume`` under ``--det-profile repro`` (with 2 loader workers where the first part had
none), it ends with the straight run's weights.

Also: the patched line, the seeded per-epoch data order, and the record of a resumed run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_integrations_yolov5 import _offline_env, yolov5_copy  # noqa: F401 - the fixture is used by name

from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.resume import state_path
from yolo_det.core.seeding import epoch_data_seed
from yolo_det.integrations.yolov5.data import EpochLoader

_DRIVER = """
import json, sys
from yolov5 import train
from yolov5.utils.callbacks import Callbacks

mode, name = sys.argv[1], sys.argv[2]


class Stop(Exception):
    pass


def stop_after(last, epoch, final_epoch, best_fitness, fi):
    if epoch + 1 == 2:
        raise Stop()


if mode == "resume":
    if len(sys.argv) > 3:  # resume with another worker count
        import yaml
        from pathlib import Path
        opt_yaml = Path(f"runs/{name}/opt.yaml")
        opt_yaml.write_text(yaml.safe_dump({**yaml.safe_load(opt_yaml.read_text()), "workers": int(sys.argv[3])}))
    sys.argv = ["train.py", "--resume", f"runs/{name}/weights/last.pt"]
    opt = train.parse_opt()
    train.main(opt)
else:
    opt = train.parse_opt(True)
    for k, v in dict(data="data.yaml", cfg="tiny.yaml", weights="", imgsz=64, batch_size=8, epochs=4, device="cpu",
                     workers=0, noplots=True, project="runs", name=name, exist_ok=True,
                     det_profile="repro", seed=int(sys.argv[3])).items():
        setattr(opt, k, v)
    callbacks = Callbacks()
    if mode == "part":
        callbacks.register_action("on_model_save", name="stop", callback=stop_after)
    try:
        train.main(opt, callbacks)
    except Stop:
        print("STOPPED")
"""


def _drive(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "resume_driver.py", *args],
        cwd=root,
        env=_offline_env(root),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_patched_yolov5_resumes_bit_for_bit(yolov5_copy: Path) -> None:  # noqa: F811
    root = yolov5_copy
    (root / "resume_driver.py").write_text(textwrap.dedent(_DRIVER))
    _drive(root, "straight", "straight", "3")
    assert "STOPPED" in _drive(root, "part", "part", "3").stdout
    weights = root / "runs" / "part" / "weights"
    assert state_path(weights / "last.pt").is_file()
    first = json.loads((root / "runs" / "part" / RECORD_NAME).read_text())
    assert first["status"] == "failed"
    assert first["resume_states_written"] == 2
    _drive(root, "resume", "part", "2")  # with 2 loader workers where the first part had none
    straight = checkpoint_digest(root / "runs" / "straight" / "weights" / "last.pt")
    assert checkpoint_digest(weights / "last.pt") == straight

    record = json.loads((root / "runs" / "part" / RECORD_NAME).read_text())
    assert record["status"] == "completed"
    assert record["weights"]["sha256"] == straight
    assert record["resume"]["resumed"]
    assert record["resume"]["state_found"]
    assert record["resume"]["epoch"] == 2
    assert record["resume"]["bitwise_expected"] is True
    assert len(record["resume"]["checkpoint_sha256"]) == 64
    assert [s["status"] for s in record["segments"]] == ["failed"]  # the first part's record is kept
    assert record["run"]["seed"] == 3
    assert record["run"]["det_profile"] == "repro"
    # the batches did not depend on the worker count: the data stream was keyed in both parts
    assert (record["data_stream"]["mode"], record["data_stream"]["workers"]) == ("keyed", 2)
    assert record["data_stream"]["fingerprint_epoch"] == 2
    assert (first["data_stream"]["mode"], first["data_stream"]["workers"]) == ("keyed", 0)

    # Without the resume state: a warning, a record that says so, and other weights.
    _drive(root, "part", "nostate", "3")
    nostate = root / "runs" / "nostate" / "weights"
    for f in nostate.glob("yolo-det-resume.*"):
        f.unlink()
    proc = _drive(root, "resume", "nostate")
    assert "no resume state for" in proc.stderr
    assert "not bit for bit" in proc.stderr
    record = json.loads((root / "runs" / "nostate" / RECORD_NAME).read_text())
    assert record["resume"]["state_found"] is False
    assert record["resume"]["bitwise_expected"] is False
    assert "not found" in record["resume"]["problem"]
    assert checkpoint_digest(nostate / "last.pt") != straight


def test_the_data_order_is_a_function_of_seed_rank_and_epoch() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(32))

    def order(seed: int, epoch: int, warm: int = 0) -> list[int]:
        like = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator())
        loader = EpochLoader(like, seed=seed, epoch=epoch - warm)  # a run that starts at epoch - warm
        for _ in range(warm):  # earlier epochs consumed the generator: they must not matter
            next(iter(loader))
        return next(iter(loader))[0].tolist()

    assert order(3, 2) == order(3, 2, warm=2)  # a resumed run (no earlier epochs) sees the same order
    assert order(3, 2) != order(4, 2)  # the user's seed decides
    assert order(3, 2) != order(3, 1)
    assert epoch_data_seed(3, 0, 0) != epoch_data_seed(3, 1, 0) != epoch_data_seed(3, 0, 1)
