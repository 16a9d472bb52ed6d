"""observers_core's LLM family in llm-compressor's observer registry.

Importing this module registers ``observers-core-<name>`` for each of llm-compressor 0.14's observers::

    import observers_core.adapters.llmcompressor  # noqa: F401  (registers the observers)
    QuantizationModifier(targets="Linear", scheme="W4A16", weight_observer="observers-core-memoryless-mse")

Each class subclasses llm-compressor's own observer of that name, so it takes the same
``QuantizationArgs`` and ``observer_kwargs`` (same defaults and checks) and keeps the ``Observer``
interface (``obs(x)``, ``get_qparams()``, fusion of NVFP4 global scales, DDP sync of statistics); what
it computes (flattening, ranges, the MSE grid search, importance, scales, zero points, global scales)
goes through :mod:`observers_core.families.llm`. Differences from llm-compressor: docs/llm.md.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from compressed_tensors.quantization import QuantizationStrategy
from llmcompressor.modifiers.utils.hooks import HooksMixin
from llmcompressor.observers.base import Observer, QParamsDict
from llmcompressor.observers.imatrix import IMatrixMSEObserver, NVFP4ExpandedIMatrixObserver
from llmcompressor.observers.min_max import MemorylessMinMaxObserver, MinMaxObserver, StaticMinMaxObserver
from llmcompressor.observers.mse import MemorylessMSEObserver, MovingAverageMSEObserver, NVFP4ExpandedMSEObserver

from observers_core.families import llm

__all__ = [
    "PREFIX", "NAMES", "NoStatisticsError", "config_from_args",
    "CoreMemorylessMinMaxObserver", "CoreStaticMinMaxObserver", "CoreMinMaxObserver",
    "CoreMemorylessMSEObserver", "CoreMovingAverageMSEObserver", "CoreNVFP4ExpandedMSEObserver",
    "CoreIMatrixMSEObserver", "CoreNVFP4ExpandedIMatrixObserver",
]

PREFIX = "observers-core-"
#: llm-compressor 0.14's observer names, each registered as ``observers-core-<name>``
NAMES = ("memoryless-minmax", "static-minmax", "minmax", "memoryless-mse", "mse", "nvfp4-expanded-mse",
         "fouroversix", "imatrix-mse", "nvfp4-expanded-imatrix")

_ROLES = {"weight": "weight", "input": "activation", "output": "activation", "q": "attention",
          "k": "attention", "v": "attention"}


class NoStatisticsError(AssertionError, RuntimeError):
    """``get_qparams`` before any observation (llm-compressor asserts; this is also a RuntimeError, and it
    survives ``python -O``)."""


def _name(value: Any) -> Any:
    """A torch dtype or an Enum as the core's name (``torch.float8_e4m3fn`` -> ``"float8_e4m3fn"``)."""
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return getattr(value, "value", value)


def config_from_args(args: Any, **options: Any) -> llm.Config:
    """The core :class:`~observers_core.families.llm.Config` of compressed-tensors ``QuantizationArgs``
    plus observer options (``mode``, ``search``, ``maxshrink``...)."""
    block = args.block_structure
    return llm.Config(
        num_bits=args.num_bits, type=_name(args.type), symmetric=args.symmetric, strategy=_name(args.strategy),
        group_size=args.group_size if _name(args.strategy) in ("group", "tensor_group") else None,
        block_structure=tuple(block) if block is not None else None,
        scale_dtype=_name(args.scale_dtype), zp_dtype=_name(args.zp_dtype), **options)


class _Core:
    """What every observers_core observer shares: flatten, observe and qparams through the core."""

    _mode = "memoryless"
    _search: str | None = None

    def _core_options(self) -> dict:
        opts: dict[str, Any] = {"mode": self._mode, "search": self._search}
        if self._mode == "moving":
            opts["averaging_constant"] = float(self.avg_constant)
        if self._search is not None:
            opts.update(maxshrink=float(self.maxshrink), patience=int(self.patience), grid=float(self.grid),
                        norm=float(self.norm), expand=float(self.expand))
        return opts

    @property
    def core_config(self) -> llm.Config:
        """The core configuration (rebuilt from the current args and options on each call)."""
        return config_from_args(self.args, **self._core_options())

    @torch.no_grad
    def forward(self, observed: torch.Tensor) -> Observer:
        if observed.numel() == 0:
            return self
        if self.is_weight_obs and self.has_statistics:
            return self
        role = _ROLES.get(self.base_name)
        if role is None:
            raise ValueError(f"Unknown quantization base name: {self.base_name}")
        observed = llm.flatten(observed, self.core_config, role=role)
        self.update_statistics_from_observed(observed)
        self.fusion_handler.get_fused_statistics()
        return self

    def _weights(self, observed: torch.Tensor) -> torch.Tensor | None:
        return None

    def update_statistics_from_observed(self, observed: torch.Tensor) -> None:
        cfg = self.core_config
        if hasattr(self, "min_vals") and cfg.mode != "memoryless":
            state = llm.State(self.min_vals, self.max_vals, torch.ones((), dtype=torch.int64, device=observed.device))
        else:
            state = llm.init(cfg, qparam_shape=tuple(observed.shape[1:-1]), dtype=observed.dtype,
                             device=observed.device, xp=_xp())
        state = llm.update(cfg, state, observed, weights=self._weights(observed))
        self.min_vals, self.max_vals = state.min_vals, state.max_vals

    def get_global_scale(self) -> torch.Tensor | None:
        if self.args.strategy != QuantizationStrategy.TENSOR_GROUP:
            return None
        stats = self.fusion_handler.get_fused_statistics()
        return llm.fused_global_scale([(s["min_vals"], s["max_vals"]) for s in stats])

    @torch.no_grad
    def get_qparams(self) -> QParamsDict:
        if not self.has_statistics:
            raise NoStatisticsError("No statistics available. Call observer(value) first.")
        gscale = self.get_global_scale()
        scale, zero_point = llm.calculate_qparams(self.min_vals, self.max_vals, self.core_config,
                                                  global_scale=gscale)
        zero_point = zero_point.to(self.args.zp_dtype)
        self.delete_statistics()
        return {"scale": scale, "zero_point": zero_point, "global_scale": gscale}


def _xp() -> Any:
    import array_api_compat.torch as xp

    return xp


@Observer.register(PREFIX + "memoryless-minmax")
class CoreMemorylessMinMaxObserver(_Core, MemorylessMinMaxObserver):
    """``memoryless_minmax``: the last batch's range."""


@Observer.register(PREFIX + "static-minmax")
class CoreStaticMinMaxObserver(_Core, StaticMinMaxObserver):
    """``static_minmax``: the running range of every batch."""

    _mode = "static"


@Observer.register(PREFIX + "minmax")
class CoreMinMaxObserver(_Core, MinMaxObserver):
    """``minmax``: moving average of the range (``averaging_constant``, default 0.01)."""

    _mode = "moving"


@Observer.register(PREFIX + "memoryless-mse")
class CoreMemorylessMSEObserver(_Core, MemorylessMSEObserver):
    """``memoryless_mse``: the MSE grid search of the last batch's range."""

    _search = "mse"


@Observer.register(PREFIX + "mse")
class CoreMovingAverageMSEObserver(_Core, MovingAverageMSEObserver):
    """``mse``: moving average of each batch's searched range."""

    _mode = "moving"
    _search = "mse"


@Observer.register(PREFIX + "nvfp4-expanded-mse")
class CoreNVFP4ExpandedMSEObserver(_Core, NVFP4ExpandedMSEObserver):
    """``nvfp4_expanded_mse``: the search from 1.8x down to 0.8x of the range (112 steps)."""

    _search = "mse"


@Observer.register(PREFIX + "fouroversix")
def _load_fouroversix_alias(*args: Any, **kwargs: Any) -> CoreNVFP4ExpandedMSEObserver:
    warnings.warn("The 'observers-core-fouroversix' observer is an alias for 'observers-core-nvfp4-expanded-mse' "
                  "(as llm-compressor's 'fouroversix' is for 'nvfp4_expanded_mse').", UserWarning, stacklevel=2)
    return CoreNVFP4ExpandedMSEObserver(*args, **kwargs)


class _CoreImportance(_Core):
    """imatrix: ``E[x^2]`` per input channel from a forward-pre hook, through the core's Importance."""

    _search = "imatrix"

    def attach(self, module: torch.nn.Module) -> None:
        if self._imatrix_hook is not None:
            self._imatrix_hook.remove()
            self._imatrix_hook = None
        if not hasattr(module, "in_features"):
            return
        param = next(module.parameters(), None)
        device = param.device if param is not None else None
        state = llm.importance_init(module.in_features, device=device, xp=_xp())
        self._imatrix_sum, self._imatrix_count = state.sum, state.count

        def _hook(mod: torch.nn.Module, args: Any) -> None:
            if HooksMixin._HOOKS_DISABLED and getattr(self, "_imatrix_hook", None) not in HooksMixin._HOOKS_KEEP_ENABLED:
                return
            x = args[0] if isinstance(args, tuple) else args
            if isinstance(x, tuple):
                x = x[0]
            if x is None or not isinstance(x, torch.Tensor):
                return
            x = x.detach()
            old = llm.Importance(self._imatrix_sum.to(x.device), self._imatrix_count.to(x.device))
            new = llm.importance_update(old, x)
            self._imatrix_sum, self._imatrix_count = new.sum, new.count

        self._imatrix_hook = module.register_forward_pre_hook(_hook)

    def _weights(self, observed: torch.Tensor) -> torch.Tensor | None:
        # llm-compressor's own checks and fallbacks (warnings, strict=True errors); E[x^2] = sum / count
        imp = self._get_validated_importance(observed)
        if imp is None:
            return None
        imp = llm.normalized_importance(imp.to(device=observed.device))
        imp_2d = imp.unsqueeze(0).expand(observed.shape[1], -1)
        return llm.flatten(imp_2d, self.core_config, role="weight")


@Observer.register(PREFIX + "imatrix-mse")
class CoreIMatrixMSEObserver(_CoreImportance, IMatrixMSEObserver):
    """``imatrix_mse``: the grid search with the error weighted by normalised ``E[x^2]``."""


@Observer.register(PREFIX + "nvfp4-expanded-imatrix")
class CoreNVFP4ExpandedIMatrixObserver(_CoreImportance, NVFP4ExpandedIMatrixObserver):
    """``nvfp4_expanded_imatrix``: imatrix with the NVFP4 expanded search (1.8x down to 0.8x)."""

