"""The deploy phase's guarded calls that need more than a guard: a streaming ``predict`` and ``export``.

A streaming prediction runs under the deploy phase only while its generator runs: between items the run is
suspended, so the caller's loop body runs under the caller's own state (:func:`guarded_stream`). An export is
made with standard PyTorch modules (yolo-det's layers turned back for it, then put back), and compared with the
PyTorch model, its record written beside it (:func:`export_standard`, :mod:`yolo_det.integrations.export_parity`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...fixes.swaps import restore, unswap_modules
from ...session.session import note_restore_failure

if TYPE_CHECKING:
    from .plugin import UltralyticsPlugin

__all__ = ["export_standard", "guarded_stream"]


def guarded_stream(plugin: UltralyticsPlugin, gen: Iterator[Any], baseline: Any = None) -> Iterator[Any]:
    """Run a streaming prediction under the deploy phase only while the generator runs.

    Between items (while the caller's loop body runs) the session is suspended: the caller sees their
    own flags, environment, thread count and warning hooks, as they were when they called ``predict``
    (``baseline``: Ultralytics sets the thread count while it builds the generator), and changes they make
    there are what is given back at the end. Inside another run of the same plugin the stream simply runs
    under that run's phases.
    """
    if plugin.session is not None and plugin.session.active:
        yield from gen
        return
    plugin.begin_run("stream", baseline)
    try:
        while True:
            try:
                item = next(gen)
            except StopIteration:
                break
            saved = plugin._suspend()
            try:
                yield item
            finally:
                plugin._resume(saved)
    except BaseException as error:
        try:
            close = getattr(gen, "close", None)
            if callable(close):
                close()
        except BaseException as e:
            note_restore_failure(error, e)
        plugin.end_run(error)
        raise
    plugin.end_run()


def export_standard(
    plugin: UltralyticsPlugin, method: Callable[..., Any], owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Export with standard PyTorch modules (yolo-det layers turned back), then put them back; then, when the
    plugin keeps records, compare the export with the PyTorch model and write the export record beside it
    (:mod:`yolo_det.integrations.export_parity`)."""
    net = owner.model
    with plugin.guard() as session:
        records = unswap_modules(net) if isinstance(net, torch.nn.Module) else []
        try:
            result = method(*args, **kwargs)
        finally:
            if records and isinstance(net, torch.nn.Module):
                restore(net, records)
        if plugin.record and result and Path(str(result)).exists():
            from ..export_parity import write_export_record

            with session.phase_scope("deploy"):
                plugin.export_record_path = write_export_record(owner, str(result), profile=plugin.profile)
    return result
