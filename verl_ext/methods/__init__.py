"""The toolkit's advantage methods, one module each, registered on import (see :mod:`verl_ext.methods.base`).

``verl_ext.plugin`` imports this package in every process, so ``algorithm.adv_estimator=<name>`` resolves in
verl's registry and :func:`get_method` finds the toolkit's description of the method.
"""

from verl_ext.methods import avspo, codapo, diva, durian, mupo, pgpo  # noqa: F401  (each registers itself)
from verl_ext.methods.base import (
    METHODS,
    AdvantageInputs,
    AdvantageMethod,
    AdvantageResult,
    get_method,
    register_method,
)

__all__ = ["METHODS", "AdvantageInputs", "AdvantageMethod", "AdvantageResult", "get_method", "register_method"]
