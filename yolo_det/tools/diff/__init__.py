"""Compare two runs' ``determinism.json`` records: every difference, the most likely cause first, and a verdict.

:func:`diff_records` lists each difference between two records with both values, grouped and ordered by
how likely it is to change the bits of the trained weights:

1. data (the dataset fingerprint of :mod:`yolo_det.core.datafp`: the first file that differs, when both records
   hold the file table; per split: image list, image contents, labels),
2. model (architecture, YAML text, the weights the first step starts from),
3. seeds, 4. profile settings per phase and the flags observed at train start, 5. Ultralytics arguments,
6. the user's code (their project's git commit and uncommitted changes), versions (torch, CUDA, cuDNN, numpy,
Ultralytics, OpenCV, ..., and every other installed package), 7. GPU model, 8. CPU model and
instruction set, 9. thread counts, 10. environment variables, 11. layer swaps,
12. non-determinism warnings seen (a symptom, not a cause), and last what cannot change the bits
(paths, the command line, the platform string).

Each difference says whether it can change the trained weights (``changes_bits``): a GPU difference
cannot when both runs trained on the CPU; the validation and deploy phases do not change ``last.pt``;
a YAML start's initial weights follow from the seed and the torch version when those differ.

The verdict is one line: "these runs should be bitwise identical and are"; "these runs should be
bitwise identical but their weights differ: non-determinism not covered by the profile (see warnings)";
"expected to differ because: ..." naming the most likely causes; or, when only versions nobody has measured
differ, that those are the likely cause though no release pair is promised either way. Records written by
older versions, without fingerprints, are compared on what they hold (data and model by path) with a note
saying so.

The package, one concern a module: :mod:`.load` reads a record, :mod:`.common` reads fields of one,
:mod:`.topics` compares them topic by topic,
:mod:`.sources` the user's code and packages, :mod:`.lineage` handles the parts of a resumed run,
:mod:`.compare` puts the comparison together and :mod:`.report` holds the report and renders it.
"""

from __future__ import annotations

from .compare import diff_paths, diff_records
from .load import VERIFY_SAVED_SCHEMA, load_record
from .report import DIFF_SCHEMA, GROUPS, Difference, DiffReport

__all__ = [
    "DIFF_SCHEMA",
    "GROUPS",
    "VERIFY_SAVED_SCHEMA",
    "Difference",
    "DiffReport",
    "diff_paths",
    "diff_records",
    "load_record",
]
