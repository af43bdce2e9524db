"""Check that an image's detections do not depend on its batch, or compare two export records.

Every image of IMAGES (a folder) is predicted alone, then in batches of 2..N and next to images of
other sizes; its detections after NMS (boxes, scores, classes) and the raw network outputs are compared
with those alone. With --data, `val` runs at each --val-batches value and the metrics are compared.
The model runs under --profile (default repro, whose deploy phase is batch_invariant); run it with
--profile balanced to see the plain path. Each comparison is bitwise, within tolerance (--atol) or
differs; the last line is the verdict.

--compare A B compares two export records (written next to an exported model by `export()` under
yolo-det): the export and weights digests, the profile's deploy settings, the parity numbers.

Exit 0 when bitwise or within tolerance (records: the same), 1 when something differs, 2 on bad input,
3 when nothing was compared (no detection on any image: lower --conf; every val metric 0).

examples:
  yolo-det check-deploy runs/detect/train/weights/best.pt images/ --imgsz 320
  yolo-det check-deploy best.pt images/ --profile balanced --data data.yaml --json deploy.json --plot deploy.png
  yolo-det check-deploy --compare a/best.onnx.determinism.json b/best.onnx.determinism.json
"""

from __future__ import annotations

import argparse

from ..core.errors import ConfigError
from ..core.fileio import atomic_write_json, check_output_path
from ..core.untrusted.container import trusted_checkpoints
from . import add_trust_flag


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 2,4,8, got '{text}'") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers of at least 1, got '{text}'")
    return values


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``check-deploy`` arguments."""
    parser.add_argument("weights", metavar="WEIGHTS", nargs="?", help="trained checkpoint (.pt)")
    parser.add_argument("images", metavar="IMAGES", nargs="?", help="folder of images")
    parser.add_argument("--profile", default="repro", help="profile the predictions run under (default: repro)")
    parser.add_argument("--imgsz", type=int, default=640, help="imgsz of predict and val (default: 640)")
    parser.add_argument("--batches", type=_ints, default=[2, 4, 8], help="predict batch= values (default: 2,4,8)")
    parser.add_argument("--no-mixed", action="store_true", help="do not predict images next to other sizes")
    parser.add_argument("--data", help="data YAML: compare val metrics at --val-batches")
    parser.add_argument("--val-batches", type=_ints, default=[1, 4, 16], help="val batch= values (default: 1,4,16)")
    parser.add_argument("--conf", type=float, default=0.25, help="confidence threshold (default: 0.25)")
    parser.add_argument("--atol", type=float, default=1e-4, help="tolerance in pixels and score (default: 1e-4)")
    parser.add_argument("--device", default="cpu", help="device (default: cpu)")
    parser.add_argument("--max-images", type=int, default=16, help="at most this many images (default: 16)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a chart (PNG)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two export records instead")
    add_trust_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det check-deploy``: 0 bitwise or within tolerance, 1 differs."""
    json_path = check_output_path(args.json, suffix=".json", what="--json file")
    if args.compare:
        from ..tools.deploy.records import compare_record_files

        if args.weights or args.images or args.plot:
            raise ConfigError("--compare A B takes no WEIGHTS, IMAGES or --plot; give two export records")
        comparison = compare_record_files(*args.compare)
        print(comparison.summary())
        if json_path is not None:
            atomic_write_json(json_path, comparison.to_dict())
        return comparison.exit_code
    if not args.weights or not args.images:
        raise ConfigError("check-deploy needs WEIGHTS and IMAGES (or --compare A B); see yolo-det check-deploy -h")
    plot_path = check_output_path(args.plot, suffix=".png", what="--plot file")
    if args.data is not None:
        from ..tools.prechecks import check_data

        check_data(args.data)
    from ..tools.deploy.check import check_deploy

    with trusted_checkpoints(args.trust_checkpoint):
        report = check_deploy(
            args.weights,
            args.images,
            profile=args.profile,
            imgsz=args.imgsz,
            batches=args.batches,
            mixed=not args.no_mixed,
            data=args.data,
            val_batches=args.val_batches,
            conf=args.conf,
            atol=args.atol,
            device=args.device,
            max_images=args.max_images,
        )
    print(report.summary())
    if json_path is not None:
        atomic_write_json(json_path, report.to_dict())
        print(f"report: {json_path}")
    if plot_path is not None:
        from ..tools.deploy.plot import save_deploy_plot

        save_deploy_plot(report, plot_path)
        print(f"chart: {plot_path}")
    return report.exit_code
