"""``diva-report``: figures and a ``report.md`` from what runs leave behind (also ``python -m verl_ext.report``).

Inputs, per run folder (:mod:`.run`): verl's metrics log (the ``file`` logger's JSONL, :mod:`.logs`) and the
difficulty states saved in its checkpoints (``global_step_N/diva_difficulty.json``, :mod:`.states`). Pure series
extraction and the steps-to-best comparison live in :mod:`.series`, the matplotlib figures (headless, Agg) in
:mod:`.figures`, their small multiples in :mod:`.panels`, the choice of the baseline run in :mod:`.baseline`, the
runs whose series coincide in :mod:`.coincide`, a seed sweep's figure in :mod:`.sweep_figures`, the markdown in
:mod:`.markdown`, the command line in :mod:`.cli`.

Importing this package imports neither matplotlib, verl, torch nor Ray.
"""
