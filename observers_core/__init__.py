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
from ._calibration import (  # noqa: F401  (listed by __all__ below, from the module's own)
    CalibHistogram, SearchCurve, calib_histogram_edges, calib_histogram_init, calib_histogram_merge,
    calib_histogram_update, histogram_quantization_error, kl_divergences, kl_threshold, mse_errors,
    mse_threshold, percentile_range,
)
from ._histogram import (  # noqa: F401  (listed by __all__ below, from the module's own)
    HistogramState, histogram, histogram_init, histogram_merge, histogram_update, histogram_update_counting,
)
from ._l2_search import (  # noqa: F401  (listed by __all__ below, from the module's own)
    check_histogram, histogram_qparams, non_linear_param_search, quantization_error,
)
from ._lowbit import (  # noqa: F401  (listed by __all__ below, from the module's own)
    BFP_DTYPES, FP8_MAX, GRANULARITIES, INT_RANGES, LOWBIT_DTYPES, MX_DTYPES, MX_ELEMENTS, MX_ROUNDINGS,
    BlockScale, ElementFormat, LowBitSpec, bfp_fake_quantize, bfp_scale, block_aminmax, e8m0_to_float,
    fp8_fake_quantize, fp8_scale, group_aminmax, group_fake_quantize, group_qparams, lowbit_fake_quantize,
    lowbit_qparams, lowbit_spec, lowbit_stats, mx_fake_quantize, mx_scale,
)

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

