"""DIVA-GRPO for verl: difficulty-adaptive variant advantage (ICLR 2026, arXiv 2603.01106).

Importing this package has no side effects. Registration with verl's registries lives in
:mod:`verl_ext.plugin`, which verl loads through the ``verl.plugins`` entry point.
"""

__version__ = "0.1.0"
