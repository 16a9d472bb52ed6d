"""observers_core: quantization observers as pure array-API functions.

The core imports no framework: every function takes arrays from any array-API namespace (numpy,
array_api_strict, torch, jax, cupy) and returns arrays of the same namespace. Stateful, framework
-specific observers live in ``observers_core.adapters.{torch,jax,cupy}``.
"""

from ._collective import Collective, reduce_range
from ._dtypes import QUANT_DTYPES, QScheme, QuantSpec, calculate_qmin_qmax, quant_spec, validate_qmin_qmax
from ._minmax import (
    MinMaxState,
    aminmax,
    minmax_init,
    minmax_merge,
    minmax_qparams,
    minmax_update,
    moving_average_init,
    moving_average_merge,
    moving_average_qparams,
    moving_average_update,
)
from ._qparams import QParams, calculate_qparams
from ._quantize import fake_quantize
from ._version import __version__
from . import _calibration, _histogram, _l2_search, _lowbit
from ._calibration import *  # noqa: F401,F403  (each module lists its public names in __all__)
from ._histogram import *  # noqa: F401,F403
from ._l2_search import *  # noqa: F401,F403
from ._lowbit import *  # noqa: F401,F403

__all__ = [
    "QUANT_DTYPES",
    "Collective",
    "MinMaxState",
    "QParams",
    "QScheme",
    "QuantSpec",
    "__version__",
    "aminmax",
    "calculate_qmin_qmax",
    "calculate_qparams",
    "fake_quantize",
    "minmax_init",
    "minmax_merge",
    "minmax_qparams",
    "minmax_update",
    "moving_average_init",
    "moving_average_merge",
    "moving_average_qparams",
    "moving_average_update",
    "quant_spec",
    "reduce_range",
    "validate_qmin_qmax",
]
__all__ += _histogram.__all__ + _l2_search.__all__ + _calibration.__all__ + _lowbit.__all__

