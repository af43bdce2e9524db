"""Readers of files from others (checkpoints, YAMLs): allow-lists, one reading of each container, bounded work.

- :mod:`.container`: a checkpoint's zip archive, refused when it could be read two ways, sizes bounded;
- :mod:`.allow`: what a checkpoint's pickle may name;
- :mod:`.unpickle`: the one unpickler (allow-list, no calls of model classes, bounded tensors);
- :mod:`.safeload`: weights, stored model YAMLs and whole objects read through it, and the ``torch.load`` guard;
- :mod:`.safe_yaml`: bounded YAML (nesting, aliases, numbers).

See ``docs/security.md``.
"""
