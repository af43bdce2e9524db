"""Say which layer of a model will break strict determinism on CUDA, on any machine.

MODEL is a model YAML (a path, an Ultralytics name such as yolov8n.yaml, or a yolo-det example such as
cbam-max.yaml), a checkpoint (.pt), or a factory package.module:function returning an nn.Module. A YAML
may name yolo-det's layers (what `yolo-det rewrite` writes), its example blocks, and the classes of the
modules given with --import MODULE (repeatable; names your process already binds are never replaced).
The forward and backward run on a fake CUDA
device (no GPU needed, no memory used), with deterministic algorithms set as the profile's train phase
sets them at forward time; each op is attributed to its module and YAML layer and matched against
yolo-det's table of non-deterministic CUDA kernels for the installed torch (or --torch-version).

Each finding gives the layer index, YAML line, module, class, kernel, pass, what happens under strict /
warn_only / off, under the chosen profile, and the fix (a deterministic swap when one exists).

Several models are audited in one process (the imports and the fake-tensor set-up are paid once): the
reports are printed one after the other (--json: a list of reports, in the order given), and nothing is
printed unless every model could be audited.

A checkpoint is not unpickled: its model is rebuilt from the model YAML Ultralytics stores in it (with its
weights), so nothing in the file runs, and a file whose pickle names what no checkpoint needs (os.system,
builtins.exec, ...) is refused. A model YAML's 'activation:' must be a torch.nn activation call with literal
arguments (nn.SiLU(), nn.LeakyReLU(0.1)): Ultralytics eval()s it. --trust-checkpoint unpickles the checkpoint
with torch instead (needed when it stores no YAML, or names your own block classes): only for files you trust.

exit status: 0 the model(s) train under strict determinism, 1 one of them does not, 2 bad input.
With --fail-on unhandled, only findings that the --profile neither swaps nor intercepts count (a CBAM's
adaptive max pool under repro is swapped, so it passes; under balanced it fails).

In CI: --junit FILE.xml writes JUnit XML (one test case per model, and one per failing finding with its
YAML line); --annotations github prints ::error file=...,line=...:: lines for GitHub Actions. --hook is the
pre-commit mode (see .pre-commit-hooks.yaml and docs/ci.md): MODEL are the changed files; files that are
not model YAMLs (data YAMLs, profiles, deleted files) are skipped, and each failing finding is printed as
FILE:LINE: layer, class, kernel and fix.

--fix -o OUT.yaml (model YAMLs): write a copy of the YAML whose non-deterministic layers are yolo-det's
deterministic ones (see `yolo-det rewrite`), audit the copy, and say for each finding whether it is fixed
in the copy or remains there, and why: a YAML cannot name a pool inside your own block or a functional
call; the repro profile's swaps or interception handle those at training time, or nothing does. The exit
status is that of auditing the copy: 0 when it is clean, 1 when some finding remains in it.

examples:
  yolo-det audit yolov8n.yaml
  yolo-det audit yolov8n.yaml yolo11n.yaml rtdetr-l.yaml --imgsz 320  # several models, one process
  yolo-det audit cbam-max.yaml --imgsz 64                   # an example shipped with yolo-det
  yolo-det audit --import mypkg.blocks my-model.yaml --imgsz 64
  yolo-det audit runs/detect/train/weights/last.pt --json > audit.json
  yolo-det audit my_package.models:build_model --imgsz 320
  yolo-det audit rtdetr-l.yaml --torch-version 2.0.1        # what would torch 2.0 do?
  yolo-det audit my-model.yaml --device cuda                # also run the real kernels (needs a GPU)
  yolo-det audit yolov8n-seg.yaml --imgsz 64 --loss         # include the training loss (real CPU step)
  yolo-det audit bicubic-up.yaml --imgsz 64 --fix -o bicubic-det.yaml
  yolo-det audit models/*.yaml --profile repro --fail-on unhandled --junit audit.xml --annotations github
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from ..core.text import printable
from ..core.untrusted.container import TRUST_FLAG, trusted_checkpoints
from . import add_ci_options, add_import_option, check_ci_options, emit_ci


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``audit`` arguments."""
    parser.add_argument(
        "model",
        metavar="MODEL",
        nargs="+",
        help="model YAML (path or Ultralytics name), checkpoint, or package.module:function; "
        "several are audited in one process",
    )
    parser.add_argument(
        "--imgsz",
        type=_positive_int,
        default=640,
        metavar="N",
        help="square input size, a multiple of the model stride (default: 640)",
    )
    parser.add_argument(
        "--batch", type=_positive_int, default=2, metavar="N", help="batch size of the trace (default: 2)"
    )
    parser.add_argument(
        "--profile",
        default="repro",
        metavar="NAME|FILE",
        help="profile whose train phase sets the flag at forward time (default: repro)",
    )
    add_import_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--device",
        default="fake",
        metavar="fake|cuda[:N]",
        help="fake (default, any machine) or cuda to also run the real kernels under strict mode",
    )
    parser.add_argument("--torch-version", default=None, metavar="X.Y", help="read the table for another torch version")
    parser.add_argument(
        "--table", default=None, metavar="FILE", help="a table of non-deterministic kernels (default: built-in)"
    )
    parser.add_argument(
        "--loss",
        action="store_true",
        help="also run one real CPU training step with the model's loss on a synthetic batch (slower)",
    )
    parser.add_argument(
        "--fix",
        action="store_true",
        help="write a rewritten copy of the model YAML with deterministic layers (needs -o)",
    )
    parser.add_argument("-o", "--output", metavar="OUT.yaml", help="where --fix writes (must not exist)")
    parser.add_argument("--force", action="store_true", help="with --fix: replace OUT.yaml if it exists")
    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="unpickle a .pt with torch (runs code the file names: only for files you trust)",
    )
    parser.add_argument(
        "--fail-on",
        choices=("any", "unhandled"),
        default="any",
        help="any (default): exit 1 on every finding that breaks strict determinism; unhandled: "
        "only on findings the --profile neither swaps nor intercepts",
    )
    parser.add_argument(
        "--hook",
        action="store_true",
        help="pre-commit mode: skip files that are not model YAMLs, print FILE:LINE per finding",
    )
    add_ci_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det audit``; return 0 (deterministic), 1 (not) or raise a one-line error (exit 2)."""
    from ..analysis.audit import audit
    from ..tools.ci_report import audit_suite, failing_findings

    if args.device != "fake" and not (args.device == "cuda" or args.device.startswith("cuda:")):
        raise ConfigError(f"--device must be fake or cuda[:N], got {args.device!r}")
    if args.output and not args.fix:
        raise ConfigError("-o is the output of --fix; add --fix (or use 'yolo-det rewrite')")
    models = list(args.model) if isinstance(args.model, (list, tuple)) else [args.model]
    check_ci_options(args)
    if args.hook:
        if args.fix:
            raise ConfigError("--hook audits the changed files; it does not take --fix")
        models, _other = split_model_yamls(models)
        if not models:
            return 0
    if args.fix:
        if len(models) != 1:
            raise ConfigError(f"--fix rewrites one model YAML, got {len(models)} models; run it once per model")
        args.model = models[0]
        return _fix(args)
    # every model is audited before anything is printed: a bad one is a one-line error with no partial output
    started = time.perf_counter()
    with trusted_checkpoints(args.trust_checkpoint):
        reports = [
            audit(
                model,
                imgsz=args.imgsz,
                batch=args.batch,
                profile=args.profile,
                device=args.device,
                torch_version=args.torch_version,
                table=args.table,
                loss=args.loss,
                modules=args.imports,
            )
            for model in models
        ]
    suite = audit_suite(reports, fail_on=args.fail_on, seconds=time.perf_counter() - started)
    failing = {id(r): failing_findings(r, args.fail_on) for r in reports}
    if args.hook:
        _print_hook(reports, failing, args)
        emit_ci(args, [suite])
        return 1 if any(failing.values()) else 0
    if args.json:
        data = reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports]
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for k, report in enumerate(reports):
            if len(reports) > 1:
                print(printable(("\n" if k else "") + f"== {models[k]} ({k + 1}/{len(reports)}) =="))
            print(printable(report.format_table()))
    emit_ci(args, [suite])
    return 1 if any(failing.values()) else 0


def split_model_yamls(paths: list[str]) -> tuple[list[str], list[str]]:
    """``(model YAMLs, other files)`` of a pre-commit file list: a model YAML is a YAML mapping with a
    ``backbone`` or ``head``; data YAMLs, profiles, other files and files that no longer exist are skipped."""
    from ..core.untrusted import safe_yaml

    models: list[str] = []
    other: list[str] = []
    for name in paths:
        p = Path(name)
        keep = False
        if p.suffix.lower() in (".yaml", ".yml") and p.is_file():
            try:
                data = safe_yaml.load(p.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                data = None  # not this hook's concern: a YAML checker reports it
            keep = isinstance(data, dict) and ("backbone" in data or "head" in data)
        (models if keep else other).append(name)
    return models, other


def _print_hook(reports: list[Any], failing: dict[int, list[Any]], args: argparse.Namespace) -> None:
    """The pre-commit output: one ``FILE:LINE: ...`` line per failing finding, then a verdict per file."""
    from ..tools.ci_report import report_file

    for report in reports:
        bad = failing[id(report)]
        where = report_file(report) or report.model
        for f in bad:
            line = f":{f.yaml_line}" if f.yaml_line else ""
            layer = "-" if f.layer is None else str(f.layer)
            print(
                printable(
                    f"{where}{line}: layer {layer} {f.layer_class or f.module_class} ({f.module or 'model'}) "
                    f"reaches "
                    f"{f.kernel} ({f.pass_}): {f.behaviour['strict']} under strict determinism; "
                    f"under {report.profile}: {f.under_profile}; fix: {f.fix}",
                    newlines=False,
                )
            )
        if bad:
            print(
                printable(f"{where}: {len(bad)} finding(s) fail (--fail-on {args.fail_on}, profile {report.profile})")
            )


def _fix(args: argparse.Namespace) -> int:
    """``audit --fix``: rewrite the YAML and say how every other finding is handled."""
    from ..analysis.audit import audit
    from ..analysis.models import resolve_model_yaml
    from ..fixes.swaps import remedy
    from ..fixes.yaml_rewrite import rewrite_yaml

    if not args.output:
        raise ConfigError("--fix needs -o OUT.yaml (the input is never changed)")
    yaml_path = resolve_model_yaml(args.model) if str(args.model).endswith((".yaml", ".yml")) else None
    if yaml_path is None:
        raise ConfigError(
            f"--fix rewrites model YAMLs and '{args.model}' is not one; for a checkpoint or module, "
            "train under the repro profile (its swaps and interception fix the layers in place)"
        )
    from ..analysis.names import custom_modules

    options = {"imgsz": args.imgsz, "batch": args.batch, "profile": args.profile, "table": args.table}
    with custom_modules(args.imports):
        report = audit(args.model, torch_version=args.torch_version, **options)
        result = rewrite_yaml(
            yaml_path, args.output, force=args.force, imgsz=args.imgsz, torch_version=args.torch_version
        )
        after = audit(args.output, torch_version=args.torch_version, **options)
    renamed = {c.layer: c for c in result.changes}
    left = {(f.module, f.kernel) for f in after.findings if f.breaks_determinism}
    rows = []
    remaining = unfixable = 0
    for f in report.findings:
        if not f.breaks_determinism:
            continue
        change = renamed.get(f.layer) if f.layer is not None else None
        if (f.module, f.kernel) not in left:
            how = f"fixed in {args.output}" + (f" (layer {f.layer}: {change.old} -> {change.new})" if change else "")
        else:
            remaining += 1
            top_level = (f"model.{f.layer}", f"model.{f.layer}.0")
            why = (
                "inside the block: a YAML cannot name it"
                if f.module not in top_level
                else "the YAML has no deterministic name for it"
            )
            kind = remedy(f)
            if kind is None:
                unfixable += 1
                how = f"remains in {args.output} ({why}); no deterministic equivalent: {f.fix}"
            else:
                how = (
                    f"remains in {args.output} ({why}); "
                    + ("swapped" if kind == "swap" else "intercepted")
                    + " at training time by the repro profile"
                )
        rows.append({"layer": f.layer, "module": f.module, "kernel": f.kernel, "fix": how})
    if args.json:
        json.dump(
            {
                "audit": report.to_dict(),
                "rewrite": result.to_dict(),
                "output": args.output,
                "findings": rows,
                "remaining": remaining,
                "unfixed": unfixable,
                "output_audit": after.to_dict(),
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        print(printable(report.format_table()))
        print(printable(result.format(str(yaml_path))))
        print(
            printable(
                f"wrote {args.output}" + ("" if result.changed else " (an unchanged copy: no layer could be renamed)")
            )
        )
        for row in rows:
            print(printable(f"layer {row['layer']} {row['module']} ({row['kernel']}): {row['fix']}"))
        if not remaining:
            print(printable(f"verdict: {args.output} audits clean: every finding is fixed in it"))
        else:
            handled = remaining - unfixable
            parts = [f"{remaining} finding(s) remain in {args.output}"]
            if handled:
                parts.append(f"{handled} handled at training time by --profile repro (swap or interception)")
            if unfixable:
                parts.append(f"{unfixable} with no deterministic equivalent")
            print(printable("verdict: " + "; ".join(parts)))
    return 0 if after.ok else 1
