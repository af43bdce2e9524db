"""Ultralytics integration: profiles applied per phase through Ultralytics' own callbacks.

Three ways in, from simplest:

- ``yolo_det.attach(model, "repro")`` on an ``ultralytics.YOLO`` registers the callbacks (idempotent)
  and guards ``model.train/val/predict/export`` so the process state is restored even when a call fails.
- ``model.train(trainer=yolo_det.trainer_class("repro"))``: a trainer class (the trainer of the model's
  task by default; any ``BaseTrainer`` subclass can be the base) that snapshots the state before
  Ultralytics' ``init_seeds`` and restores it after.
- ``Trainer(overrides=..., _callbacks=UltralyticsPlugin(profile).register(callbacks.get_default_callbacks()))``
  for a trainer you build yourself: the callbacks must be there when the trainer is built (Ultralytics runs
  ``on_pretrain_routine_start`` in its constructor). Registering on a trainer that already exists is refused
  when training starts (its initial weights would differ from the other routes').

Phase boundaries: ``train`` from ``on_pretrain_routine_start`` (right after ``init_seeds``) until
``teardown`` (which Ultralytics runs in ``train()``'s ``finally``, after its own ``unset_deterministic``);
``val`` between ``on_val_start`` and ``on_val_end`` (inside training and in ``model.val()``); ``deploy``
between ``on_predict_start``/``on_predict_end`` and ``on_export_start``/``on_export_end``. The validator
(at ``on_val_start``) and the predictor (at each ``on_predict_batch_start``) are handed to the session,
which applies ``batch_invariant`` to them (:mod:`.batch_invariance`); a streaming
``predict`` is suspended each time it yields an item (the caller's loop body runs under the caller's state).

Endings (see :mod:`yolo_det.core.endings`): every training writes ``determinism.json`` however it ends
(``completed``, ``failed``, ``interrupted``, ``terminated``), with every weights file digested from disk;
SIGINT, SIGTERM and SIGHUP stop ``model.train()`` at the next batch or epoch boundary once the train phase
is entered, at once before (:mod:`yolo_det.core.signals`); the
run folder is locked against other live runs (:mod:`yolo_det.core.runlock`); one session per process
(:mod:`yolo_det.session.exclusive`).

The rooms of this package, one concern each:

- :mod:`.attach`: ``attach``/``detach`` and the guarded ``train``/``val``/``predict``/``export`` of a model;
- :mod:`.trainer`: ``trainer_class`` (the trainer of each task, extended);
- :mod:`.plugin`: :class:`UltralyticsPlugin`, its registration and its callbacks (when each phase begins/ends);
- :mod:`.runs`: the run in progress, from the baseline snapshot to its restoration;
- :mod:`.records`: ``determinism.json`` for every ending;
- :mod:`.folders`: where a resumed run writes, and the run folder's lock;
- :mod:`.deploy`: a streaming ``predict`` and ``export`` with standard modules;
- :mod:`.resume`, :mod:`.resume_state`, :mod:`.lineage`: bitwise resume (when, what, the earlier parts);
- :mod:`.data`: the record's ``data_stream`` section.
"""

from __future__ import annotations

from .attach import attach, detach
from .plugin import UltralyticsPlugin
from .trainer import trainer_class

__all__ = ["UltralyticsPlugin", "attach", "detach", "trainer_class"]
