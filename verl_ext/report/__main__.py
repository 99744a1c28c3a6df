"""``python -m verl_ext.report RUN [RUN ...] --output DIR`` (same as ``diva-report``)."""

from verl_ext.report.cli import main

raise SystemExit(main())
