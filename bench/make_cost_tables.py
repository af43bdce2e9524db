"""Write the generated tables of docs/cost.md from the bench results in bench/results.

Each table sits between ``<!-- generated from bench/results/NAME.json -->`` and ``<!-- end generated -->``
in docs/cost.md and is rewritten from that JSON file: a ``yolo-det bench --json`` result, or the ``table`` a bench
script stores in its JSON (``bench/bench_accuracy.py``). Run it after a new benchmark; ``--check`` exits 1
(writing nothing) when the page does not match the results.

    python bench/make_cost_tables.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cost.md"
RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(
    r"(<!-- generated from bench/results/(?P<name>[\w.-]+\.json) -->\n)(?P<body>.*?)"
    r"(<!-- end generated -->)",
    re.S,
)


def _number(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def profile_table(result: dict) -> str:
    """The markdown table of one ``yolo-det bench`` result: one row per profile."""
    memory = "peak RSS" if result["device"] == "cpu" else "peak memory (`max_memory_allocated`)"
    lines = [f"| profile (train phase) | median step | images/s | {memory} | vs fastest |", "|---|---|---|---|---|"]
    for row in result["rows"]:
        mib = row["peak_memory_bytes"] / 2**20
        lines.append(
            f"| {row['profile']} | {_number(row['step_ms'])} ms | {_number(row['images_per_s'])} | "
            f"{mib:.0f} MiB | {row['time_ratio']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """``page`` with every generated block rewritten from its JSON file."""

    def block(m: re.Match[str]) -> str:
        result = json.loads((RESULTS / m.group("name")).read_text(encoding="utf-8"))
        table = result["table"] + "\n" if "table" in result else profile_table(result)
        return m.group(1) + table + m.group(4)

    return BLOCK.sub(block, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cost.md is out of date")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from yolo_det.core.fileio import atomic_write_text

    page = PAGE.read_text(encoding="utf-8")
    new = render(page)
    if args.check:
        if new != page:
            print(f"{PAGE} is out of date: run python bench/make_cost_tables.py", file=sys.stderr)
            return 1
        return 0
    if new != page:
        atomic_write_text(PAGE, new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
