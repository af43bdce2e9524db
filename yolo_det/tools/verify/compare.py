"""Comparing recorded runs step by step and naming the first divergence."""

from __future__ import annotations

from .recorder import _max_abs_diff
from .records import Divergence, RunRecord, StepRecord, _json_float, _same_float

__all__ = ["compare_runs"]


def _loss_bits_differ(a: tuple[float, ...] | None, b: tuple[float, ...] | None) -> bool:
    if a is None or b is None:
        return (a is None) != (b is None)
    return len(a) != len(b) or any(not _same_float(x, y) for x, y in zip(a, b))


def compare_runs(reference: RunRecord, run: RunRecord) -> Divergence | None:
    """Return where ``run`` first differs from ``reference``, or None when they are bitwise identical."""
    names = reference.param_names
    for i, (ref, cur) in enumerate(zip(reference.steps, run.steps)):
        data_differs = len(ref.batches) != len(cur.batches) or any(
            a.data != b.data for a, b in zip(ref.batches, cur.batches)
        )
        loss_differs = len(ref.batches) != len(cur.batches) or any(
            _loss_bits_differ(a.loss, b.loss) for a, b in zip(ref.batches, cur.batches)
        )
        differing = [n for n, a, b in zip(names, ref.grads, cur.grads) if a != b]
        grads_differ = bool(differing) or ref.grads != cur.grads
        if not (data_differs or loss_differs or grads_differ):
            continue
        div = Divergence(
            run=run.index,
            step=i + 1,
            epoch=cur.epoch,
            kind="",
            detail="",
            data_differs=data_differs,
            loss_differs=loss_differs,
            gradients_differ=grads_differ,
            parameters_differing=len(differing),
            parameters_total=len(names),
        )
        if data_differs:
            div.kind = "data"
            pair = next(((a, b) for a, b in zip(ref.batches, cur.batches) if a.data != b.data), None)
            if pair is not None and pair[0].files != pair[1].files:
                div.files = [list(pair[0].files), list(pair[1].files)]
                div.detail = "data order: the runs fed different images at this step"
            elif pair is not None:
                div.detail = "data content: same images, different pixels or labels (augmentation randomness)"
            else:
                div.detail = "data: the runs accumulated a different number of batches into this step"
        elif loss_differs:
            div.kind = "loss"
            div.detail = "loss: same input, different forward result"
        else:
            div.kind = "gradients"
            div.detail = "gradients: same input and loss, different backward result"
        for a, b in zip(ref.batches, cur.batches):
            if _loss_bits_differ(a.loss, b.loss) and a.loss is not None and b.loss is not None:
                loss_names = reference.loss_names or [f"loss{j}" for j in range(len(a.loss))]
                div.loss_components = {
                    n: [x, y] for n, x, y in zip(loss_names, a.loss, b.loss) if not _same_float(x, y)
                }
                break
        _magnitude(div, reference, run, ref, cur, differing)
        return div
    if len(reference.steps) != len(run.steps):
        n = min(len(reference.steps), len(run.steps))
        return Divergence(
            run=run.index,
            step=n + 1,
            epoch=None,
            kind="steps",
            detail=f"steps: run 1 made {len(reference.steps)} optimizer steps, run {run.index} made {len(run.steps)}",
        )
    if reference.weights != run.weights or run.final_diff:
        last = run.steps[-1] if run.steps else None
        div = Divergence(
            run=run.index,
            step=last.step if last else 0,
            epoch=last.epoch if last else None,
            kind="weights",
            detail="weights: every step's data, loss and gradients match but the final "
            "weights differ (optimizer, EMA or buffers)",
        )
        if run.final_diff:
            div.parameter, div.max_abs_diff = run.final_diff[0]
            div.parameters_differing = len(run.final_diff)
            div.parameters_total = len(reference.final_state or {})
            div.top = [{"parameter": k, "max_abs_diff": _json_float(v)} for k, v in run.final_diff[:5]]
            ref_value = (reference.final_state or {}).get(div.parameter)
            if ref_value is not None and ref_value.numel() and ref_value.is_floating_point():
                div.reference_abs_max = float(ref_value.abs().max())
        elif reference.weights.get("model") == run.weights.get("model"):
            div.detail = "weights: the model weights match but the EMA weights differ"
        return div
    return None


def _magnitude(
    div: Divergence, reference: RunRecord, run: RunRecord, ref: StepRecord, cur: StepRecord, differing: list[str]
) -> None:
    ref_values = reference.kept.get(ref.step)
    cur_values = run.kept.get(cur.step)
    if not differing:
        div.note = "the gradients of this step are identical"
        return
    if ref_values is None or cur_values is None:
        div.parameter = differing[0]
        div.note = (
            f"gradient values were kept for the first {reference.kept_until} step(s) only; "
            f"raise --keep-mib or lower --steps to measure the difference at step {ref.step}"
        )
        return
    sizes = []
    for name in differing:
        a, b = ref_values.get(name), cur_values.get(name)
        if a is None or b is None:
            continue
        diff = _max_abs_diff(a / ref.scale, b / cur.scale) if a.is_floating_point() else _max_abs_diff(a, b)
        sizes.append((name, diff, float((a / ref.scale).abs().max()) if a.numel() else 0.0))
    if not sizes:
        div.parameter = differing[0]
        div.note = "gradient values were not kept for this step"
        return
    sizes.sort(key=lambda t: -t[1])
    div.parameter, div.max_abs_diff, div.reference_abs_max = sizes[0]
    div.top = [{"parameter": n, "max_abs_diff": _json_float(d)} for n, d, _ in sizes[:5]]
