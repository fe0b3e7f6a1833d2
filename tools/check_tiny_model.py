#!/usr/bin/env python3
"""Check the tiny model written by tools/make_tiny_model against the reference (transformers 5.17).

    python3 tools/check_tiny_model.py models/tiny

Checks:
  * tokenizer.json loads with `tokenizers`, its pre-tokenizer is the Qwen2/3 one (compared with
    ../shared/data/qwen3-tokenizer/tokenizer.json when present), text round-trips, special tokens
    keep their ids, and the learned merges actually compress English text;
  * the tokenizer directory loads with transformers' AutoTokenizer and the chat template renders ChatML;
  * model.safetensors holds exactly the tensors (names, shapes, order) that the reference
    `Qwen4ExpForCausalLM.save_pretrained` writes for config.json, with BF16 weights and the int64 PLE
    buffers equal to the values the reference computes;
  * `from_pretrained(..., dtype=float32)` reports no missing / unexpected / mismatched keys and a
    forward pass gives finite, non-degenerate logits; cached greedy decoding equals the full forward.
Not run by make (needs torch + transformers); exits non-zero on the first failed check.
"""
import json
import os
import struct
import sys
import tempfile

import torch


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def ok(msg):
    print("ok  ", msg)


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        raw = f.read(n)
    return n, json.loads(raw)


def check_tokenizer(d, cfg):
    from tokenizers import Tokenizer

    tj = json.load(open(os.path.join(d, "tokenizer.json")))
    ref = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "qwen3-tokenizer",
                       "tokenizer.json")
    if not os.path.exists(ref):
        ref = "/work/shared/data/qwen3-tokenizer/tokenizer.json"
    if os.path.exists(ref):
        q = json.load(open(ref))
        for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
            if tj[key] != q[key]:
                fail(f"tokenizer.json {key} differs from Qwen3's: {tj[key]} vs {q[key]}")
        ok("normalizer / pre_tokenizer / decoder / post_processor identical to the Qwen3 tokenizer.json")
    else:
        print("skip  Qwen3 tokenizer.json not found; pre_tokenizer not compared")

    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab != cfg["vocab_size"]:
        fail(f"tokenizer size {vocab} != config vocab_size {cfg['vocab_size']}")
    n_merges = len(tj["model"]["merges"])
    ok(f"tokenizer loads: {vocab} tokens ({len(tj['model']['vocab'])} BPE incl. 256 bytes, {n_merges} merges, "
       f"3 special)")
    ids = {s: tok.token_to_id(s) for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    if ids["<|im_end|>"] != cfg["eos_token_id"][0] or ids["<|endoftext|>"] != cfg["eos_token_id"][1]:
        fail(f"special ids {ids} do not match eos_token_id {cfg['eos_token_id']}")
    ok(f"special tokens {ids}")

    samples = [
        "Hello! How are you doing today? I'm fine, thanks.",
        "def total(numbers):\n    return sum(numbers)  # 42\n\n\n",
        "The weather tomorrow will be cold and rainy; take an umbrella.",
        "Unicode: café, naïve, 日本語, emoji 🙂 and tabs\tand  double  spaces.",
    ]
    total_bytes = total_tokens = 0
    for s in samples:
        enc = tok.encode(s)
        back = tok.decode(enc.ids)
        if back != s:
            fail(f"round trip failed: {s!r} -> {back!r}")
        if s.isascii():
            total_bytes += len(s.encode())
            total_tokens += len(enc.ids)
    print("      e.g.", tok.encode(samples[0]).tokens)
    ok(f"round trip of {len(samples)} samples; ASCII compression {total_bytes / total_tokens:.2f} bytes/token")
    if total_bytes / total_tokens < 2.0:
        fail("merges do not compress English text (< 2 bytes/token)")
    chat = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    e = tok.encode(chat).ids
    if e[0] != ids["<|im_start|>"] or ids["<|im_end|>"] not in e:
        fail(f"special tokens not recognised in {chat!r}: {e}")
    ok(f"ChatML text encodes with special tokens: {e}")

    from transformers import AutoTokenizer

    at = AutoTokenizer.from_pretrained(d)
    msgs = [{"role": "user", "content": "Hi there"}]
    rendered = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    want = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    if rendered != want:
        fail(f"chat template renders {rendered!r}, expected {want!r}")
    if at.eos_token != "<|im_end|>" or at.bos_token is not None:
        fail(f"eos/bos tokens: {at.eos_token!r} {at.bos_token!r}")
    if at(want)["input_ids"] != tok.encode(want).ids:
        fail("AutoTokenizer and tokenizers disagree")
    ok(f"AutoTokenizer ({type(at).__name__}) loads; chat template renders ChatML")
    return tok


def check_tensors(d, cfg):
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    hlen, hdr = read_header(os.path.join(d, "model.safetensors"))
    if hlen % 8:
        fail(f"safetensors header length {hlen} not a multiple of 8")
    if hdr.get("__metadata__") != {"format": "pt"}:
        fail(f"__metadata__ is {hdr.get('__metadata__')}")
    ours = {k: v for k, v in hdr.items() if k != "__metadata__"}
    end = 0
    for k, v in ours.items():
        a, b = v["data_offsets"]
        if a != end:
            fail(f"{k}: data not contiguous ({a} != {end})")
        end = b
        want_dtype = "I64" if k.endswith(("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes")) \
            else "BF16"
        if v["dtype"] != want_dtype:
            fail(f"{k}: dtype {v['dtype']}, expected {want_dtype}")

    c = Qwen4ExpTextConfig.from_pretrained(d)
    torch.manual_seed(0)
    ref_model = Qwen4ExpForCausalLM(c)
    with tempfile.TemporaryDirectory() as tmp:
        ref_model.save_pretrained(tmp)
        _, ref_hdr = read_header(os.path.join(tmp, "model.safetensors"))
    ref = {k: v for k, v in ref_hdr.items() if k != "__metadata__"}
    missing = sorted(set(ref) - set(ours))
    extra = sorted(set(ours) - set(ref))
    if missing or extra:
        fail(f"tensor names differ from save_pretrained: missing {missing[:10]}, unexpected {extra[:10]}")
    for k in ref:
        if ref[k]["shape"] != ours[k]["shape"]:
            fail(f"{k}: shape {ours[k]['shape']}, save_pretrained writes {ref[k]['shape']}")
    order_same = list(ref) == list(ours)
    ok(f"{len(ours)} tensors: names and shapes identical to save_pretrained "
       f"(header order {'identical' if order_same else 'differs'})")

    from safetensors.torch import load_file

    st = load_file(os.path.join(d, "model.safetensors"))
    sd = ref_model.state_dict()
    nbuf = 0
    for k, v in st.items():
        if v.dtype == torch.int64:
            if not torch.equal(v, sd[k]):
                fail(f"{k}: {v.tolist()} but the reference computes {sd[k].tolist()}")
            print(f"      {k} = {v.tolist()}")
            nbuf += 1
        else:
            f = v.float()
            if not torch.isfinite(f).all() or f.abs().max() > 60000:
                fail(f"{k}: non-finite or not FP16-representable values")
    ok(f"{nbuf} int64 PLE buffers equal the reference's; all BF16 weights finite and within FP16 range")
    return list(ours)


def check_forward(d, tok, cfg):
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM

    model, info = Qwen4ExpForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        fail(f"from_pretrained loading info not clean: {bad}")
    ok("from_pretrained(dtype=float32): no missing / unexpected / mismatched keys")
    model.eval()

    text = ("<|im_start|>user\nHello! Could you tell me a short story about a fox and a girl who lived near "
            "the forest?<|im_end|>\n<|im_start|>assistant\n")
    ids = torch.tensor([tok.encode(text).ids])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_router_logits=True, use_cache=False)
    logits = out.logits
    if not torch.isfinite(logits).all():
        fail("non-finite logits")
    T = ids.shape[1]
    hs = [h.float() for h in out.hidden_states]
    rms = ["%.2f" % h.pow(2).mean().sqrt().item() for h in hs]
    lg = logits[0]
    top2 = lg.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    ok(f"forward on {T} tokens (> indexer_budget={cfg['indexer_budget']}, so QSA selects): logits finite, "
       f"std {lg.std().item():.3f}, |max| {lg.abs().max().item():.2f}, min top1-top2 margin "
       f"{margin.min().item():.2e}, distinct argmax {lg.argmax(-1).unique().numel()}")
    print("      hidden-state rms per layer:", " ".join(rms))
    k = cfg["num_experts_per_tok"]
    used = [torch.bincount(r.topk(k, dim=-1).indices.flatten(), minlength=cfg["num_experts"]).tolist()
            for r in out.router_logits]
    print("      routed tokens per expert, per layer:", used)
    if any(sum(1 for x in u if x) < cfg["num_experts"] // 2 for u in used):
        fail("routing collapsed onto few experts")

    # greedy decode with the cache must equal argmax of the full forward
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=cfg["eos_token_id"][1])
        full = model(gen, use_cache=False).logits[0]
    new = gen[0, T:]
    want = full[T - 1:-1].argmax(-1)
    if not torch.equal(new, want):
        fail(f"cached greedy decode {new.tolist()} != full-forward argmax {want.tolist()}")
    ok(f"cached greedy decode of 12 tokens equals full-forward argmax: {new.tolist()}")
    print("      decoded:", repr(tok.decode(new.tolist())))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    gc = json.load(open(os.path.join(d, "generation_config.json")))
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    print(f"config: {cfg['num_hidden_layers']} layers {cfg['layer_types']}, hidden {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}, experts {cfg['num_experts']} top-{cfg['num_experts_per_tok']}, "
          f"hc {cfg['hc_count']}, PLE layers {cfg['ple_layer_ids']}")
    if gc["eos_token_id"] != cfg["eos_token_id"] or tc["eos_token"] != "<|im_end|>":
        fail("eos ids differ between config.json, generation_config.json and tokenizer_config.json")
    tok = check_tokenizer(d, cfg)
    check_tensors(d, cfg)
    check_forward(d, tok, cfg)
    print("ALL CHECKS PASSED")


if __name__ == "__main__":
    main()
