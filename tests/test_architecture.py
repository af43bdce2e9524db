"""The package's shape: layers import only downwards, no import cycles, and the CLI starts without torch.

Imports are read with ``ast`` from every module of ``yolo_det`` (function-level and ``TYPE_CHECKING``
imports included), so a cycle closed inside a function still counts.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import yolo_det
from helpers import subprocess_env

PACKAGE = Path(yolo_det.__file__).resolve().parent

#: Layers from the bottom up; a module may import its own layer and the ones below, never above.
LAYERS = ["core", "layers", "analysis", "fixes", "session", "integrations", "tools", "commands"]
TOP = len(LAYERS)  # yolo_det/__init__.py, cli.py, __main__.py


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> set[str]:
    """The yolo_det modules ``name`` imports anywhere in its file (package ``__init__`` parents excluded)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package itself
            subs = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES]
            targets = subs if len(subs) == len(node.names) else [module, *subs]
        else:
            continue
        for target in targets:
            if target in MODULES:
                found.add(target)
    found.discard(name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return TOP


def test_every_module_is_in_a_layer_or_is_the_top_level() -> None:
    top = sorted(n for n in MODULES if _layer(n) == TOP)
    assert top == ["yolo_det", "yolo_det.__main__", "yolo_det.cli"]


def test_lower_layers_never_import_higher_ones() -> None:
    wrong = [
        f"{src} ({LAYERS[_layer(src)] if _layer(src) < TOP else 'top'}) imports {dst} "
        f"({LAYERS[_layer(dst)] if _layer(dst) < TOP else 'top'})"
        for src, targets in GRAPH.items()
        for dst in sorted(targets)
        if _layer(dst) > _layer(src)
    ]
    assert wrong == []


def test_no_import_cycles_function_level_imports_included() -> None:
    # Edges into a package's own __init__ from its submodules are how packages re-export; a cycle through
    # one would still show up, because the __init__'s own imports are edges too.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in MODULES:
        if name not in index:
            visit(name)
    assert cycles == []


def test_the_import_reader_sees_function_level_imports() -> None:
    # guards the checks above against reading too little: cli imports its commands only inside functions
    assert "yolo_det.core.errors" in GRAPH["yolo_det.cli"]
    assert any(dst.startswith("yolo_det.analysis.audit") for dst in GRAPH["yolo_det.commands.audit"])


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["profiles"]])
def test_cli_starts_without_importing_torch(argv: list[str]) -> None:
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['yolo-det', *{argv!r}]\n"
        "try:\n"
        "    runpy.run_module('yolo_det', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "heavy = sorted(m for m in ('torch', 'ultralytics', 'numpy', 'cv2') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    env = subprocess_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY="


@pytest.mark.slow
def test_importing_the_package_does_not_import_torch_but_the_public_api_resolves() -> None:
    code = (
        "import sys, yolo_det\n"
        "assert 'torch' not in sys.modules, 'import yolo_det imported torch'\n"
        "missing = [n for n in yolo_det.__all__ if getattr(yolo_det, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert 'torch' in sys.modules\n"
        "assert set(yolo_det.__all__) <= set(dir(yolo_det))\n"
    )
    env = subprocess_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        yolo_det.no_such_name  # noqa: B018


# -- the Ultralytics plugin's rooms ---------------------------------------------------------------------------
ULTRALYTICS = "yolo_det.integrations.ultralytics"


def test_the_ultralytics_plugin_is_a_package_of_rooms() -> None:
    rooms = {name for name in MODULES if name.startswith(f"{ULTRALYTICS}.")}
    assert _is_package(ULTRALYTICS)
    assert {"attach", "trainer", "plugin", "records", "resume"} <= {name.rsplit(".", 1)[1] for name in rooms}
    # the package's own __init__ only gathers the public names: the rooms never import it
    assert [name for name in rooms if ULTRALYTICS in GRAPH[name]] == []


def test_the_ultralytics_public_names_come_from_the_package() -> None:
    import yolo_det.integrations.ultralytics as ul
    from yolo_det.integrations.ultralytics.attach import attach, detach
    from yolo_det.integrations.ultralytics.plugin import UltralyticsPlugin
    from yolo_det.integrations.ultralytics.trainer import trainer_class

    assert ul.__all__ == ["UltralyticsPlugin", "attach", "detach", "trainer_class"]
    assert (ul.attach, ul.detach, ul.UltralyticsPlugin, ul.trainer_class) == (
        attach,
        detach,
        UltralyticsPlugin,
        trainer_class,
    )
    assert yolo_det.attach is attach
    assert yolo_det.trainer_class is trainer_class


# -- the YOLOv5 integration's rooms --------------------------------------------------------------------------
YOLOV5 = "yolo_det.integrations.yolov5"


def test_the_yolov5_integration_is_a_package_that_knows_nothing_of_the_ultralytics_plugin() -> None:
    rooms = {name for name in MODULES if name.startswith(f"{YOLOV5}.")}
    assert _is_package(YOLOV5)
    assert {"run", "resume", "data", "patch", "edits", "writer"} <= {name.rsplit(".", 1)[1] for name in rooms}
    # what both frameworks share (the previous record, segments, the no-state warning) is in core/resume/
    wrong = [f"{src} imports {dst}" for src in [YOLOV5, *rooms] for dst in GRAPH[src] if dst.startswith(ULTRALYTICS)]
    assert wrong == []
    assert "yolo_det.core.resume.lineage" in GRAPH[f"{YOLOV5}.run"]  # the check reads the rooms' imports


def test_the_old_yolov5_names_still_import() -> None:
    import yolo_det.integrations.yolov5 as ydet
    from yolo_det.integrations.yolov5.patch import plan
    from yolo_det.integrations.yolov5.run import training
    from yolo_det.integrations.yolov5.writer import apply_plan

    assert ydet.training is training  # what a patched script calls: `from yolo_det.integrations import yolov5`
    sys.modules.pop("yolo_det.integrations.patch_yolov5", None)
    with pytest.warns(DeprecationWarning, match=r"integrations\.yolov5\.patch"):
        import yolo_det.integrations.patch_yolov5 as old
    assert (old.plan, old.apply_plan) == (plan, apply_plan)


def test_short_has_one_home() -> None:
    from yolo_det.core.untrusted import safe_yaml

    assert not hasattr(safe_yaml, "short")  # its 0.4.0 name is gone: yolo_det.core.text.short
    homes = {name for name, path in MODULES.items() if "def short(" in path.read_text(encoding="utf-8")}
    assert homes == {"yolo_det.core.text"}


# -- Ultralytics internals: one module ----------------------------------------------------------------------
#: The one module that imports Ultralytics internals (everything but the public ``from ultralytics import ...``).
COMPAT = "yolo_det.core.compat"


def _ultralytics_internals(name: str) -> list[str]:
    """``module:line target`` for each import of an Ultralytics internal in ``name`` (any level, any scope)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            targets = [node.module or ""]
        else:
            continue
        found += [f"{name}:{node.lineno} {t}" for t in targets if t.startswith("ultralytics.")]
    return found


def test_only_the_compat_module_imports_ultralytics_internals() -> None:
    wrong = [hit for name in MODULES if name != COMPAT for hit in _ultralytics_internals(name)]
    assert wrong == []
    assert _ultralytics_internals(COMPAT) == []  # it imports them by name, lazily


def test_the_internals_check_sees_an_internal_import(tmp_path, monkeypatch) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ultralytics.nn import tasks\n    from ultralytics import YOLO\n")
    monkeypatch.setitem(MODULES, "yolo_det.tools.probe", probe)
    assert _ultralytics_internals("yolo_det.tools.probe") == ["yolo_det.tools.probe:2 ultralytics.nn"]


#: The framework-agnostic layers: they know no framework, so they never import ``core/compat``; a framework's
#: knowledge lives in its integration (``integrations/ultralytics/``, ``integrations/yolov5/``).
AGNOSTIC = ("core", "layers", "fixes", "session")
#: The only modules of those layers that may import ``core/compat``, each with why (the one place that says so).
COMPAT_USERS = {
    # Ultralytics' logger is silenced while yolo-det builds models for the audit and the prechecks
    "yolo_det.core.quiet": "Ultralytics' LOGGER",
    # the allow-list of a checkpoint reader names Ultralytics' argument namespace class by its module path
    "yolo_det.core.untrusted.unpickle": "IterableSimpleNamespace in the unpickling allow-list",
    # model-YAML names resolve in Ultralytics' tasks namespace; registering one is writing there
    "yolo_det.layers.registry": "the model-YAML namespace (tasks)",
    # rewriting a model YAML checks its modules against, and guesses its task with, Ultralytics' tasks
    "yolo_det.fixes.yaml_rewrite": "tasks and guess_model_task for model YAMLs",
}


def test_the_framework_agnostic_layers_import_compat_only_where_listed() -> None:
    users = {
        name
        for name, targets in GRAPH.items()
        if name != COMPAT and _layer(name) < TOP and LAYERS[_layer(name)] in AGNOSTIC and COMPAT in targets
    }
    assert users <= set(COMPAT_USERS)
    # the session and batch invariance in particular: an integration registers what only it knows
    assert not any(name.startswith("yolo_det.session") for name in users)


# -- one home per helper -------------------------------------------------------------------------------------
#: ``what -> modules allowed to define or call it``.
ONE_HOME = {
    "def file_sha256": {"yolo_det.core.fileio"},
    "def plain_value": {"yolo_det.core.plain"},
    "tempfile.mkstemp(": {
        "yolo_det.core.fileio",
        # stages every patched file first, then renames them all (and probes writability)
        "yolo_det.integrations.yolov5.writer",
    },
    "os.replace(": {
        "yolo_det.core.fileio",
        "yolo_det.integrations.yolov5.writer",
        # renames of a file already written, never a write: the previous resume state kept beside
        # the new one, a weights file cut short set aside as FILE.incomplete
        "yolo_det.integrations.ultralytics.resume",
        "yolo_det.core.partial",
    },
}


@pytest.mark.parametrize("what", sorted(ONE_HOME))
def test_one_home_per_helper(what: str) -> None:
    homes = {name for name, path in MODULES.items() if what in path.read_text(encoding="utf-8")}
    assert homes <= ONE_HOME[what]
    assert homes


# -- rooms of one concern ------------------------------------------------------------------------------------
#: Longest a module may be without a reason, written at the top of its docstring in a line "Length: ...".
MAX_LINES = 450
#: How many lines of its docstring the reason may come after (the summary, a blank line, a long summary).
REASON_WITHIN = 6


def _long_without_reason(modules: dict[str, Path]) -> list[str]:
    """``module (N lines)`` for each module over :data:`MAX_LINES` lines whose docstring gives no length reason."""
    found = []
    for name, path in sorted(modules.items()):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text, filename=str(path))) or ""
        head = doc.splitlines()[:REASON_WITHIN]
        if not any(line.startswith("Length: ") and len(line.split()) > 3 for line in head):
            found.append(f"{name} ({lines} lines)")
    return found


def test_a_long_module_says_at_its_top_why_it_is_one_file() -> None:
    assert _long_without_reason(MODULES) == []


def test_the_length_check_sees_a_long_module_without_a_reason(tmp_path) -> None:
    body = "x = 1\n" * MAX_LINES
    files = {
        "long": '"""A module."""\n' + body,
        "reason_too_low": '"""A module.\n\n'
        + "more\n" * REASON_WITHIN
        + 'Length: one concern, kept whole.\n"""\n'
        + body,
        "reason": '"""A module.\n\nLength: one concern, kept whole.\n"""\n' + body,
        "short": '"""A module."""\n' + "x = 1\n" * (MAX_LINES - 1),
    }
    modules = {}
    for name, text in files.items():
        modules[name] = tmp_path / f"{name}.py"
        modules[name].write_text(text, encoding="utf-8")
    assert _long_without_reason(modules) == [
        f"long ({MAX_LINES + 1} lines)",
        f"reason_too_low ({MAX_LINES + 10} lines)",
    ]


# -- the contributor map -------------------------------------------------------------------------------------
def test_every_file_the_feature_table_names_exists() -> None:
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = doc.split("## Where each feature lives", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| feature")]
    assert {"profiles", "swaps", "audit", "resume", "deploy", "data invariance", "DDP", "records"} <= {
        row.split("|")[1].strip() for row in rows
    }
    named = [p for row in rows for p in re.findall(r"`([\w/*.]+(?:\.py|\.yaml|\.diff|/))`", row)]
    assert len(named) > 40  # control: the pattern reads the table's paths
    missing = [p for p in named if not list(PACKAGE.glob(p)) and not list(PACKAGE.parent.glob(p))]
    assert missing == []
