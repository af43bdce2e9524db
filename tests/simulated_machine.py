"""Another machine, simulated on this one: a ``yolo-det`` subprocess that sees another core count and/or a
capped instruction set.

The core count is patched through a ``sitecustomize`` module put first on the child's ``PYTHONPATH``, so every
Python process the child starts sees it too (``yolo-det`` re-executes itself under ``portable``). The
instruction set is capped the way a machine without AVX-512 would be: ``ATEN_CPU_CAPABILITY`` (and oneDNN's
``ONEDNN_MAX_CPU_ISA``) set before torch starts.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers import ROOT, subprocess_env

_SITE = """import os
_n = int(os.environ["YOLO_DET_SIMULATED_CPUS"])
os.cpu_count = lambda: _n
if hasattr(os, "sched_getaffinity"):
    os.sched_getaffinity = lambda pid=0: set(range(_n))
"""

#: How an ISA cap is simulated: the variables a machine whose best branch is that one would effectively run with.
ISA_CAPS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


@dataclass(frozen=True)
class Machine:
    """A simulated machine: ``cpus`` logical CPUs (None: this machine's) and an ISA cap (None: none)."""

    cpus: int | None = None
    isa: str | None = None

    def __str__(self) -> str:
        parts = [f"{self.cpus} cpus" if self.cpus else "this machine's cpus", f"isa {self.isa or 'native'}"]
        return ", ".join(parts)

    def env(self, tmp: Path) -> dict[str, str]:
        """The child's environment (``tmp`` holds the ``sitecustomize`` module)."""
        extra: dict[str, str] = dict(ISA_CAPS[self.isa]) if self.isa else {}
        path: list[Path] = []
        if self.cpus is not None:
            site = tmp / f"simulated-{self.cpus}-cpus"
            site.mkdir(parents=True, exist_ok=True)
            (site / "sitecustomize.py").write_text(_SITE, encoding="utf-8")
            extra["YOLO_DET_SIMULATED_CPUS"] = str(self.cpus)
            path.append(site)
        env = subprocess_env(extra, path=path)
        for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR"):
            if name not in extra:
                env.pop(name, None)
        return env


def run_yolo_det(
    machine: Machine, argv: list[str], tmp: Path, *, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m yolo_det ARGV`` on the simulated ``machine``."""
    return subprocess.run(
        [sys.executable, "-m", "yolo_det", *argv],
        cwd=ROOT,
        env=machine.env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(machine: Machine, code: str, tmp: Path, *, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -c CODE`` on the simulated ``machine``."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=machine.env(tmp), capture_output=True, text=True, timeout=timeout
    )


def _main(argv: list[str]) -> int:
    """``python tests/simulated_machine.py [--cpus N] [--isa avx2|default] -- PYTHON-ARGS``: run Python on the
    simulated machine (``make test-other-machine`` runs the numerics-sensitive tests so)."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="simulated_machine")
    parser.add_argument("--cpus", type=int, default=None)
    parser.add_argument("--isa", choices=sorted(ISA_CAPS), default=None)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    machine = Machine(cpus=ns.cpus, isa=ns.isa)
    with tempfile.TemporaryDirectory() as tmp:
        env = machine.env(Path(tmp))
        if ns.cpus is not None:
            env["OMP_NUM_THREADS"] = str(ns.cpus)  # torch's own thread count follows the cores it sees
        print(f"simulated machine: {machine}", file=sys.stderr)
        return subprocess.call([sys.executable, *args], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(_main(sys.argv[1:]))
