"""Channel declarations for the user's own blocks, and model-build errors that name the layer.

Ultralytics' ``parse_model`` knows the channel rules of its own modules only: a block it does not know
gets the YAML arguments verbatim and is assumed to keep the channels of its single input. A block may
declare its rule instead, with no fork of Ultralytics:

* a class attribute ``yolo_det_channels = staticmethod(rule)``, or
* :func:`declare_block` ``(cls, channels=rule)`` (for a class you cannot edit).

``rule(c_in, *args)`` receives the input channels (an ``int``; a ``list`` of ints, one per source, when the
row's ``from`` is a list) and the YAML arguments, and returns ``(c_out, args_to_pass)``: the block's output
channels and the arguments its constructor receives. For example a BiFPN-style weighted add of two maps
(``[[-1, 6], 1, BiFPN_Add2, []]``) declares ``lambda c_in: (c_in[0], [c_in[0]])``.

While a yolo-det command (or :func:`yolo_det.custom_modules`) is active, ``ultralytics.nn.tasks.parse_model``
is wrapped (:func:`declared_channels`): a model whose rows name no declared block is built by Ultralytics'
own ``parse_model`` untouched. Otherwise the wrapper learns the input channels of each declared row from
Ultralytics itself (the rows before it, built on the ``meta`` device, followed by ``nn.BatchNorm2d`` rows
that read the channels of its sources), has ``parse_model`` build the model with a parameter-free
placeholder of the declared output channels in the declared rows, and puts the user's block in each
placeholder's place with the real ``from`` (and the save list Ultralytics keeps for multi-input rows).
Nothing of Ultralytics is edited; on leaving, the original ``parse_model`` is bound again.

:func:`build_error` names the layer of any exception raised while a model is built (in ``parse_model`` or
in the first forward pass Ultralytics runs to find the strides): index, module, ``from`` and YAML line.

The package, one concern a module: :mod:`.channels` (the declarations and the ``parse_model`` wrapper),
:mod:`.portable` (the model YAML a checkpoint stores, rebuildable by plain Ultralytics), :mod:`.build_errors`
(the layer an error was raised in) and :mod:`.rows` (where a row of a model YAML is, for the messages).
"""

from __future__ import annotations

from .build_errors import build_error, naming_build_errors
from .channels import (
    ATTRIBUTE,
    ChannelRule,
    channel_rule,
    declare_block,
    declared_call,
    declared_channels,
    undeclare_block,
)
from .portable import CHECKPOINT_KEY, own_config, plain_needs, portable_config
from .rows import layer_lines

__all__ = [
    "ATTRIBUTE",
    "CHECKPOINT_KEY",
    "ChannelRule",
    "build_error",
    "channel_rule",
    "declare_block",
    "declared_call",
    "declared_channels",
    "layer_lines",
    "naming_build_errors",
    "own_config",
    "plain_needs",
    "portable_config",
    "undeclare_block",
]
