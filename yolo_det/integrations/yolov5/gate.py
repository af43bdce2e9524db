"""The one gate for a YOLOv5 run: the options a resumed run reads from its ``opt.yaml``, and its run folder.

A resumed YOLOv5 run (``train.py --resume RUN/weights/last.pt``) replaces every option by the ones its
``RUN/opt.yaml`` (or the checkpoint's ``opt``) stores, then reads the data YAML they name (whose ``download:``
YOLOv5 runs as Python when a split is missing), the hyperparameters file and the checkpoint, and writes into
the ``save_dir`` they name. Those options come from a file, so before ``train()`` reads or writes anything,
:func:`check_options` passes them through :func:`yolo_det.analysis.gate.check_sourced`, as ``data=`` on
yolo-det's command line is:

- every option, by construction (YOLOv5 has no table of its path options: each option whose value names a
  file here is gated by its kind): ``data`` as a data YAML, ``weights`` and ``resume`` by the arguments the
  checkpoint stores (``opt``; YOLOv5 unpickles the checkpoint itself, see docs/security.md), anything else by
  its suffix (a checkpoint, or a bounded YAML whose own path arguments are gated);
- a resumed run writes only into the run folder that holds its checkpoint: an ``opt.yaml`` naming another
  ``save_dir`` is refused, and so is one whose ``cache: disk`` would write ``.npy`` files into the dataset
  (:func:`yolo_det.analysis.gate.check_stored_writes`);
- a run folder that exists already (a resumed run, ``--exist-ok``) is refused when it holds a symbolic link
  (:func:`yolo_det.core.runfolder.check_no_links`), before anything is written.

Options given on YOLOv5's command line for a new run are the user's own: they are not gated here (YOLOv5's
behaviour, its dataset downloads included, is unchanged).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...analysis.gate import check_sourced, check_stored_writes
from ...core.errors import ConfigError
from ...core.runfolder import check_no_links

__all__ = ["OPTION_KINDS", "check_options"]

#: The gate's kind of the YOLOv5 options whose kind is not read from their suffix.
OPTION_KINDS = {"data": "data", "weights": "stored", "resume": "stored"}


def _options(opt: Any) -> dict[str, Any]:
    try:
        values = dict(vars(opt))
    except TypeError:
        return {}
    return {k: v for k, v in values.items() if isinstance(k, str)}


def _source(opt: Any) -> str:
    weights = getattr(opt, "weights", None)
    if isinstance(weights, (str, os.PathLike)) and str(weights):
        run = Path(weights).expanduser().absolute().parent.parent
        if (run / "opt.yaml").is_file():
            return f"'{run / 'opt.yaml'}'"
        return f"the opt stored in '{weights}'"
    return "the options of the resumed run"


def check_options(opt: Any) -> None:
    """Gate a YOLOv5 run's options before ``train()`` reads or writes anything (see the module docstring).

    Raises:
        ConfigError, ModelError: One line naming the file refused and where it was named.
    """
    values = _options(opt)
    resumed = values.get("resume") not in (None, False, "")
    if resumed:
        kinds = {k: OPTION_KINDS.get(k, "file") for k in values}
        check_sourced(values, _source(opt), kinds=kinds)
        check_stored_writes(
            values,
            _source(opt),
            opt_in="YOLOv5 resumes with the stored options only: to cache, start a new run with --{key} {value}",
        )
    save_dir = values.get("save_dir")
    if not isinstance(save_dir, (str, os.PathLike)) or not str(save_dir):
        return
    folder = Path(save_dir).expanduser()
    weights = values.get("weights")
    if resumed and isinstance(weights, (str, os.PathLike)) and str(weights):
        run = Path(weights).expanduser().absolute().parent.parent
        if folder.absolute() != run and not (folder.exists() and folder.resolve() == run.resolve()):
            raise ConfigError(
                f"the resumed run's options ({_source(opt)}) name save_dir '{folder}', but its checkpoint is "
                f"in '{run}': a resumed run writes only into the folder of its checkpoint; fix save_dir there"
            )
    check_no_links(folder)
