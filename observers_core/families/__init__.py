"""Observer families: one public module each, all with the same shape.

Each family module holds

- ``Config``: a frozen, hashable dataclass with the whole configuration (usable as a ``jax.jit`` static
  argument), validated in ``__post_init__`` through :mod:`observers_core._validate`;
- ``State``: a NamedTuple of arrays (a JAX pytree);
- ``STATE_KEYS``: the state-dict key names of the state's fields;
- pure functions ``init(config, /, *, num_channels=None, device=None, xp=None) -> State``,
  ``update(config, state, x, /) -> State``, ``merge(config, a, b, /) -> State`` and
  ``qparams(config, state, /) -> QParams``, plus ``fake_quantize(config, state, x, /)`` where it applies.

Adapters (``observers_core.adapters``) hold state and call these; they import only public names.

Modules: :mod:`~observers_core.families.minmax` (running range and moving average, per tensor and per
channel), :mod:`~observers_core.families.histogram` (torch's HistogramObserver: binning, combine, L2
search), :mod:`~observers_core.families.lowbit` (per-group int, fp8, MX, BFP16) and
:mod:`~observers_core.families.calibration` (KL, MSE, percentile, Mix: configuration, per-batch update,
the KL accumulator and its merge; not yet in the init/update/merge/qparams shape) and
:mod:`~observers_core.families.llm` (llm-compressor's min/max, MSE grid search and imatrix observers over
compressed-tensors' formats: NVFP4, MX, fp8 blocks, int groups; docs/llm.md) and
:mod:`~observers_core.families.nvfp4` (NVFP4 as torchao and ModelOpt compute it, ModelOpt's MSE calibrator
and 126-candidate E4M3 sweep; plain functions and an ``MseState``). Updates take
``collective=`` (:class:`observers_core.Collective`) to combine every member's batch of one step.
"""
