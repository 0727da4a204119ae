"""Value limits: every number a user can set has a finite range, every text a length; checked when a
config dataclass is made (schema.py calls check_limits), before anything runs."""
from __future__ import annotations

import dataclasses
import enum
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Optional

from harness.base.errors import ConfigError


MAX_STREAMS = 16  # device streams: 0 compute, 1 communication, 2.. further compute streams (traces)


def as_typed(value: Any) -> str:
    """A config value as a user types it on the command line: phase=prefill, path=ops.csv, card=null,
    enabled=true (not 'ops.csv', None, True)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


def check_field(obj: Any, condition: bool, field_name: str, requirement: str) -> None:
    if not condition:
        value = getattr(obj, field_name)
        shown = as_typed(value)
        raise ConfigError(f"{obj._key}.{field_name}={shown}: {requirement}")


# ---------------------------------------------------------------- limits
# Every number a user can set has a finite, physically meaningful range, checked before anything runs:
# inf, nan, 1e308 or 2**63 would otherwise reach numpy and the kernel (overflow warnings, NaN output,
# "Python int too large to convert to C long", multi-GB allocations). The bounds are generous (a
# thousand times beyond any device or host we know of) but finite; docs/reliability.md lists them.


@dataclass(frozen=True)
class Limit:
    low: float
    high: float
    unit: str = ""

    def text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{_number_text(self.low)}..{_number_text(self.high)}{unit}"


def _number_text(value: float) -> str:
    """1e7 → '1e7', 1048576 → '1048576', 0.001 → '0.001': bounds as a reader would write them."""
    if value == int(value):
        exponent = math.log10(abs(value)) if value else 0
        if abs(value) >= 1e6 and exponent == int(exponent):
            return f"1e{int(exponent)}" if value > 0 else f"-1e{int(exponent)}"
        return str(int(value))
    return f"{value:g}"


US = Limit(0, 1e7, "µs")  # a host stage or fixed device cost: up to 10 s
MS = Limit(0, 1e6, "ms")
TFLOPS = Limit(1e-3, 1e5, "TFLOPS")  # 1 GFLOPS .. 100 PFLOPS per device
GBPS = Limit(1e-3, 1e5, "GB/s")  # 1 MB/s .. 100 TB/s
COUNT = Limit(1, 1e6)
FRACTION = Limit(1e-3, 1.0)
TOKENS = Limit(1, 1 << 24, "tokens")
DEVICES = Limit(1, 4096, "devices")
CV = Limit(0, 10)

LIMITS: dict[str, Limit] = {
    "seed": Limit(0, 2**63 - 1),
    **{f"hardware.host.{name}": US for name in (
        "framework_us", "module_us", "infer_shape_us", "tiling_us", "alloc_us", "launch_us", "free_us", "sync_us", "param_write_us",
        "packed_params_us", "driver_alloc_us", "tiling_lookup_us")},
    "hardware.host.threads": Limit(1, 4096, "threads"),
    "hardware.host.jitter_cv": CV,
    "hardware.host.kernel_params": Limit(0, 10_000, "parameters"),
    "hardware.host.stream_pool_speedup": Limit(0, 0.999),
    "hardware.host.cpu_gflops": Limit(1e-3, 1e6, "GFLOPS"),
    "hardware.host.speed": Limit(1e-3, 1e3),
    "hardware.device.ai_cores": Limit(1, 65_536, "cores"),
    "hardware.device.rated_cores": Limit(0, 65_536, "cores"),
    "hardware.device.cube_tflops": TFLOPS,
    "hardware.device.cube_int8_tflops": Limit(0, 1e5, "TOPS"),
    "hardware.device.vector_tflops": TFLOPS,
    "hardware.device.matmul_efficiency": FRACTION,
    "hardware.device.hbm_efficiency": FRACTION,
    "hardware.device.hbm_gb": Limit(1e-3, 1e5, "GB"),
    "hardware.device.hbm_gbps": GBPS,
    "hardware.device.matmul_fixed_us": US,
    "hardware.device.vector_fixed_us": US,
    "hardware.device.comm_fixed_us": US,
    "hardware.device.block_quantum_us": Limit(1e-3, 1e7, "µs"),
    "hardware.device.kernel_gap_us": US,
    "hardware.device.grouped_matmul_group_us": US,
    "hardware.link.pcie_gbps": GBPS,
    "hardware.link.scaleup_gbps": GBPS,
    "hardware.link.internode_gbps": GBPS,
    "hardware.link.pcie_latency_us": US,
    "hardware.link.scaleup_latency_us": US,
    "hardware.link.internode_latency_us": US,
    "hardware.link.devices_per_node": DEVICES,
    "hardware.link.moe_all_to_all_min_ep": Limit(2, DEVICES.high, "EP ranks"),
    **{f"hardware.graph.{name}": US for name in (
        "replay_launch_us", "task_dispatch_us", "exit_gap_us", "param_update_us", "sink_trigger_us", "address_update_us")},
    "hardware.graph.capture_ms": MS,
    "hardware.graph.sink_load_ms": MS,
    "hardware.graph.graph_mem_mib": Limit(0, 1e6, "MiB"),
    "hardware.graph.max_graphs": COUNT,
    # python -m harness.advise (harness.config.advise)
    "advise.tpot_ms_max": MS, "advise.ttft_ms_max": MS, "advise.hbm_gb_max": Limit(1e-3, 1e5, "GB"),
    "advise.capture_s_max": Limit(0, 1e5, "s"), "advise.steps": Limit(1, 100_000, "steps"), "advise.keep": FRACTION,
    "advise.budget_s": Limit(1, 86_400, "s"), "advise.exhaustive_max": Limit(1, 1_000_000, "candidates"),
    "advise.trials": Limit(1, 100_000, "candidates"), "advise.workers": Limit(1, 4096, "processes"),
    "advise.leaders": Limit(0, 1000, "runs"),
    "hardware.graph.comm_group_streams": Limit(0, 1e4, "streams"),
    "hardware.graph.comm_group_reserved_streams": Limit(0, 1e6, "streams"),
    "workload.ops[].flops": Limit(0, 1e18, "FLOP"),
    "workload.ops[].bytes": Limit(0, 1e15, "bytes"),
    "workload.ops[].device_us": US,
    "workload.ops[].host_us": US,
    "workload.ops[].stream": Limit(-1, MAX_STREAMS - 1, "(-1: by kind, 0 compute, 1 communication)"),
    "workload.ops[].after": Limit(0, 1e6, "op index"),
    "workload.serving.arrival_rate_rps": Limit(1e-6, 1e6, "requests/s"),
    "workload.serving.prompt_len_mean": TOKENS,
    "workload.serving.output_len_mean": TOKENS,
    "workload.serving.len_cv": CV,
    "workload.serving.max_batch": Limit(1, 1 << 20, "sequences"),
    "workload.serving.initial_requests": Limit(0, 1e7, "requests"),
    "workload.tp": DEVICES,
    "workload.dp": DEVICES,
    "workload.ep": Limit(0, 4096, "devices"),
    "workload.batch_size": Limit(1, 1 << 20, "sequences"),
    "workload.context_len": TOKENS,
    "workload.steps": Limit(1, 1e9, "steps"),
    "workload.warmup_steps": Limit(0, 1e9, "steps"),
    "workload.repeat": Limit(1, 1e6),
    "strategy.queue_capacity": Limit(1, 1e6, "ops"),
    "strategy.kv_block": TOKENS,
    "strategy.tiling_cache_entries": Limit(1, 1e9, "entries"),
    "strategy.fusion_max_ops": Limit(1, 10_000, "ops"),
    "strategy.graph.buckets": Limit(1, 1 << 20, "sequences"),
    "engine.layer_overhead_us": US,
    **{f"engine.{stage}.{cost}": US for stage in ("schedule", "prepare", "sample", "output", "api")
       for cost in ("per_step_us", "per_request_us", "per_token_us")},
    "engine.multi_step": Limit(1, 1024, "steps"),
    "engine.graph_max_batch": Limit(0, 1_000_000, "sequences"),
    "tracking.timeout_s": Limit(0.1, 3600, "s"),
    # Model card fields (workloads/*.yaml and workload.card_overrides.*); all integers but layer_overhead_us.
    **{f"card.{name}": Limit(1, 1 << 20) for name in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim", "rotary_dim", "vocab_size")},
    **{f"card.{name}": Limit(1, 1 << 24) for name in ("intermediate_size", "moe_intermediate_size")},
    **{f"card.{name}": Limit(0, 1 << 20) for name in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")},
    "card.num_hidden_layers": Limit(1, 10_000, "layers"),
    "card.first_k_dense_replace": Limit(0, 10_000, "layers"),
    "card.n_routed_experts": Limit(0, 65_536, "experts"),
    "card.n_shared_experts": Limit(0, 1024, "experts"),
    "card.num_experts_per_tok": Limit(1, 65_536, "experts"),
    "card.dtype_bytes": Limit(1, 8, "bytes"),
    "card.layer_overhead_us": US,
    # nn.Module calls a forward makes (kernels=unfused): before the layers, in each layer, after them
    **{f"card.unfused_{part}_modules": Limit(0, 10_000, "module calls") for part in ("pre", "layer", "post")},
    "output.trace_steps": Limit(0, 10_000, "steps"),
    "output.timeline_steps": Limit(0, 1_000, "steps"),
}


def check_number(key: str, value: Any, limit: Limit, integer: bool = False) -> None:
    """Raise ConfigError naming `key` unless `value` is a finite number (an integer if asked) within `limit`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ConfigError(f"{key}={value!r}: must be {'an integer' if integer else 'a number'} in {limit.text()}")
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: must be a finite number in {limit.text()}")
    if not limit.low <= value <= limit.high:
        raise ConfigError(f"{key}={value!r}: must be in {limit.text()}")


@functools.lru_cache(maxsize=None)  # per class: every config object built runs check_limits
def _numeric_fields(cls: type) -> list[tuple[str, bool]]:
    """(name, integer) of a dataclass's int/float fields, Optional and List ones included."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kinds = {t for t in _leaf_types(hints[f.name]) if t in (int, float)}
        if kinds:
            out.append((f.name, kinds == {int}))
    return out


@functools.lru_cache(maxsize=None)
def _text_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if str in _leaf_types(hints[f.name]) and typing.get_origin(hints[f.name]) is not dict]


# Text values: names land in folder names, MLflow tags (8000 characters at most) and one-line messages.
MAX_NAME_CHARS = 200
MAX_PATH_CHARS = 4096
_PATH_FIELDS = {"path", "uri", "card"}


def check_text(key: str, value: Any, max_chars: int) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{key}={value!r}: must be text")
    if len(value) > max_chars:
        raise ConfigError(f"{key}={value[:40]!r}…: must be at most {max_chars} characters ({len(value)})")
    if any(not ch.isprintable() for ch in value):
        raise ConfigError(f"{key}={value!r}: must not hold control characters (newlines, tabs, NUL)")


def _leaf_types(hint: Any) -> list[Any]:
    args = typing.get_args(hint)
    return [t for arg in args for t in _leaf_types(arg)] if args else [hint]


def check_limits(obj: Any, key: Optional[str] = None) -> None:
    """Check every number field of a config dataclass against LIMITS, and every text field for length
    and control characters (lists item by item, None skipped)."""
    section = key or obj._key
    for name, integer in _numeric_fields(type(obj)):
        full = f"{section}.{name}"
        limit = LIMITS[full]
        value = getattr(obj, name)
        if isinstance(value, list):
            for i, item in enumerate(value):
                check_number(f"{full}[{i}]", item, limit, integer)
        elif value is not None:
            check_number(full, value, limit, integer)
    for name in _text_fields(type(obj)):
        value, chars = getattr(obj, name), MAX_PATH_CHARS if name in _PATH_FIELDS else MAX_NAME_CHARS
        for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
            if item is not None:
                check_text(f"{section}.{name}" + (f"[{i}]" if i is not None else ""), item, chars)
