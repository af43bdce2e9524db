"""Torch version strings and version ranges (>=2.1,<2.4), and the per-version facts the audit trace needs."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Iterable

from ...core.errors import ConfigError
from .schema import _CLAUSE

__all__ = ["FAKE_CUDA_WITHOUT_DEVICE", "fake_cuda_trace_problem", "parse_version", "torch_version", "version_in"]

#: The torch versions whose fake-CUDA convolution runs on a machine without a usable CUDA device (measured:
#: 2.14.1 does; the CUDA builds of 2.4.1 and 2.9.1 abort the process in the convolution, which Python cannot
#: catch). Between the two, a short child process finds out (:func:`fake_cuda_trace_problem`).
FAKE_CUDA_WITHOUT_DEVICE = ">=2.14"

_PROBE = (
    "import torch\n"
    "from torch._subclasses.fake_tensor import FakeTensorMode\n"
    "with FakeTensorMode(allow_non_fake_inputs=True):\n"
    "    x = torch.empty(1, 1, 4, 4, device='cuda')\n"
    "    w = torch.empty(1, 1, 3, 3, device='cuda', requires_grad=True)\n"
    "    torch.nn.functional.conv2d(x, w)\n"  # with a weight that needs its gradient, as in training
)


def parse_version(version: str | Iterable[int]) -> tuple[int, int, int]:
    """``"2.14.1+cu130"`` -> ``(2, 14, 1)``. Local and pre-release suffixes are ignored.

    Raises:
        ConfigError: The string does not start with a version number.
    """
    if not isinstance(version, str):
        parts = [int(p) for p in version]
    else:
        m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
        if m is None:
            raise ConfigError(f"'{version}' is not a torch version; give it like 2.1 or 2.14.1")
        parts = [int(p) for p in m.group(1).split(".")]
    parts = (parts + [0, 0, 0])[:3]
    return parts[0], parts[1], parts[2]


def torch_version() -> str:
    """The running torch's version string."""
    import torch

    return str(torch.__version__)


def version_in(spec: str, version: str | tuple[int, int, int]) -> bool:
    """Whether ``version`` satisfies ``spec``, a comma-separated list like ``">=2.1,<2.14"`` (empty: any).

    Raises:
        ConfigError: A clause of ``spec`` is not ``<op><version>``.
    """
    v = parse_version(version) if isinstance(version, str) else version
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ConfigError(
                f"bad version clause '{clause}' in '{spec}'; use >=, <=, ==, !=, > or < and a version, e.g. >=2.1,<2.14"
            )
        op, bound = m.group(1), parse_version(m.group(2))
        ok = {">=": v >= bound, "<=": v <= bound, "==": v == bound, "!=": v != bound, ">": v > bound, "<": v < bound}[
            op
        ]
        if not ok:
            return False
    return True


@functools.lru_cache(maxsize=1)
def fake_cuda_trace_problem() -> str | None:
    """Why the audit's fake-CUDA trace cannot run with this torch on this machine (None: it can).

    With a usable CUDA device, or a torch in :data:`FAKE_CUDA_WITHOUT_DEVICE`, it can. Otherwise a child
    process traces one fake-CUDA convolution: older torch builds abort the whole process there.
    """
    import torch

    if torch.cuda.is_available() or version_in(FAKE_CUDA_WITHOUT_DEVICE, torch_version()):
        return None
    try:
        done = subprocess.run(  # noqa: S603 - our own interpreter and a fixed snippet
            [sys.executable, "-c", _PROBE], capture_output=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the fake-CUDA probe could not run ({type(e).__name__})"
    if done.returncode == 0:
        return None
    return (
        f"torch {torch_version()} cannot trace fake-CUDA convolutions on a machine without a usable CUDA device "
        f"(torch{FAKE_CUDA_WITHOUT_DEVICE} can)"
    )
