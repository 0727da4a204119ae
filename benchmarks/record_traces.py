"""Record PyTorch-profiler traces of one randomly initialised decoder, eager and CUDA-graph replay, at
several batch sizes: the pair of traces of one machine that `python -m harness.profile TRACE --fit NAME`
is checked with (fit on the eager trace, predict the graph one; docs/validation.md).

    python benchmarks/record_traces.py --out DIR [--card workloads/qwen25_7b.yaml] [--batch 1 8]
        [--context 2048] [--steps 8] [--timed-steps 40] [--prefill N ...] [--lean] [--hf] [--layers N] [--device cuda]

Runs where PyTorch and a CUDA GPU are; PyTorch is not a dependency of the harness, and nothing is
downloaded: the decoder is built from a workload card's shapes with random weights.

The decoder is plain PyTorch written as HF transformers writes a Qwen2 / Llama decoder (`nn.Module`s per
norm, projection and MLP; RMSNorm as float32 element-wise kernels; RoPE as mul, neg, cat, mul, add), so a
step launches the card's `unfused_*_ops` one kernel each, with one difference that lets the whole step be
captured: the KV cache is static. It holds `--context` tokens (random, all attended, no mask), and each
step writes the new token's K and V over the oldest (`index_copy_`, where HF's DynamicCache grows by
`torch.cat`). A step: embedding, the layers, the final norm, the LM head, argmax, four bookkeeping kernels
(next input, position, write slot ×2), then the new tokens to the host (a copy and a wait, as a server
streaming tokens does). Eager runs that step op by op; graph captures it once per batch size
(`torch.cuda.CUDAGraph`) and replays it, then copies the tokens out the same way.

`--prefill N ...` records prompts' forwards of N tokens instead of decode steps (causal attention over the
prompt, its K and V written to the cache, the last position's logits); `--steps 0` only times the steps.

`--hf` also records HF transformers' own model (the card's config, random weights) decoding eagerly with
its DynamicCache after a `--context`-token prefill: the loop the card's unfused op lists were counted on.

Written to --out: `[prefill<N>_]<mode>_b<batch>[_lean].json.gz` (profiler traces: `ProfilerStep#N` per step, shapes, module
calls and Python stacks for eager, shapes for graph) and `summary.json`: the GPU, host CPU and versions, and
per trace the step time measured without the profiler (wall clock per step, the host waiting for the
tokens; median, p10, p90 of --timed-steps steps) and with it (the traced steps' median).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 5


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the traces and summary.json")
    parser.add_argument("--card", type=Path, default=ROOT / "workloads" / "qwen25_7b.yaml", help="workload card whose shapes the decoder takes")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (sequences a step)")
    parser.add_argument("--context", type=int, default=2048, help="tokens in each sequence's KV cache")
    parser.add_argument("--steps", type=int, default=8, help="decode steps in each trace (0: time the steps, write no trace)")
    parser.add_argument("--timed-steps", type=int, default=40, help="decode steps timed without the profiler")
    parser.add_argument("--prefill", type=int, nargs="*", default=[], metavar="TOKENS",
                        help="record prompts' forwards of these lengths instead of decode steps")
    parser.add_argument("--hf", action="store_true", help="also trace HF transformers' own model, eager, DynamicCache")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the card (a quick check)")
    parser.add_argument("--lean", action="store_true", help="eager traces with shapes only (no Python stacks or module calls: less profiler work per op); names end in _lean")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script (no graph mode)")
    return parser.parse_args(argv)


def load_card(path: Path, layers: int | None) -> dict:
    import yaml

    card = yaml.safe_load(path.read_text())
    if layers is not None:
        card["num_hidden_layers"] = layers
    return card


def build_decoder(card: dict, batch: int, context: int, device: str, prefill: int = 0):
    """The card's decoder with random bf16 weights and a static KV cache of `context` tokens per sequence,
    and the state a decode step reads and updates in place (so a captured step replays as is). With
    `prefill` tokens, the step is a prompt's forward instead: causal attention over the prompt itself, its
    K and V written to the cache, the last token's argmax."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    hidden, heads, kv_heads = card["hidden_size"], card["num_attention_heads"], card["num_key_value_heads"]
    head_dim = card.get("head_dim") or hidden // heads
    dtype = torch.bfloat16
    eps = float(card.get("rms_norm_eps", 1e-6))

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))

        def forward(self, x):
            x32 = x.to(torch.float32)
            variance = x32.pow(2).mean(-1, keepdim=True)
            x32 = x32 * torch.rsqrt(variance + eps)
            return self.weight * x32.to(dtype)

    class RotaryEmbedding(nn.Module):
        def __init__(self):
            super().__init__()
            theta = float(card.get("rope_theta", 1e6))
            self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))

        def forward(self, positions):  # positions: float32 [batch, 1]
            freqs = (self.inv_freq[None, :, None].expand(positions.shape[0], -1, 1) @ positions[:, None, :]).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(dtype), emb.sin().to(dtype)

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            bias = bool(card.get("attention_bias", False))
            self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias, dtype=dtype)
            self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias, dtype=dtype)
            self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias, dtype=dtype)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False, dtype=dtype)
            self.register_buffer("k_cache", torch.randn(batch, kv_heads, context, head_dim, dtype=dtype))
            self.register_buffer("v_cache", torch.randn(batch, kv_heads, context, head_dim, dtype=dtype))

        def forward(self, x, cos, sin, slot):
            b, n = x.shape[0], x.shape[1]
            q = self.q_proj(x).view(b, n, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, n, kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, n, kv_heads, head_dim).transpose(1, 2)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            self.k_cache.index_copy_(2, slot, k)
            self.v_cache.index_copy_(2, slot, v)
            if n == 1:  # decode: the new token attends to the whole cache
                out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, enable_gqa=kv_heads != heads)
            else:  # prefill: the prompt attends to itself, causally
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, heads * head_dim))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            inter = card["intermediate_size"]
            self.gate_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
            self.up_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
            self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype)
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attn = RMSNorm(), Attention()
            self.post_attention_layernorm, self.mlp = RMSNorm(), MLP()

        def forward(self, x, cos, sin, slot):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, slot)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(card["vocab_size"], hidden, dtype=dtype)
            self.rotary_emb = RotaryEmbedding()
            self.layers = nn.ModuleList(DecoderLayer() for _ in range(card["num_hidden_layers"]))
            self.norm = RMSNorm()

        def forward(self, tokens, positions, slot):
            x = self.embed_tokens(tokens)
            cos, sin = self.rotary_emb(positions)
            for layer in self.layers:
                x = layer(x, cos, sin, slot)
            return self.norm(x)

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()
            self.lm_head = nn.Linear(hidden, card["vocab_size"], bias=False, dtype=dtype)
            if card.get("tie_word_embeddings"):
                self.lm_head.weight = self.model.embed_tokens.weight

        def forward(self, tokens, positions, slot):
            # The next token's logits only (a prompt's other positions need none: vLLM, HF's logits_to_keep)
            return self.lm_head(self.model(tokens, positions, slot)[:, -1:, :])

    with torch.device(device):
        model = CausalLM().eval()
        generator = torch.Generator(device=device).manual_seed(0)
        if prefill:
            state = {
                "tokens": torch.randint(0, card["vocab_size"], (batch, prefill), generator=generator, device=device),
                "positions": torch.arange(prefill, dtype=torch.float32).expand(batch, prefill).contiguous(),
                "slot": torch.arange(prefill),
                "next": torch.zeros(batch, dtype=torch.long),
            }
        else:
            state = {
                "tokens": torch.randint(0, card["vocab_size"], (batch, 1), generator=generator, device=device),
                "positions": torch.full((batch, 1), float(context), dtype=torch.float32),
                "slot": torch.zeros(1, dtype=torch.long),
                "next": torch.zeros(batch, dtype=torch.long),
            }

    def prefill_step():
        """A prompt's forward, host copy left out."""
        logits = model(state["tokens"], state["positions"], state["slot"])
        state["next"].copy_(logits[:, -1, :].float().argmax(-1))

    def step():
        """One decode step's device work, host copy left out (graph mode captures exactly this)."""
        logits = model(state["tokens"], state["positions"], state["slot"])
        state["next"].copy_(logits[:, -1, :].float().argmax(-1))
        state["tokens"].copy_(state["next"][:, None])
        state["positions"].add_(1)
        state["slot"].add_(1).remainder_(context)

    return model, state, prefill_step if prefill else step


def profile_steps(torch, run_step, steps: int, path: Path, python: bool) -> list[float]:
    """Trace `steps` steps (after the profiler's own warm-up) into `path` (gzip'd Chrome trace);
    returns each traced step's wall time (ms)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    wall_ms = []
    raw = path.with_suffix("")
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=2, active=steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(raw)),
        record_shapes=True,
        with_stack=python,
        with_modules=python,
    ) as prof:
        for i in range(steps + 2):
            began = time.perf_counter()
            run_step()
            if i >= 2:
                wall_ms.append((time.perf_counter() - began) * 1e3)
            prof.step()
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return wall_ms


def timed_steps_ms(run_step, steps: int) -> list[float]:
    wall_ms = []
    for _ in range(steps):
        began = time.perf_counter()
        run_step()
        wall_ms.append((time.perf_counter() - began) * 1e3)
    return wall_ms


def stats(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median": statistics.median(ordered), "mean": statistics.fmean(ordered), "p10": pick(0.1), "p90": pick(0.9), "n": len(ordered)}


def report(name: str, timed: list[float], traced: list[float]) -> None:
    step = stats(timed)
    line = f"{name:>16}: step {step['median']:.3f} ms (p10 {step['p10']:.3f}, p90 {step['p90']:.3f})"
    print(line + (f"; traced {stats(traced)['median']:.3f} ms" if traced else ""), flush=True)


def record_decoder(torch, card: dict, args, batch: int, summary: dict, prefill: int = 0) -> None:
    model, state, step = build_decoder(card, batch, prefill or args.context, args.device, prefill)

    def eager_step():
        with torch.no_grad():
            step()
            state["next"].to("cpu")  # the host waits for the step's tokens

    runners = {"eager": eager_step}
    if args.device == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            step()

        def graph_step():
            graph.replay()
            state["next"].to("cpu")

        runners["graph"] = graph_step
    for mode, run_step in runners.items():
        python = mode == "eager" and not args.lean
        name = (f"prefill{prefill}_" if prefill else "") + f"{mode}_b{batch}" + ("_lean" if mode == "eager" and args.lean else "")
        for _ in range(WARMUP_STEPS):
            run_step()
        timed = timed_steps_ms(run_step, args.timed_steps)
        traced = profile_steps(torch, run_step, args.steps, args.out / f"{name}.json.gz", python=python) if args.steps else []
        summary["traces"][name] = {
            "model": "decoder", "mode": mode, "batch": batch, **({"prefill": prefill} if prefill else {"context": args.context}),
            "step_ms_unprofiled": stats(timed), "step_ms_profiled": stats(traced) if traced else None,
        }
        report(name, timed, traced)
        if traced and mode == "eager":  # how to fit a machine from it, the profiler's own work taken off
            fit = (f"python -m harness.profile {args.out / name}.json.gz --out fit_{name} --fit NAME"
                   f" --unprofiled-step-ms {stats(timed)['mean']:.4f}")  # a mean, as the traced steps' it is compared with
            summary["traces"][name]["fit"] = fit
            print(f"{'':>16}  fit: {fit}", flush=True)


def record_hf(torch, card: dict, args, batch: int, summary: dict) -> None:
    """HF transformers' own Qwen2 / Llama model from the card's config, random weights, eager decode with
    its DynamicCache after a --context-token prefill (no generate(): its loop's extra host work is not
    what the card's op lists count)."""
    import transformers

    arch = "Qwen2" if card.get("attention_bias") else "Llama"
    config = getattr(transformers, f"{arch}Config")(
        hidden_size=card["hidden_size"], num_hidden_layers=card["num_hidden_layers"],
        num_attention_heads=card["num_attention_heads"], num_key_value_heads=card["num_key_value_heads"],
        intermediate_size=card["intermediate_size"], vocab_size=card["vocab_size"],
        tie_word_embeddings=bool(card.get("tie_word_embeddings")), max_position_embeddings=args.context + 4096,
    )
    config._attn_implementation = "sdpa"
    with torch.device(args.device):
        model = getattr(transformers, f"{arch}ForCausalLM")(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, card["vocab_size"], (batch, args.context), device=args.device)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
    cache = out.past_key_values
    tokens = out.logits[:, -1, :].argmax(-1, keepdim=True)

    def hf_step():
        nonlocal tokens
        with torch.no_grad():
            logits = model(input_ids=tokens, past_key_values=cache, use_cache=True).logits
        tokens = logits[:, -1, :].float().argmax(-1, keepdim=True)
        tokens.to("cpu")

    name = f"hf_eager_b{batch}" + ("_lean" if args.lean else "")
    for _ in range(WARMUP_STEPS):
        hf_step()
    timed = timed_steps_ms(hf_step, args.timed_steps)
    traced = profile_steps(torch, hf_step, args.steps, args.out / f"{name}.json.gz", python=not args.lean) if args.steps else []
    summary["traces"][name] = {
        "model": f"transformers {arch}ForCausalLM", "mode": "eager", "batch": batch,
        "context": f"{args.context} + the {WARMUP_STEPS + args.timed_steps + 2}+ tokens decoded before the trace (DynamicCache grows)",
        "step_ms_unprofiled": stats(timed), "step_ms_profiled": stats(traced) if traced else None,
    }
    report(name, timed, traced)


def environment(torch) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:  # not Linux
        pass
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "host_cpu": cpu, "host_threads": os.cpu_count()}
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, sms=torch.cuda.get_device_properties(0).multi_processor_count)
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.timed_steps < 1 or args.steps < 0:
        print(f"record_traces: --timed-steps {args.timed_steps} --steps {args.steps}: time one step or more, trace none or more", file=sys.stderr)
        return 2
    if args.hf and args.prefill:
        print("record_traces: --hf records decode steps only; leave it out with --prefill", file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("record_traces: --device cuda: no CUDA device here (use --device cpu to check the script)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    card = load_card(args.card, args.layers)
    summary = {
        "card": args.card.name, "layers": card["num_hidden_layers"], "context": args.context, "steps": args.steps,
        "timed_steps": args.timed_steps, "environment": environment(torch), "traces": {}, "failed": {},
    }
    print(json.dumps(summary["environment"]), flush=True)
    jobs = [(f"decoder prefill {n} b{b}", record_decoder, b, {"prefill": n}) for n in args.prefill for b in args.batch]
    if not args.prefill:
        jobs += [(f"decoder b{b}", record_decoder, b, {}) for b in args.batch]
    if args.hf:
        jobs += [(f"hf b{b}", record_hf, b, {}) for b in args.batch]
    for label, job, batch, options in jobs:
        try:
            job(torch, card, args, batch, summary, **options)
        except Exception as error:  # one recording failing must not lose the others
            summary["failed"][label] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        if args.device == "cuda":  # the job's model, cache and graph went with its frame
            torch.cuda.empty_cache()
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
