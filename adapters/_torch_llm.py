"""torch observers of the LLM family (:mod:`observers_core.families.llm`) as ``nn.Module``.

:class:`LLMObserver` keeps the family's :class:`~observers_core.families.llm.State` in registered buffers
(``min_vals``, ``max_vals``: empty until the first batch, then the qparam shape in the observed dtype;
``count``: batches seen, int64 0-d) and, for ``search="imatrix"``, the :class:`~observers_core.families.llm.Importance`
(``importance_sum`` float32 per input channel, ``importance_count`` tokens), so ``state_dict`` /
``load_state_dict``, ``torch.save`` and ``.to(device)`` work. Every step is the family's:
``forward(x)`` = ``llm.flatten`` then ``llm.update`` (memoryless / static / moving range, or the MSE grid
search, importance-weighted for imatrix) and returns ``x``; ``calculate_qparams()`` = ``llm.qparams``:
``(scale, zero_point)``, plus the float32 global scale ``448 * 6 / amax`` for NVFP4 (``tensor_group``).

Example::

    import torch
    from observers_core.families import llm, nvfp4
    from observers_core.adapters.torch import LLMObserver

    obs = LLMObserver(llm.Config(num_bits=4, strategy="group", group_size=128, search="imatrix"))
    hook = obs.attach(linear)                 # collects E[x^2] per input channel from linear's inputs
    model(calibration_batch)
    obs(linear.weight)
    scale, zero_point = obs.calculate_qparams()

Bad input (state untouched): a non-tensor or non-floating ``x`` is a TypeError naming ``x``, a dtype other
than the statistics' a TypeError, a wrong shape or qparam shape a ValueError; NaN/Inf propagate as in
llm-compressor (its result, bit for bit: tests/test_torch_llm.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from observers_core.families import llm, nvfp4

__all__ = ["LLMObserver", "llm_fused_global_scale", "ModelOptMseCalibrator", "NVFP4SweepCalibrator"]

_RANGE = ("min_vals", "max_vals", "count")
_IMPORTANCE = ("importance_sum", "importance_count")


def _xp() -> Any:
    import array_api_compat.torch as xp

    return xp


class LLMObserver(torch.nn.Module):
    """An observer of the LLM family for one tensor ``role`` (``"weight"`` 2-D, ``"activation"``
    ``(..., hidden)``, ``"attention"`` ``(batch, heads, seq, head_dim)``); ``config`` an
    :class:`~observers_core.families.llm.Config` or its fields as keywords."""

    def __init__(self, config: llm.Config | None = None, /, *, role: str = "weight", **fields: Any) -> None:
        super().__init__()
        if config is None:
            config = llm.Config(**fields)
        elif fields:
            raise TypeError(f"pass config or its fields, not both (got config and {sorted(fields)})")
        if not isinstance(config, llm.Config):
            raise TypeError(f"config must be an observers_core.families.llm.Config, got {type(config).__name__}")
        if role not in ("weight", "activation", "attention"):
            raise ValueError(f"role={role!r} is not one of 'weight', 'activation', 'attention'")
        self.config, self.role = config, role
        self._init_buffers()

    def _init_buffers(self) -> None:
        self.register_buffer("min_vals", torch.empty(0))
        self.register_buffer("max_vals", torch.empty(0))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        if self.config.search == "imatrix":
            self.register_buffer("importance_sum", torch.empty(0))
            self.register_buffer("importance_count", torch.zeros((), dtype=torch.int64))

    def extra_repr(self) -> str:
        return f"role={self.role!r}, config={self.config!r}"

    @property
    def has_statistics(self) -> bool:
        return bool(self.count.item() > 0)

    def reset(self) -> None:
        """Back to no statistics (the importance, if any, too); devices kept."""
        for name in _RANGE + (_IMPORTANCE if self.config.search == "imatrix" else ()):
            old = self._buffers[name]
            self._buffers[name] = (torch.zeros((), dtype=torch.int64, device=old.device) if name.endswith("count")
                                   else torch.empty(0, device=old.device))

    # ------------------------------------------------------------------------------------ importance
    def collect_importance(self, x: torch.Tensor) -> None:
        """Adds ``sum x^2`` per last-axis channel of a layer input and its token count
        (``llm.importance_update``)."""
        if self.config.search != "imatrix":
            raise ValueError(f"collect_importance needs search='imatrix' (config.search={self.config.search!r})")
        x = _check_tensor(x, "x")
        s, c = self._buffers["importance_sum"], self._buffers["importance_count"]
        state = (llm.importance_init(x.shape[-1], device=x.device, xp=_xp()) if s.numel() == 0 and c.item() == 0
                 else llm.Importance(s.to(x.device), c.to(x.device)))
        new = llm.importance_update(state, x.detach(), xp=_xp())  # ValueError on a channel mismatch
        self._buffers["importance_sum"], self._buffers["importance_count"] = new.sum, new.count

    def attach(self, module: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
        """A forward-pre hook on ``module`` feeding its first input to :meth:`collect_importance`;
        ``handle.remove()`` detaches it."""
        def _hook(mod: torch.nn.Module, args: Any) -> None:
            x = args[0] if isinstance(args, tuple) and args else args
            if isinstance(x, torch.Tensor):
                with torch.no_grad():
                    self.collect_importance(x)

        if self.config.search != "imatrix":
            raise ValueError(f"attach needs search='imatrix' (config.search={self.config.search!r})")
        return module.register_forward_pre_hook(_hook)

    def _importance_weights(self, x: torch.Tensor) -> torch.Tensor | None:
        """``llm.importance_weights`` for the weight ``x``, or None (the uniform search, with a warning,
        where llm-compressor falls back: no data, a non-weight role, other strategies...)."""
        if self.config.search != "imatrix":
            return None
        if self.role != "weight":
            weights, reason = None, f"role {self.role!r} is not importance-weighted"
        else:
            state = llm.Importance(self.importance_sum.to(x.device), self.importance_count.to(x.device))
            weights, reason = llm.importance_weights(state, self.config, tuple(x.shape), xp=_xp())
        if weights is None:
            warnings.warn(f"imatrix: {reason}; falling back to the uniform MSE search", UserWarning, stacklevel=3)
        return weights

    # ----------------------------------------------------------------------------------- statistics
    def _state(self, observed: torch.Tensor) -> llm.State:
        if self.count.item() == 0:
            return llm.init(self.config, qparam_shape=tuple(observed.shape[1:-1]), dtype=observed.dtype,
                            device=observed.device, xp=_xp())
        if self.min_vals.dtype != observed.dtype:
            raise TypeError(f"x has dtype {observed.dtype}, the observer's statistics {self.min_vals.dtype}; "
                            "observe one dtype (or reset())")
        return llm.State(self.min_vals.to(observed.device), self.max_vals.to(observed.device),
                         self.count.to(observed.device))

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Records ``llm.update`` of ``llm.flatten(x)`` (an empty ``x`` records nothing); returns ``x``."""
        xt = _check_tensor(x, "x")
        observed = llm.flatten(xt.detach(), self.config, role=self.role, xp=_xp())
        if observed.numel() == 0:
            return x
        state = self._state(observed)
        weights = self._importance_weights(xt)
        state = llm.update(self.config, state, observed, weights=weights, xp=_xp())
        self._buffers["min_vals"], self._buffers["max_vals"], self._buffers["count"] = state
        return x

    @torch.no_grad()
    def calculate_qparams(self, *, global_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``llm.qparams`` of the buffers: ``(scale, zero_point)``; ``tensor_group`` (NVFP4):
        ``(scale, zero_point, global_scale)`` with the given (fused) global scale, default the observer's
        own. Zero points in ``config.zp_dtype`` (E4M3 for float formats)."""
        if not self.has_statistics:
            raise RuntimeError("no statistics: call the observer on a tensor first")
        state = llm.State(self.min_vals, self.max_vals, self.count)
        qp = llm.qparams(self.config, state, global_scale=global_scale, xp=_xp())
        zp = qp.zero_point.to(getattr(torch, self.config.zp_dtype))
        if self.config.strategy == "tensor_group":
            return qp.scale, zp, qp.global_scale
        return qp.scale, zp

    # ----------------------------------------------------------------------------------- state_dict
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Buffers take the saved shapes and dtypes; everything is checked before any buffer changes."""
        names = _RANGE + (_IMPORTANCE if self.config.search == "imatrix" else ())
        saved = {n: state_dict[prefix + n] for n in names if isinstance(state_dict.get(prefix + n), torch.Tensor)}
        if "min_vals" in saved and "max_vals" in saved:
            mn, mx = saved["min_vals"], saved["max_vals"]
            if mn.shape != mx.shape or mn.dtype != mx.dtype or not mn.is_floating_point():
                raise ValueError(f"state_dict {prefix}min_vals/max_vals must be floating tensors of one shape and "
                                 f"dtype, got {tuple(mn.shape)} {mn.dtype} and {tuple(mx.shape)} {mx.dtype}")
        for n in ("count", "importance_count"):
            if n in saved and (saved[n].ndim != 0 or saved[n].is_floating_point() or saved[n].item() < 0):
                raise ValueError(f"state_dict {prefix}{n} must be a non-negative 0-d integer tensor")
        if "importance_sum" in saved and (saved["importance_sum"].ndim != 1 or saved["importance_sum"].dtype != torch.float32):
            raise ValueError(f"state_dict {prefix}importance_sum must be a 1-D float32 tensor")
        for n, t in saved.items():
            old = self._buffers[n]
            self._buffers[n] = torch.empty(t.shape, dtype=t.dtype, device=old.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def llm_fused_global_scale(*observers: LLMObserver) -> torch.Tensor:
    """NVFP4's global scale shared by a fused group (q/k/v, gate/up): ``llm.fused_global_scale`` over
    every observer's range; pass it to each one's ``calculate_qparams(global_scale=...)``."""
    if not observers:
        raise ValueError("observers must hold at least one LLMObserver")
    for i, o in enumerate(observers):
        if not isinstance(o, LLMObserver) or not o.has_statistics:
            raise ValueError(f"observers[{i}] must be an LLMObserver with statistics")
    return llm.fused_global_scale([(o.min_vals, o.max_vals) for o in observers], xp=_xp())


# ------------------------------------------------------------------------------ ModelOpt's MSE calibrators

_SUMS = ("amax", "loss_sum", "exact", "count")


class _LossSums(torch.nn.Module):
    """The summed candidate losses of ModelOpt's MSE calibrators (:class:`observers_core.families.nvfp4.MseState`)
    in buffers: ``amax`` (the base range, float32), ``loss_sum`` (float32 ``(T, *kept)``, ModelOpt's running
    sum), ``exact`` (its exact sum, float64 ``(12, T, *kept)``), ``count`` (batches, int64 0-d); empty until
    set / the first batch."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("amax", torch.empty(0))
        self.register_buffer("loss_sum", torch.empty(0))
        self.register_buffer("exact", torch.empty(0, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    @property
    def has_statistics(self) -> bool:
        return bool(self.count.item() > 0)

    def reset(self) -> None:
        """No batches (``amax`` kept); devices kept."""
        dev = self.count.device
        self._buffers["loss_sum"] = torch.empty(0, device=dev)
        self._buffers["exact"] = torch.empty(0, dtype=torch.float64, device=dev)
        self._buffers["count"] = torch.zeros((), dtype=torch.int64, device=dev)

    def _add(self, losses: torch.Tensor) -> None:
        state = (nvfp4.mse_init(losses.shape[0], tuple(losses.shape[1:]), device=losses.device, xp=_xp())
                 if self.count.item() == 0 else nvfp4.MseState(self.loss_sum, self.exact, self.count))
        state = nvfp4.mse_update(state, losses, xp=_xp())  # ValueError on another shape, nothing changed
        self._buffers["loss_sum"], self._buffers["exact"], self._buffers["count"] = state

    def merge_(self, other: "_LossSums") -> "_LossSums":
        """Adds another shard's batches (``nvfp4.mse_merge``: the exact sums are the single pass's whatever
        the split); both must share ``amax``. Returns ``self``."""
        if type(other) is not type(self):
            raise TypeError(f"other must be a {type(self).__name__}, got {type(other).__name__}")
        if not torch.equal(other.amax.to(self.amax.device), self.amax):
            raise ValueError("other has another amax: shards must search the same candidates")
        if other.count.item() == 0:
            return self
        if self.count.item() == 0:
            merged = nvfp4.MseState(other.loss_sum.clone(), other.exact.clone(), other.count.clone())
        else:
            merged = nvfp4.mse_merge(nvfp4.MseState(self.loss_sum, self.exact, self.count),
                                     nvfp4.MseState(other.loss_sum, other.exact, other.count))
        self._buffers["loss_sum"], self._buffers["exact"], self._buffers["count"] = merged
        return self

    def _best(self, multipliers: torch.Tensor, amax: torch.Tensor, exact: bool) -> torch.Tensor:
        if self.count.item() == 0:
            raise RuntimeError("no statistics: call the calibrator on a tensor first")
        state = nvfp4.MseState(self.loss_sum, self.exact, self.count)
        return nvfp4.mse_amax(state, amax, multipliers, exact=exact, xp=_xp())

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Buffers take the saved shapes; every one is checked before any buffer changes."""
        saved = {n: state_dict[prefix + n] for n in _SUMS if isinstance(state_dict.get(prefix + n), torch.Tensor)}
        if "count" in saved and (saved["count"].ndim != 0 or saved["count"].is_floating_point()
                                 or saved["count"].item() < 0):
            raise ValueError(f"state_dict {prefix}count must be a non-negative 0-d integer tensor")
        if "amax" in saved and saved["amax"].dtype != torch.float32:
            raise ValueError(f"state_dict {prefix}amax must be float32, got {saved['amax'].dtype}")
        if "loss_sum" in saved and "exact" in saved:
            ls, ex = saved["loss_sum"], saved["exact"]
            if ls.numel() and (ls.dtype != torch.float32 or ex.dtype != torch.float64 or
                               tuple(ex.shape) != (12,) + tuple(ls.shape)):
                raise ValueError(f"state_dict {prefix}loss_sum / exact must be float32 (T, ...) and float64 "
                                 f"(12, T, ...), got {tuple(ls.shape)} {ls.dtype} and {tuple(ex.shape)} {ex.dtype}")
        for n, t in saved.items():
            old = self._buffers[n]
            self._buffers[n] = torch.empty(t.shape, dtype=t.dtype, device=old.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class ModelOptMseCalibrator(_LossSums):
    """ModelOpt 0.47's ``MseCalibrator`` as a module (:func:`observers_core.families.nvfp4.mse_losses`,
    ``mse_update``, ``mse_amax``): candidates ``amax * m`` for the multipliers of ``config``
    (:class:`~observers_core.families.nvfp4.MseConfig`, or its fields as keywords); ``forward(x)`` adds the
    batch's losses ``sum (x - quantize(x, amax * m))**2`` over the non-``axis`` dimensions and returns ``x``;
    :meth:`compute_amax` is ``amax * m[argmin]`` (ModelOpt's float32 sums, or ``exact=True``: the exact sums,
    the same for every split of the batches into merged shards). ``quantize(x, amax)`` is the fake
    quantizer (not saved); ``amax`` the base range (a buffer: set here or restored by ``load_state_dict``)."""

    def __init__(self, quantize: Any, config: nvfp4.MseConfig | None = None, /, *, amax: torch.Tensor | None = None,
                 **fields: Any) -> None:
        super().__init__()
        if not callable(quantize):
            raise TypeError(f"quantize must be callable (x, amax) -> fake-quantized x, got {type(quantize).__name__}")
        if config is None:
            config = nvfp4.MseConfig(**fields)
        elif fields:
            raise TypeError(f"pass config or its fields, not both (got config and {sorted(fields)})")
        if not isinstance(config, nvfp4.MseConfig):
            raise TypeError(f"config must be an observers_core.families.nvfp4.MseConfig, got {type(config).__name__}")
        self.quantize, self.config = quantize, config
        if amax is not None:
            self._buffers["amax"] = _check_tensor(amax, "amax").detach().to(torch.float32).clone()

    def extra_repr(self) -> str:
        return f"config={self.config!r}"

    def multipliers(self) -> torch.Tensor:
        return nvfp4.mse_multipliers(self.config, like=self.amax, xp=_xp())

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = _check_tensor(x, "x")
        if self.amax.numel() == 0:
            raise ValueError("amax is not set: pass amax= (ModelOpt's initial amax) or load a state_dict")
        losses = nvfp4.mse_losses(xt.detach(), self.amax.to(xt.device), self.multipliers().to(xt.device),
                                  self.quantize, self.config, xp=_xp())
        self._add(losses)
        return x

    @torch.no_grad()
    def compute_amax(self, *, exact: bool = False) -> torch.Tensor:
        """``amax * m[argmin]`` of the summed losses, shaped like ``amax``."""
        return self._best(self.multipliers(), self.amax, exact)


class NVFP4SweepCalibrator(_LossSums):
    """ModelOpt 0.47's ``NVFP4MSECalibrator`` as a module: every block of ``block_size`` values of the last
    axis tries the 126 E4M3 block scales, ``amax = global_amax * c_j``
    (:func:`observers_core.families.nvfp4.nvfp4_scale_sweep`); ``forward(x)`` adds each block's losses and
    returns ``x``; :meth:`compute_amax` is the best ``amax`` per block (the first minimum of the summed
    losses; ``exact=True``: of the exact sums). ``global_amax`` (0-d float32) is the ``amax`` buffer."""

    def __init__(self, *, global_amax: torch.Tensor | None = None, block_size: int = 16,
                 chunk_elements: int = 2**22) -> None:
        super().__init__()
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} must be a positive int")
        self.block_size, self.chunk_elements = block_size, chunk_elements
        if global_amax is not None:
            g = _check_tensor(global_amax, "global_amax")
            if g.numel() != 1:
                raise ValueError(f"global_amax must hold one value, got shape {tuple(g.shape)}")
            self._buffers["amax"] = g.detach().to(torch.float32).reshape(()).clone()

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = _check_tensor(x, "x")
        if self.amax.numel() == 0:
            raise ValueError("global_amax is not set: pass global_amax= or load a state_dict")
        blocks = nvfp4.to_blocks(xt.detach(), self.block_size, xp=_xp()).reshape(-1, self.block_size)
        _, losses = nvfp4.nvfp4_scale_sweep(blocks, self.amax.to(xt.device), chunk_elements=self.chunk_elements,
                                            xp=_xp())
        self._add(losses)
        return x

    @torch.no_grad()
    def compute_amax(self, *, exact: bool = False) -> torch.Tensor:
        """The best ``amax`` per block (``(n_blocks,)`` float32)."""
        cand = nvfp4.e4m3_scale_candidates(like=self.amax, xp=_xp())
        base = torch.broadcast_to(self.amax, tuple(self.loss_sum.shape[1:]))
        return self._best(cand, base, exact)


def _check_tensor(x: Any, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    return x

