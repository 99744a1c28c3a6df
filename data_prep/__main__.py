"""``python -m data_prep`` is the same as the ``diva-prep`` console script."""

from data_prep.cli import main

raise SystemExit(main())
