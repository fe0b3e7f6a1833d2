#!/usr/bin/env python3
"""hf_baseline.py - speed of the Hugging Face reference (transformers `qwen4_exp`) on one random model,
optionally beside qsa_runtime's tools/long_context on the same checkpoint (issue 9, deliverable 3).

  1. Builds a random Qwen4-Exp model (preset "mid": 8 layers, 3 GDN : 1 QSA like Qwen3.8-Flash-Next,
     hidden 1024, 8 query / 2 KV heads of 128, GDN 8 key / 16 value heads of 128, indexer 2 x 64,
     budget 512, r 4, 64 experts top-8 of width 256 + shared 256, hc 4, PLE on layer 1 with a small
     table, vocab 151,936 = the Qwen3 tokenizer's model vocab), seeded, with tools/make_goldens.py's
     randomisation rules, lm_head scaled so the logits have std ~3.  Dense experts (no NVFP4).
  2. Saves it with save_pretrained (safetensors, bfloat16) to --out (plus tokenizer.json /
     tokenizer_config.json from --tokenizer DIR if given: the loader does not need them).
  3. Loads it back with from_pretrained and times the reference, batch 1, per dtype (--dtypes,
     default bfloat16,float16): prefill of the P-token prompt (one forward with a fresh DynamicCache,
     logits of the last token, greedy pick; synchronised) and greedy decode of G tokens with the cache
     (a manual loop, no per-step host sync); decode tok/s = (G - 1) / time from the first generated
     token to the last.  One warm-up run, then the median of --reps runs.
  4. With --ours PATH (tools/long_context) runs `PATH --model OUT --backend cuda|cpu --tokens P
     --chunk C --gen G` on the saved directory and prints its numbers in the same table.

The prompt is long_context's own (its lc_prompt with --prompt-seed, default 1: the same LCG, never an
EOS id), so both sides prefill identical ids and their first generated tokens can be compared.

    # GPU (H200): expected 2-3 minutes (model build ~30 s, our tool's first run includes its kernel JIT)
    make tools/long_context && python3 tools/hf_baseline.py --out /tmp/hfb --ours tools/long_context --json hfb.json
    # CPU smoke test of the script itself
    python3 tools/hf_baseline.py --preset tiny --device cpu --tokens 64 --gen 8 --dtypes float32,bfloat16 \\
        --out /tmp/hfb_tiny --ours tools/long_context
"""

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

import torch
import transformers
from transformers import DynamicCache, Qwen4ExpForCausalLM, Qwen4ExpTextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import randomise  # noqa: E402  (the fixtures' randomisation rules)

QWEN3_EOS = [151645, 151643]  # <|im_end|>, <|endoftext|> of the Qwen3 tokenizer

PRESETS = {
    # Same layer pattern as Qwen3.8-Flash-Next (every 4th layer QSA, PLE on layer 1), mid-size.
    "mid": dict(
        vocab_size=151936,
        hidden_size=1024,
        num_hidden_layers=8,
        full_attention_interval=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=64,
        indexer_budget=512,
        indexer_compress_ratio=4,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=8,
        linear_num_value_heads=16,
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        norm_topk_prob=True,
        hc_count=4,
        hc_lowrank=128,
        ple_layer_ids=[1],
        ple_embed_dim=1024,
        heads_per_ngram=8,
        ngram_size=3,
        ngram_vocab_size_base=10000,
        split_ngram_parts=4,
        ple_conv_kernel_size=4,
        eos_token_id=QWEN3_EOS,
        hidden_act="silu",
        rms_norm_eps=1e-6,
    ),
    # The same pattern, tiny: for testing this script on a CPU.
    "tiny": dict(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=4,
        full_attention_interval=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=16,
        indexer_compress_ratio=4,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        norm_topk_prob=True,
        hc_count=4,
        hc_lowrank=16,
        ple_layer_ids=[1],
        ple_embed_dim=64,
        heads_per_ngram=4,
        ngram_size=3,
        ngram_vocab_size_base=1000,
        split_ngram_parts=2,
        ple_conv_kernel_size=4,
        eos_token_id=[2],
        hidden_act="silu",
        rms_norm_eps=1e-6,
    ),
}

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def log(msg):
    print(msg, flush=True)


def have(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------------
def lc_prompt(n, seed, vocab, eos_ids):
    """tools/long_context.c lc_prompt: the same ids our tool feeds."""
    m = (1 << 64) - 1
    x = (0x9E3779B97F4A7C15 * (seed + 1)) & m
    eos = set(eos_ids)
    out = []
    for _ in range(n):
        while True:
            x = (x * 6364136223846793005 + 1442695040888963407) & m
            t = (x >> 33) % vocab
            if t not in eos:
                break
        out.append(t)
    return out


def eos_list(cfg):
    e = cfg.eos_token_id
    return [] if e is None else (list(e) if isinstance(e, (list, tuple)) else [e])


def build_and_save(cfg_kw, args, device):
    cfg = Qwen4ExpTextConfig(**cfg_kw)
    t0 = time.time()
    torch.manual_seed(args.seed)  # the reference's own init, overwritten below
    with torch.device(device):
        model = Qwen4ExpForCausalLM(cfg).float().eval()
    randomise(model, args.seed)
    # lm_head: logits of a short prompt with std ~3 (as the fixtures), computed in fp32
    n = min(args.tokens, 256)
    ids = torch.tensor([lc_prompt(n, args.prompt_seed + 1000, cfg.vocab_size, eos_list(cfg))], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    std = float(logits.std())
    if not math.isfinite(std) or std == 0:
        raise SystemExit(f"hf_baseline: the random model's fp32 logits are not usable (std {std})")
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0 / std)
    n_params = sum(p.numel() for p in model.parameters())
    t_build = time.time() - t0

    t0 = time.time()
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    if args.tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(args.tokenizer, f)
            if os.path.exists(src):
                shutil.copy(src, os.path.join(args.out, f))
    t_save = time.time() - t0
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    return cfg, n_params, size, t_build, t_save


# --------------------------------------------------------------------------------------------------
def one_run(model, ids, gen, device):
    """Prefill (fresh cache) + greedy decode. Returns (prefill_s, decode_s, tokens)."""
    cache = DynamicCache(config=model.config)
    sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    tok = out.logits[:, -1].argmax(-1)
    toks = [tok]
    sync(device)
    t1 = time.perf_counter()
    for _ in range(gen - 1):
        out = model(input_ids=tok.view(1, 1), past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1].argmax(-1)
        toks.append(tok)
    sync(device)
    t2 = time.perf_counter()
    nonfinite = int((~torch.isfinite(out.logits)).sum())
    return t1 - t0, t2 - t1, [int(t) for t in torch.cat(toks).tolist()], nonfinite


def time_reference(model, ids, args, device, budget_s):
    t_start = time.time()
    warm_gen = min(args.gen, 4)
    with torch.inference_mode():
        w = one_run(model, ids, warm_gen, device)
        log(f"    warm-up: prefill {w[0]:.3f} s, {warm_gen - 1} decode steps {w[1]:.3f} s")
        runs = []
        for r in range(args.reps):
            runs.append(one_run(model, ids, args.gen, device))
            p, d, _, nf = runs[-1]
            log(f"    rep {r + 1}: prefill {p:.3f} s ({len(ids[0]) / p:.1f} tok/s), decode {args.gen - 1} tokens "
                f"{d:.3f} s ({(args.gen - 1) / d if d > 0 else float('nan'):.1f} tok/s)")
            if time.time() - t_start > budget_s and r + 1 < args.reps:
                log(f"    (time budget {budget_s:.0f} s for this dtype reached: {r + 1} reps)")
                break
    p = statistics.median(x[0] for x in runs)
    d = statistics.median(x[1] for x in runs)
    toks = runs[-1][2]
    if any(x[2] != toks for x in runs):
        log("    note: the greedy tokens differ between reps (non-deterministic kernels)")
    return dict(
        reps=len(runs),
        prefill_s=p,
        ttft_s=p,
        prefill_tok_s=len(ids[0]) / p,
        decode_s=d,
        decode_tok_s=(args.gen - 1) / d if args.gen > 1 and d > 0 else None,
        prefill_s_all=[x[0] for x in runs],
        decode_s_all=[x[1] for x in runs],
        tokens=toks,
        nonfinite_last_logits=runs[-1][3],
    )


def reference(args, device, dtype_name, ids, budget_s):
    dt = DTYPES[dtype_name]
    kw = {}
    if args.attn:
        kw["attn_implementation"] = args.attn
    if args.experts:
        kw["experts_implementation"] = args.experts
    t0 = time.time()
    model = Qwen4ExpForCausalLM.from_pretrained(args.out, dtype=dt, **kw).to(device).eval()
    t_load = time.time() - t0
    impl = dict(attn=model.config._attn_implementation,
                experts=getattr(model.config, "_experts_implementation", None))
    log(f"  reference {dtype_name}: loaded in {t_load:.1f} s; attention {impl['attn']}, experts {impl['experts']}")
    try:
        res = time_reference(model, ids, args, device, budget_s)
    except Exception as e:  # e.g. an experts kernel without this dtype: retry with the eager experts
        if impl["experts"] in (None, "eager"):
            raise
        log(f"    failed with experts {impl['experts']} ({type(e).__name__}: {e}); retrying with experts eager")
        model.set_experts_implementation("eager")
        impl["experts"] = "eager"
        res = time_reference(model, ids, args, device, budget_s)
    res.update(impl=impl, load_s=t_load)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def ours(args, backend):
    cmd = [args.ours, "--model", args.out, "--backend", backend, "--tokens", str(args.tokens),
           "--chunk", str(args.chunk), "--gen", str(args.gen)] + args.ours_arg
    log(f"  ours: {' '.join(cmd)}")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ours_timeout)
    except subprocess.TimeoutExpired:
        log(f"  ours: timed out after {args.ours_timeout} s")
        return dict(cmd=cmd, rc=None, error="timeout")
    wall = time.time() - t0
    out = p.stdout
    for line in out.splitlines():
        log(f"    | {line}")
    if p.returncode != 0:
        for line in p.stderr.splitlines()[-15:]:
            log(f"    ! {line}")

    def num(pat):
        m = re.search(pat, out)
        return float(m.group(1)) if m else None

    r = dict(cmd=cmd, rc=p.returncode, wall_s=wall,
             ttft_s=num(r"time to first token\s+([0-9.]+) s"),
             prefill_tok_s=num(r"\n\s*prefill\s+([0-9.]+) tok/s"),
             prefill_s=num(r"\n\s*prefill\s+[0-9.]+ tok/s \(\d+ tokens in ([0-9.]+) s"),
             decode_tok_s=num(r"\n\s*decode\s+([0-9.]+) tok/s"),
             decode_s=num(r"\n\s*decode\s+[0-9.]+ tok/s \(\d+ tokens after the first in ([0-9.]+) s"),
             load_s=num(r"loaded in ([0-9.]+) s"))
    m = re.search(r"tokens fnv1a 0x[0-9a-f]+:([0-9 ]*)", out)
    r["tokens"] = [int(t) for t in m.group(1).split()] if m else []
    m = re.search(r"backend( on .*?)?, model", out)
    r["device"] = m.group(1)[4:] if m and m.group(1) else None
    r["status"] = "PASS" if "long_context: PASS" in out else ("FAIL" if "long_context: FAIL" in out else "?")
    if r["prefill_tok_s"] is None or r["decode_tok_s"] is None:
        r["error"] = f"could not parse the output (exit {p.returncode})"
    return r


def same_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


# --------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="model directory to write (replaced if it exists)")
    ap.add_argument("--preset", default="mid", choices=sorted(PRESETS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a Qwen4ExpTextConfig field, e.g. --set hidden_size=512 --set ple_layer_ids=[1]")
    ap.add_argument("--seed", type=int, default=9009, help="weight seed")
    ap.add_argument("--prompt-seed", type=int, default=1, help="long_context's --seed (default 1, its default)")
    ap.add_argument("--tokens", type=int, default=2048, help="prompt tokens P")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens G (>= 2)")
    ap.add_argument("--chunk", type=int, default=8192, help="our scheduler's prefill chunk")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per dtype after one warm-up (median)")
    ap.add_argument("--max-seconds", type=float, default=150.0,
                    help="time budget for the reference timings (split over the dtypes; at least one rep each)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="reference dtypes (bfloat16, float16, float32)")
    ap.add_argument("--attn", default=None, help="reference attn_implementation (default: its own, sdpa)")
    ap.add_argument("--experts", default=None, help="reference experts_implementation (default: its own)")
    ap.add_argument("--tokenizer", default=None, help="directory whose tokenizer.json/tokenizer_config.json to copy")
    ap.add_argument("--ours", default=None, help="path of tools/long_context: run it on the saved model")
    ap.add_argument("--ours-arg", action="append", default=[], help="extra argument for our tool (repeatable)")
    ap.add_argument("--ours-timeout", type=int, default=300)
    ap.add_argument("--no-build", action="store_true", help="reuse the model already in --out")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.gen < 2:
        ap.error("--gen must be at least 2")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d}")

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hf_baseline: CUDA is not available to torch (use --device cpu for a smoke test)")
    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device)
        dev_name = f"{torch.cuda.get_device_name(device)} (cc {'.'.join(map(str, torch.cuda.get_device_capability(device)))})"
    else:
        dev_name = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    env = dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
               cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
               device=dev_name, fla=have("fla"), causal_conv1d=have("causal_conv1d"), kernels=have("kernels"))
    log(f"hf_baseline: python {env['python']}, torch {env['torch']} (CUDA {env['cuda']}), transformers "
        f"{env['transformers']}; device {dev_name}")
    log(f"  optional kernels: fla {env['fla']}, causal_conv1d {env['causal_conv1d']} (without them the reference "
        f"runs its torch GDN / conv fallbacks)")

    cfg_kw = dict(PRESETS[args.preset])
    for s in args.set:
        k, _, v = s.partition("=")
        try:
            cfg_kw[k] = json.loads(v)
        except json.JSONDecodeError:
            cfg_kw[k] = v
    cfg_kw["max_position_embeddings"] = max(cfg_kw.get("max_position_embeddings", 0), 4096,
                                            args.tokens + args.gen)
    if args.tokenizer:
        with open(os.path.join(args.tokenizer, "tokenizer.json")) as f:
            tj = json.load(f)
        n_tok = max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj.get("added_tokens", [])]) + 1
        if n_tok > cfg_kw["vocab_size"]:
            raise SystemExit(f"hf_baseline: the tokenizer has {n_tok} ids, more than vocab_size {cfg_kw['vocab_size']}")

    t_all = time.time()
    if args.no_build:
        cfg = Qwen4ExpTextConfig.from_pretrained(args.out)
        n_params, size, t_build, t_save = None, None, 0.0, 0.0
    else:
        cfg, n_params, size, t_build, t_save = build_and_save(cfg_kw, args, device)
    lt = "".join("Q" if t == "qwen_sparse_attention" else "L" for t in cfg.layer_types)
    log(f"  model: {lt} ({cfg.num_hidden_layers} layers), hidden {cfg.hidden_size}, {cfg.num_attention_heads} q / "
        f"{cfg.num_key_value_heads} kv heads of {cfg.head_dim}, GDN {cfg.linear_num_key_heads} k / "
        f"{cfg.linear_num_value_heads} v heads of {cfg.linear_key_head_dim}/{cfg.linear_value_head_dim}, indexer "
        f"{cfg.indexer_n_heads} x {cfg.indexer_head_dim} budget {cfg.indexer_budget} r {cfg.indexer_compress_ratio}, "
        f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok} of {cfg.moe_intermediate_size} + shared "
        f"{cfg.shared_expert_intermediate_size}, vocab {cfg.vocab_size}, hc {cfg.hc_count} (rank {cfg.hc_lowrank}), "
        f"PLE layers {cfg.ple_layer_ids} (dim {cfg.ple_embed_dim}, ngram base {cfg.ngram_vocab_size_base})")
    if n_params is not None:
        log(f"  built in {t_build:.1f} s ({n_params / 1e6:.1f} M parameters), saved as bfloat16 in {t_save:.1f} s: "
            f"{args.out} ({size / 2**20:.1f} MiB)")
    log(f"  request: {args.tokens} prompt tokens (long_context's prompt, seed {args.prompt_seed}), {args.gen} "
        f"generated greedily, batch 1")

    ids = torch.tensor([lc_prompt(args.tokens, args.prompt_seed, cfg.vocab_size, eos_list(cfg))], device=device)
    results = []
    budget = args.max_seconds / max(1, len(dtypes))
    for d in dtypes:
        try:
            r = reference(args, device, d, ids, budget)
            r.update(impl_name="HF reference", dtype=d)
        except Exception as e:
            log(f"  reference {d}: FAILED: {type(e).__name__}: {e}")
            r = dict(impl_name="HF reference", dtype=d, error=f"{type(e).__name__}: {e}")
        results.append(r)
    if args.ours:
        backend = "cuda" if device.type == "cuda" else "cpu"
        r = ours(args, backend)
        r.update(impl_name="qsa_runtime long_context",
                 dtype="fp16 weights+activations" if backend == "cuda" else "fp32 (bf16 weights)")
        results.append(r)

    # ---- table ----
    first = next((r["tokens"] for r in results if r.get("tokens")), None)
    log("")
    log(f"### Batch 1, {args.tokens}-token prompt, {args.gen} greedy tokens; {dev_name}")
    log("")
    log(f"| implementation | dtype | prefill tok/s | TTFT s | decode tok/s | decode ms/token | "
        f"first tokens = row 1 (of {min(8, args.gen)}) | note |")
    log("|---|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        ms = 1000.0 / r["decode_tok_s"] if r.get("decode_tok_s") else None
        match = None
        if r.get("tokens") and first:
            match = same_prefix(r["tokens"][:8], first[:8])
        note = r.get("error", "")
        if r.get("impl"):
            note = f"attn {r['impl']['attn']}, experts {r['impl']['experts']}, {r['reps']} reps" + (
                f"; {r['nonfinite_last_logits']} non-finite logits" if r.get("nonfinite_last_logits") else "")
        elif r["impl_name"].startswith("qsa") and "error" not in r:
            note = f"exit {r['rc']}, {r['status']}"
        log(f"| {r['impl_name']} | {r['dtype']} | {fmt(r.get('prefill_tok_s'), '.1f')} | {fmt(r.get('ttft_s'), '.3f')} | "
            f"{fmt(r.get('decode_tok_s'), '.1f')} | {fmt(ms, '.2f')} | {fmt(match, 'd')} | {note} |")
    ref = [r for r in results if r["impl_name"] == "HF reference" and r.get("decode_tok_s")]
    our = [r for r in results if r["impl_name"].startswith("qsa") and r.get("decode_tok_s")]
    if ref and our:
        b = max(ref, key=lambda r: r["decode_tok_s"])
        bp = max(ref, key=lambda r: r["prefill_tok_s"])
        o = our[0]
        log("")
        log(f"ours / best reference: prefill x{o['prefill_tok_s'] / bp['prefill_tok_s']:.2f} (vs {bp['dtype']}), "
            f"decode x{o['decode_tok_s'] / b['decode_tok_s']:.2f} (vs {b['dtype']})")
    log(f"total {time.time() - t_all:.1f} s")

    if args.json:
        doc = dict(tool="tools/hf_baseline.py", argv=sys.argv, env=env, preset=args.preset,
                   config=cfg.to_dict(), tokens=args.tokens, gen=args.gen, chunk=args.chunk,
                   n_params=n_params, checkpoint_bytes=size, build_s=t_build, save_s=t_save,
                   date=time.strftime("%Y-%m-%d %H:%M:%S"), results=results)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
            f.write("\n")
        log(f"wrote {args.json}")
    bad = [r for r in results if "error" in r]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
