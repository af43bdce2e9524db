"""Pre-checks of Ultralytics train arguments: values Ultralytics would reject (or act on) only after the run began.

Each check judges a value as Ultralytics itself would when it reaches it (``init_seeds``, ``select_device``,
``build_optimizer``, ``check_det_dataset``, the run folder, ``parse_model``), but before anything is
built, downloaded or written, and says in one line what was wrong and what to do.

One concern a module: :mod:`.values` (``seed=``, ``device=``, ``optimizer=``), :mod:`.run_folder`
(``project=``, ``name=``), :mod:`.data` (``data=``, ``split=``, ``cfg=``), :mod:`.model` (``model=``), and
:mod:`.train_args`, which runs the checks every train command needs.
"""

from __future__ import annotations

from .data import DATA_SUFFIXES, SCAN_LIMIT, check_cfg_file, check_classify_data, check_data, check_split
from .model import check_checkpoint_model, check_model_yaml
from .run_folder import NAME_MAX, PATH_MAX, check_run_folder, run_dir
from .train_args import check_shards, check_train_args
from .values import SEED_LIMIT, check_device, check_optimizer, check_seed, optimizer_names

__all__ = [
    "DATA_SUFFIXES",
    "NAME_MAX",
    "PATH_MAX",
    "SCAN_LIMIT",
    "SEED_LIMIT",
    "check_cfg_file",
    "check_checkpoint_model",
    "check_classify_data",
    "check_data",
    "check_device",
    "check_model_yaml",
    "check_optimizer",
    "check_run_folder",
    "check_seed",
    "check_shards",
    "check_split",
    "check_train_args",
    "optimizer_names",
    "run_dir",
]
