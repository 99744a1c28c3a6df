"""The toolkit's advantage methods, one module each, registered on import (see :mod:`verl_ext.methods.base`).

``verl_ext.plugin`` registers every name of :data:`verl_ext.method_names.TOOLKIT_METHODS` with verl in every process
(without importing these modules); importing this package imports each method's module, so that
:func:`get_method` finds the toolkit's description of the method.
"""

import importlib

from verl_ext.method_names import TOOLKIT_METHODS
from verl_ext.methods import diva, grpo  # noqa: F401  (register diva_grpo, and verl's grpo on the toolkit trainer)
from verl_ext.methods.base import (
    METHODS,
    AdvantageInputs,
    AdvantageMethod,
    AdvantageResult,
    get_method,
    register_method,
)

for _name in TOOLKIT_METHODS:
    importlib.import_module(f"verl_ext.methods.{_name}")

__all__ = ["METHODS", "AdvantageInputs", "AdvantageMethod", "AdvantageResult", "get_method", "register_method"]
