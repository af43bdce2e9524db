"""List the built-in determinism profiles, or show one resolved.

examples:
  yolo-det profiles
  yolo-det profiles show repro
  yolo-det profiles show my-profile.yaml --json
"""

from __future__ import annotations

import argparse
import json
import textwrap

from ..core.errors import ConfigError
from ..core.profiles import BUILTIN_PROFILES, PHASES, load_profile

_SUMMARY_KEYS = ("deterministic_algorithms", "backward", "cudnn_benchmark", "swaps")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``profiles`` arguments."""
    parser.add_argument("action", nargs="?", choices=["list", "show"], default="list", help="list (default) or show")
    parser.add_argument("name", nargs="?", metavar="NAME|FILE", help="profile to show")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det profiles``."""
    if args.action == "show":
        if not args.name:
            raise ConfigError("'profiles show' needs a profile name or file, e.g. 'yolo-det profiles show repro'")
        profile = load_profile(args.name)
        if args.json:
            print(json.dumps(profile.to_dict(), indent=2))
        else:
            print(profile.to_yaml(), end="")
        return 0
    if args.name:
        raise ConfigError(f"unexpected argument '{args.name}'; did you mean 'yolo-det profiles show {args.name}'?")
    profiles = [load_profile(n) for n in BUILTIN_PROFILES]
    if args.json:
        print(json.dumps({p.name: p.to_dict() for p in profiles}, indent=2))
        return 0
    for p in profiles:
        print(p.name)
        for phase in PHASES:
            s = p.phase(phase)
            print(f"  {phase:<7}" + "  ".join(f"{k}={getattr(s, k)}" for k in _SUMMARY_KEYS))
        print(textwrap.fill(p.description, width=100, initial_indent="  ", subsequent_indent="  "))
        print()
    print("Show one in full with 'yolo-det profiles show NAME'; pass a YAML file of the same shape to --profile.")
    return 0
