/* make_tiny_model.c - writes the built-in tiny Qwen4-Exp checkpoint used by tests, examples and CI.
 *
 *   tools/make_tiny_model OUT_DIR [--seed N] [--max-position-embeddings N]
 *   tools/make_tiny_model OUT_DIR --real-shape LAYERS [--ple-vocab-base N] [--seed N]
 *
 * --real-shape writes, instead of the tiny model, LAYERS layers of the real Qwen3.8-Flash-Next shape
 * (tools/bench's: hidden 2560, 512 experts of 640 in NVFP4 with ModelOpt's tensors and
 * hf_quant_config.json, vocabulary 248,320, context 262,144) with the same tokenizer: a checkpoint to
 * time the real loader with and to run the real shape end to end (tools/long_context --model DIR).
 * Each tensor is drawn when it is written, so memory stays at one tensor (~1.3 GB for lm_head).
 * --max-position-embeddings sets the context the config announces (default 4096; tools/long_context
 * uses it for requests of 262,144 tokens).  Nothing else depends on it: the weights are the same.
 *
 * OUT_DIR receives config.json, generation_config.json, model.safetensors, tokenizer.json and
 * tokenizer_config.json. Nothing is downloaded: the tokenizer is a byte-level BPE learned here on an
 * embedded corpus, the weights come from a seeded PRNG. For a given seed the output bytes are always
 * the same (integer PRNG, no libm calls on the weight path except log() for A_log, which is rounded
 * to BF16 afterwards).
 *
 * The tensor names and shapes are exactly what transformers 5.17 `Qwen4ExpForCausalLM.save_pretrained`
 * writes for the same config (per-expert MoE weights, `ngram_embedding.shard_{i}.weight`, the three
 * int64 PLE buffers). tools/check_tiny_model.py loads the result with the reference and checks it.
 *
 * Build: gcc -std=c11 -O2 -Wall -Wextra -Werror -o tools/make_tiny_model tools/make_tiny_model.c -lm
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../examples/cli.h"

/* ------------------------------------------------------------------------------------------------ */
/* errors                                                                                            */

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "make_tiny_model: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory", NULL);
    return p;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) die("out of memory", NULL);
    return p;
}

/* ------------------------------------------------------------------------------------------------ */
/* the model configuration (one place; everything below derives from it)                            */

enum { TM_MAX_LAYERS = 64, TM_MAX_PLE = 8 };

typedef struct tm_config {
    int vocab_size; /* filled from the tokenizer: 256 bytes + merges + 3 special tokens */
    int hidden_size;
    int num_hidden_layers;
    int is_sparse_attention[TM_MAX_LAYERS]; /* 1 = qwen_sparse_attention, 0 = linear_attention */
    int num_attention_heads, num_key_value_heads, head_dim;
    double partial_rotary_factor;
    int linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim;
    int linear_conv_kernel_dim;
    int num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
    int hc_count, hc_lowrank;
    int ple_layer_ids[TM_MAX_PLE]; /* 1-indexed */
    int n_ple;
    int ple_embed_dim, ple_conv_kernel_size, ngram_size, heads_per_ngram;
    int ngram_vocab_size_base, make_ngram_vocab_size_divisible_by, seed, split_ngram_parts;
    int indexer_n_heads, indexer_kv_heads, indexer_head_dim, indexer_budget, indexer_compress_ratio;
    int max_position_embeddings;
    int eos_im_end, eos_endoftext; /* token ids, filled from the tokenizer */
    int nvfp4_experts;             /* routed experts in NVFP4 (ModelOpt), else BF16 */
} tm_config;

static void tm_config_init(tm_config *c)
{
    memset(c, 0, sizeof(*c));
    c->hidden_size = 64;
    c->num_hidden_layers = 6;
    /* GDN, GDN, GDN, QSA, GDN, QSA: two QSA layers, a GDN layer after a QSA layer */
    c->is_sparse_attention[3] = 1;
    c->is_sparse_attention[5] = 1;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->head_dim = 16;
    c->partial_rotary_factor = 0.5;
    c->linear_num_key_heads = 2;
    c->linear_num_value_heads = 4;
    c->linear_key_head_dim = 16;
    c->linear_value_head_dim = 16;
    c->linear_conv_kernel_dim = 4;
    c->num_experts = 8;
    c->num_experts_per_tok = 2;
    c->moe_intermediate_size = 32;
    c->shared_expert_intermediate_size = 32;
    c->hc_count = 2;
    c->hc_lowrank = 16;
    /* two PLE layers so that ple_layer_index > 0 (other primes and multipliers) is exercised */
    c->ple_layer_ids[0] = 1;
    c->ple_layer_ids[1] = 5;
    c->n_ple = 2;
    c->ple_embed_dim = 32;
    c->ple_conv_kernel_size = 4;
    c->ngram_size = 3;
    c->heads_per_ngram = 2;
    c->ngram_vocab_size_base = 1000;
    c->make_ngram_vocab_size_divisible_by = 128;
    c->seed = 1234;
    c->split_ngram_parts = 2;
    c->indexer_n_heads = 2;
    c->indexer_kv_heads = 1;
    c->indexer_head_dim = 16;
    c->indexer_budget = 16;
    c->indexer_compress_ratio = 4;
    c->max_position_embeddings = 4096;
}

/* --real-shape: issue 9's Qwen3.8-Flash-Next shape (tools/bench's) with `layers` layers of its
   pattern (3 GDN, then 1 QSA), NVFP4 experts, and the PLE table's n-gram vocabulary base
   `ple_base` (the real 20,000,000 makes a ~100 GB table; tools/bench uses 100,000).  The vocabulary
   stays the real 248,320 rows; the tokenizer is this tool's (ids past it are never produced). */
static void tm_config_real(tm_config *c, int layers, int ple_base)
{
    int max_pos = c->max_position_embeddings;
    memset(c, 0, sizeof(*c));
    c->hidden_size = 2560;
    c->num_hidden_layers = layers;
    for (int l = 0; l < layers; ++l) c->is_sparse_attention[l] = (l + 1) % 4 == 0;
    c->num_attention_heads = 24;
    c->num_key_value_heads = 2;
    c->head_dim = 256;
    c->partial_rotary_factor = 0.25;
    c->linear_num_key_heads = 16;
    c->linear_num_value_heads = 48;
    c->linear_key_head_dim = 128;
    c->linear_value_head_dim = 128;
    c->linear_conv_kernel_dim = 4;
    c->num_experts = 512;
    c->num_experts_per_tok = 10;
    c->moe_intermediate_size = 640;
    c->shared_expert_intermediate_size = 640;
    c->hc_count = 4;
    c->hc_lowrank = 320;
    c->ple_layer_ids[0] = 1;
    c->n_ple = layers >= 1;
    c->ple_embed_dim = 2560; /* the reference's defaults from here on */
    c->ple_conv_kernel_size = 4;
    c->ngram_size = 3;
    c->heads_per_ngram = 8;
    c->ngram_vocab_size_base = ple_base;
    c->make_ngram_vocab_size_divisible_by = 128;
    c->seed = 1234;
    c->split_ngram_parts = 512;
    c->indexer_n_heads = 4;
    c->indexer_kv_heads = 1;
    c->indexer_head_dim = 128;
    c->indexer_budget = 2048;
    c->indexer_compress_ratio = 4;
    c->max_position_embeddings = max_pos;
    c->nvfp4_experts = 1;
}

/* ------------------------------------------------------------------------------------------------ */
/* embedded tokenizer training corpus (plain ASCII; written for this tool)                           */

static const char *const tm_corpus[] = {
    "Hello! How are you doing today? I'm doing well, thank you for asking.",
    "Hi there. Could you help me with something? Of course, I would be happy to help you.",
    "What would you like to talk about? We can talk about anything you want.",
    "Good morning. The weather is nice today, isn't it? Yes, the sun is shining and the sky is blue.",
    "It was raining all day yesterday, so we stayed at home and watched a movie together.",
    "I think it will be cold tomorrow. You should take a warm coat and maybe an umbrella.",
    "Thank you very much for your help. You're welcome! Let me know if there is anything else.",
    "Can you explain how this works? Sure. First, the program reads the input file. Then it",
    "splits the text into words, counts them, and finally prints the most common words.",
    "Where do you live? I live in a small town near the sea. There is a harbour, a market and",
    "a little library where people meet in the evening to read and talk.",
    "My favourite food is pasta with tomato sauce. I also like fresh bread, cheese and fruit.",
    "To make a simple tomato sauce, heat some olive oil in a pan, add chopped garlic and onion,",
    "cook them for a few minutes, then add the tomatoes, salt and pepper. Let it simmer for",
    "twenty minutes and stir from time to time. Serve it with pasta and a little cheese.",
    "Do you know what time it is? It is a quarter past three in the afternoon.",
    "The meeting starts at 10:30 on Monday, March 4, 2024, and it should end before 12:00.",
    "There are 7 days in a week, 12 months in a year and 365 days in most years.",
    "The train leaves at 8:15 from platform 2. Please arrive at least 10 minutes early.",
    "Once upon a time, there was a young girl who lived at the edge of a great forest.",
    "Every morning she walked to the river to fetch water, and every evening she told her",
    "little brother a story about the animals that lived among the old trees.",
    "One day she found a small fox with a hurt leg. She carried it home, cleaned the wound",
    "and gave it some water. After a week the fox could walk again, and it followed her",
    "everywhere she went. The people of the village called them the girl and her shadow.",
    "The assistant should answer questions clearly and honestly. If it does not know the",
    "answer, it should say so, and it should never make up facts or sources.",
    "Please summarize the following text in three sentences. The text describes how the",
    "city changed over the last hundred years: the roads, the buildings and the way people",
    "work and travel. Today most people take the bus or ride a bicycle to work.",
    "Why is the sky blue? Sunlight contains all colours. When it passes through the air,",
    "the blue light is scattered more than the red light, so we see blue light coming from",
    "every part of the sky. At sunset the light travels through more air, and the sky turns",
    "orange and red.",
    "What is the difference between weather and climate? Weather is what happens on a",
    "particular day, while climate is the average pattern of weather over many years.",
    "I am learning to program. Which language should I start with? Many people start with",
    "Python because it is easy to read. Others like C because it shows how the computer",
    "really works. The best choice depends on what you want to build.",
    "Here is a small Python function that returns the sum of a list of numbers:",
    "",
    "def total(numbers):",
    "    result = 0",
    "    for n in numbers:",
    "        result += n",
    "    return result",
    "",
    "print(total([1, 2, 3, 4]))  # prints 10",
    "",
    "And here is the same idea in C:",
    "",
    "#include <stdio.h>",
    "",
    "int total(const int *numbers, int count) {",
    "    int result = 0;",
    "    for (int i = 0; i < count; i++) {",
    "        result += numbers[i];",
    "    }",
    "    return result;",
    "}",
    "",
    "int main(void) {",
    "    int values[4] = {1, 2, 3, 4};",
    "    printf(\"%d\\n\", total(values, 4));",
    "    return 0;",
    "}",
    "",
    "A class in Python can hold data and the functions that work on it:",
    "",
    "class Counter:",
    "    def __init__(self):",
    "        self.counts = {}",
    "",
    "    def add(self, word):",
    "        self.counts[word] = self.counts.get(word, 0) + 1",
    "",
    "    def most_common(self, k=3):",
    "        items = sorted(self.counts.items(), key=lambda item: -item[1])",
    "        return items[:k]",
    "",
    "if __name__ == \"__main__\":",
    "    counter = Counter()",
    "    for word in \"the cat sat on the mat with the hat\".split():",
    "        counter.add(word)",
    "    print(counter.most_common())",
    "",
    "A configuration file is often written in JSON:",
    "",
    "{\"name\": \"tiny\", \"layers\": 6, \"hidden_size\": 64, \"enabled\": true, \"tags\": [\"test\", \"demo\"]}",
    "",
    "To build the project, open a terminal and run these commands:",
    "",
    "$ git clone https://example.com/project.git",
    "$ cd project",
    "$ make && make test",
    "",
    "If the build fails, read the error message carefully. It usually names the file and the",
    "line where the problem is. Fix the first error first, because later errors are often",
    "caused by the first one.",
    "Could you recommend a good book? I enjoyed a novel about a family that sailed around the",
    "world in a small boat. It is funny and sad at the same time, and the writing is beautiful.",
    "What did you do last weekend? We went hiking in the mountains. The path was steep, but",
    "the view from the top was worth it. We had lunch by a lake and came back before dark.",
    "How do I stay focused while working? Try to work in short sessions of twenty five",
    "minutes, then take a short break. Turn off notifications and keep a list of the tasks",
    "you want to finish today. It also helps to sleep well and drink enough water.",
    "Let's plan a small party for Saturday. We need drinks, some snacks, music and a cake.",
    "Who will bring the cake? I will bake it myself. What kind of cake do you like? Chocolate,",
    "of course! Great, then I'll make a chocolate cake with strawberries on top.",
    "The quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly.",
    "Numbers can be written as digits, like 42 or 3.14159, or as words, like forty two.",
    "The function returned an error: file not found. Please check that the path is correct",
    "and that you have permission to read the file.",
    "Thanks for the conversation. It was nice talking to you. Have a wonderful day, and see",
    "you next time! Goodbye.",
    "system: You are a helpful assistant.",
    "user: Write a short poem about the sea.",
    "assistant: The sea is wide, the sea is deep, it sings the sailors off to sleep; it",
    "carries ships from shore to shore, and whispers stories evermore.",
    "user: What is two plus two? assistant: Two plus two is four.",
    "user: Translate good night into French. assistant: Good night in French is bonne nuit.",
    "user: Is it safe to eat raw chicken? assistant: No. Raw chicken can carry bacteria that",
    "make people sick, so it should always be cooked until it is hot all the way through.",
    "user: Give me three tips for learning a new language. assistant: Practice a little every",
    "day, listen to native speakers as often as you can, and do not be afraid of mistakes,",
    "because making mistakes is how everyone learns.",
    "The library opens at nine in the morning and closes at six in the evening. On Sundays it",
    "is closed. Children can borrow up to five books at a time, and adults can borrow ten.",
    "Scientists study the world by asking questions, making careful observations and testing",
    "their ideas with experiments. When the results do not match the idea, they change it.",
    "Water boils at 100 degrees Celsius at sea level, and it freezes at 0 degrees.",
    "The heart pumps blood through the body. Blood carries oxygen from the lungs to every",
    "cell, and it brings carbon dioxide back to the lungs so that we can breathe it out.",
    "Please remember to save your work often, and keep a backup copy of important files.",
};

/* ------------------------------------------------------------------------------------------------ */
/* byte-level BPE trainer                                                                            */

/* GPT-2 bytes_to_unicode: printable bytes map to themselves, the other 68 bytes to U+0100.. in order */
static void tm_byte_to_unicode(unsigned cp_of_byte[256])
{
    int n = 0;
    for (int b = 0; b < 256; ++b) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of_byte[b] = printable ? (unsigned)b : (unsigned)(256 + n++);
    }
}

typedef struct tm_tokenizer {
    int n_tokens;          /* BPE vocabulary (bytes + merged tokens) */
    unsigned char **bytes; /* token id -> its byte string */
    int *len;
    int n_merges;
    int (*merges)[2]; /* merge rank -> (left id, right id) */
    int id_of_byte[256];
} tm_tokenizer;

typedef struct tm_word {
    int *sym;
    int n;
    int freq;
    const char *text; /* for dedupe */
    int text_len;
} tm_word;

static int tm_is_letter(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int tm_is_digit(int c) { return c >= '0' && c <= '9'; }
static int tm_is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int tm_is_nl(int c) { return c == '\n' || c == '\r'; }
static int tm_is_punct(int c) { return c && !tm_is_space(c) && !tm_is_letter(c) && !tm_is_digit(c); }

/* Length of the next pre-token of the Qwen2/3 split regex at s (ASCII text):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static int tm_pretoken_len(const char *s)
{
    int c0 = (unsigned char)s[0];
    if (c0 == '\'') {
        static const char *const sfx[] = {"s", "t", "re", "ve", "m", "ll", "d"};
        for (int i = 0; i < 7; ++i) {
            int k = (int)strlen(sfx[i]), ok = 1;
            for (int j = 0; j < k; ++j) {
                int c = (unsigned char)s[1 + j];
                if (c == 0 || (c | 0x20) != sfx[i][j]) { ok = 0; break; }
            }
            if (ok) return 1 + k;
        }
    }
    if (tm_is_letter(c0) || (!tm_is_nl(c0) && !tm_is_letter(c0) && !tm_is_digit(c0) && tm_is_letter((unsigned char)s[1]))) {
        int i = tm_is_letter(c0) ? 0 : 1;
        while (tm_is_letter((unsigned char)s[i])) ++i;
        return i;
    }
    if (tm_is_digit(c0)) return 1;
    {
        int i = (c0 == ' ') ? 1 : 0;
        if (tm_is_punct((unsigned char)s[i])) {
            while (tm_is_punct((unsigned char)s[i])) ++i;
            while (tm_is_nl((unsigned char)s[i])) ++i;
            return i;
        }
    }
    /* whitespace run */
    {
        int n = 0, last_nl = -1;
        while (tm_is_space((unsigned char)s[n])) {
            if (tm_is_nl((unsigned char)s[n])) last_nl = n;
            ++n;
        }
        if (n == 0) return 1; /* cannot happen for ASCII input */
        if (last_nl >= 0) return last_nl + 1;   /* \s*[\r\n]+ */
        if (s[n] == 0) return n;                /* \s+(?!\S) at end of text */
        if (n > 1) return n - 1;                /* \s+(?!\S): leave one space for the next word */
        return 1;                               /* \s+ */
    }
}

static void tm_add_word(tm_word **words, int *n_words, int *cap, const char *s, int n)
{
    for (int i = 0; i < *n_words; ++i)
        if ((*words)[i].text_len == n && memcmp((*words)[i].text, s, (size_t)n) == 0) {
            (*words)[i].freq++;
            return;
        }
    if (*n_words == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        tm_word *nw = (tm_word *)realloc(*words, (size_t)*cap * sizeof(tm_word));
        if (!nw) die("out of memory", NULL);
        *words = nw;
    }
    tm_word *w = &(*words)[(*n_words)++];
    w->text = s;
    w->text_len = n;
    w->freq = 1;
    w->n = n;
    w->sym = (int *)xmalloc((size_t)n * sizeof(int));
}

/* Learns merges until the vocabulary holds target_tokens distinct tokens. Ties in pair frequency
 * go to the smaller (left id, right id) pair, so the result is fully deterministic. */
static void tm_train_bpe(tm_tokenizer *tk, const char *text, int target_tokens)
{
    unsigned cp[256];
    tm_byte_to_unicode(cp);
    /* base ids follow the unicode code point of the mapped character (GPT-2 / Qwen vocab order) */
    for (int b = 0; b < 256; ++b) {
        int rank = 0;
        for (int o = 0; o < 256; ++o) rank += cp[o] < cp[b];
        tk->id_of_byte[b] = rank;
    }
    tk->bytes = (unsigned char **)xcalloc((size_t)target_tokens, sizeof(unsigned char *));
    tk->len = (int *)xcalloc((size_t)target_tokens, sizeof(int));
    for (int b = 0; b < 256; ++b) {
        int id = tk->id_of_byte[b];
        tk->bytes[id] = (unsigned char *)xmalloc(1);
        tk->bytes[id][0] = (unsigned char)b;
        tk->len[id] = 1;
    }
    tk->n_tokens = 256;

    tm_word *words = NULL;
    int n_words = 0, cap = 0;
    for (const char *p = text; *p;) {
        int n = tm_pretoken_len(p);
        tm_add_word(&words, &n_words, &cap, p, n);
        p += n;
    }
    for (int i = 0; i < n_words; ++i)
        for (int j = 0; j < words[i].n; ++j) words[i].sym[j] = tk->id_of_byte[(unsigned char)words[i].text[j]];

    int max_merges = target_tokens * 2;
    tk->merges = (int (*)[2])xmalloc((size_t)max_merges * sizeof(int[2]));
    tk->n_merges = 0;
    int *counts = (int *)xcalloc((size_t)target_tokens * (size_t)target_tokens, sizeof(int));
    int *touched = (int *)xmalloc(sizeof(int) * 65536);
    int touched_cap = 65536;

    while (tk->n_tokens < target_tokens) {
        int n_touched = 0;
        for (int i = 0; i < n_words; ++i)
            for (int j = 0; j + 1 < words[i].n; ++j) {
                int key = words[i].sym[j] * target_tokens + words[i].sym[j + 1];
                if (counts[key] == 0) {
                    if (n_touched == touched_cap) {
                        touched_cap *= 2;
                        int *nt = (int *)realloc(touched, sizeof(int) * (size_t)touched_cap);
                        if (!nt) die("out of memory", NULL);
                        touched = nt;
                    }
                    touched[n_touched++] = key;
                }
                counts[key] += words[i].freq;
            }
        int best = -1, best_count = 0;
        for (int t = 0; t < n_touched; ++t) {
            int key = touched[t];
            if (counts[key] > best_count || (counts[key] == best_count && key < best)) {
                best = key;
                best_count = counts[key];
            }
        }
        for (int t = 0; t < n_touched; ++t) counts[touched[t]] = 0;
        if (best < 0) die("BPE corpus too small", "ran out of pairs before reaching the target vocabulary");
        if (tk->n_merges == max_merges) die("BPE training", "too many merges");

        int a = best / target_tokens, b = best % target_tokens;
        int nlen = tk->len[a] + tk->len[b];
        unsigned char *nb = (unsigned char *)xmalloc((size_t)nlen);
        memcpy(nb, tk->bytes[a], (size_t)tk->len[a]);
        memcpy(nb + tk->len[a], tk->bytes[b], (size_t)tk->len[b]);
        int id = -1;
        for (int t = 0; t < tk->n_tokens; ++t)
            if (tk->len[t] == nlen && memcmp(tk->bytes[t], nb, (size_t)nlen) == 0) { id = t; break; }
        if (id < 0) {
            id = tk->n_tokens++;
            tk->bytes[id] = nb;
            tk->len[id] = nlen;
        } else {
            free(nb); /* same string reached through another split: the merge maps to the old id */
        }
        tk->merges[tk->n_merges][0] = a;
        tk->merges[tk->n_merges][1] = b;
        tk->n_merges++;

        for (int i = 0; i < n_words; ++i) {
            tm_word *w = &words[i];
            int o = 0;
            for (int j = 0; j < w->n;) {
                if (j + 1 < w->n && w->sym[j] == a && w->sym[j + 1] == b) {
                    w->sym[o++] = id;
                    j += 2;
                } else {
                    w->sym[o++] = w->sym[j++];
                }
            }
            w->n = o;
        }
    }
    for (int i = 0; i < n_words; ++i) free(words[i].sym);
    free(words);
    free(counts);
    free(touched);
}

/* ------------------------------------------------------------------------------------------------ */
/* JSON output helpers                                                                               */

static void tm_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void tm_put_utf8(FILE *f, unsigned cp)
{
    if (cp < 0x80) {
        fputc((int)cp, f);
    } else if (cp < 0x800) {
        fputc((int)(0xC0 | (cp >> 6)), f);
        fputc((int)(0x80 | (cp & 0x3F)), f);
    } else {
        fputc((int)(0xE0 | (cp >> 12)), f);
        fputc((int)(0x80 | ((cp >> 6) & 0x3F)), f);
        fputc((int)(0x80 | (cp & 0x3F)), f);
    }
}

/* a token as a JSON string in the byte-level alphabet */
static void tm_json_token(FILE *f, const unsigned char *b, int n)
{
    unsigned cp[256];
    tm_byte_to_unicode(cp);
    fputc('"', f);
    for (int i = 0; i < n; ++i) {
        unsigned c = cp[b[i]];
        if (c == '"') fputs("\\\"", f);
        else if (c == '\\') fputs("\\\\", f);
        else tm_put_utf8(f, c);
    }
    fputc('"', f);
}

/* Files are written under <name>.tmp and renamed over <name> when complete: a process that has the
   old file mapped (a chat session on models/tiny while `make` rebuilds it) keeps reading the old one
   instead of taking SIGBUS on a truncated mapping, and an interrupted run leaves no half-written file. */
static FILE *tm_open(const char *dir, const char *name, char *path, size_t path_cap)
{
    int n = snprintf(path, path_cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n + 4 >= path_cap) die("path too long", name);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) die(strerror(errno), tmp);
    return f;
}

static void tm_close(FILE *f, const char *path)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int ok = !ferror(f), e = errno;
    if (fclose(f) != 0 && ok) { ok = 0; e = errno; }
    if (ok && rename(tmp, path) != 0) { ok = 0; e = errno; }
    if (!ok) { /* (no half-written file is left behind) */
        remove(tmp);
        fprintf(stderr, "make_tiny_model: writing %s: %s\n", path, strerror(e));
        exit(1);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* tokenizer files                                                                                   */

static const char *const tm_special[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static const char tm_pre_tokenizer_json[] =
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
    "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
    "\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
    "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}";

static const char tm_chat_template[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static void tm_write_added_token(FILE *f, int id, const char *content)
{
    fprintf(f, "{\"id\":%d,\"content\":", id);
    tm_json_str(f, content);
    fputs(",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}", f);
}

static void tm_write_tokenizer_json(const char *dir, const tm_tokenizer *tk)
{
    char path[4096];
    FILE *f = tm_open(dir, "tokenizer.json", path, sizeof(path));
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n", f);
    for (int i = 0; i < 3; ++i) {
        fputs("    ", f);
        tm_write_added_token(f, tk->n_tokens + i, tm_special[i]);
        fputs(i < 2 ? ",\n" : "\n", f);
    }
    fputs("  ],\n  \"normalizer\": {\"type\":\"NFC\"},\n  \"pre_tokenizer\": ", f);
    fputs(tm_pre_tokenizer_json, f);
    fputs(",\n  \"post_processor\": {\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
          "\"use_regex\":false},\n",
          f);
    fputs("  \"decoder\": {\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
          "\"use_regex\":false},\n",
          f);
    fputs("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
          "    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n    \"fuse_unk\": false,\n"
          "    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {\n",
          f);
    for (int id = 0; id < tk->n_tokens; ++id) {
        fputs("      ", f);
        tm_json_token(f, tk->bytes[id], tk->len[id]);
        fprintf(f, ": %d%s\n", id, id + 1 < tk->n_tokens ? "," : "");
    }
    fputs("    },\n    \"merges\": [\n", f);
    for (int m = 0; m < tk->n_merges; ++m) {
        int a = tk->merges[m][0], b = tk->merges[m][1];
        fputs("      [", f);
        tm_json_token(f, tk->bytes[a], tk->len[a]);
        fputs(", ", f);
        tm_json_token(f, tk->bytes[b], tk->len[b]);
        fputs(m + 1 < tk->n_merges ? "],\n" : "]\n", f);
    }
    fputs("    ]\n  }\n}\n", f);
    tm_close(f, path);
}

static void tm_write_tokenizer_config(const char *dir, const tm_tokenizer *tk, const tm_config *c)
{
    char path[4096];
    FILE *f = tm_open(dir, "tokenizer_config.json", path, sizeof(path));
    fputs("{\n  \"add_bos_token\": false,\n  \"add_prefix_space\": false,\n  \"added_tokens_decoder\": {\n", f);
    for (int i = 0; i < 3; ++i) {
        fprintf(f, "    \"%d\": {\"content\": ", tk->n_tokens + i);
        tm_json_str(f, tm_special[i]);
        fprintf(f, ", \"lstrip\": false, \"normalized\": false, \"rstrip\": false, \"single_word\": false, "
                   "\"special\": true}%s\n",
                i < 2 ? "," : "");
    }
    fputs("  },\n  \"additional_special_tokens\": [\"<|im_start|>\", \"<|im_end|>\"],\n", f);
    fputs("  \"bos_token\": null,\n  \"chat_template\": ", f);
    tm_json_str(f, tm_chat_template);
    fputs(",\n  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": \"<|im_end|>\",\n", f);
    fputs("  \"errors\": \"replace\",\n", f);
    fprintf(f, "  \"model_max_length\": %d,\n", c->max_position_embeddings);
    fputs("  \"pad_token\": \"<|endoftext|>\",\n  \"split_special_tokens\": false,\n", f);
    fputs("  \"tokenizer_class\": \"Qwen2Tokenizer\",\n  \"unk_token\": null\n}\n", f);
    tm_close(f, path);
}

/* ------------------------------------------------------------------------------------------------ */
/* config.json / generation_config.json                                                              */

static void tm_write_int_list(FILE *f, const int *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; ++i) fprintf(f, "%s%d", i ? ", " : "", v[i]);
    fputc(']', f);
}

/* the modules left in BF16 by an NVFP4 checkpoint: all but the routed experts */
static const char tm_quant_exclude[] = "[\"lm_head\", \"model.embed_tokens\", \"*.mlp.gate\", \"*shared_expert*\", "
                                       "\"*linear_attn*\", \"*self_attn*\", \"*.ple.*\", \"*hyper_connection*\"]";

static void tm_write_hf_quant_config(const char *dir)
{
    char path[4096];
    FILE *f = tm_open(dir, "hf_quant_config.json", path, sizeof(path));
    fputs("{\n  \"producer\": {\"name\": \"modelopt\", \"version\": \"0.35.0\"},\n  \"quantization\": {\"quant_algo\": "
          "\"NVFP4\", \"kv_cache_quant_algo\": null, \"group_size\": 16, \"exclude_modules\": ", f);
    fputs(tm_quant_exclude, f);
    fputs("}\n}\n", f);
    tm_close(f, path);
}

static void tm_write_config(const char *dir, const tm_config *c)
{
    char path[4096];
    FILE *f = tm_open(dir, "config.json", path, sizeof(path));
    int eos[2] = {c->eos_im_end, c->eos_endoftext};
    fputs("{\n  \"architectures\": [\"Qwen4ExpForCausalLM\"],\n", f);
    fputs("  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n  \"bos_token_id\": null,\n", f);
    fputs("  \"dtype\": \"bfloat16\",\n  \"eos_token_id\": ", f);
    tm_write_int_list(f, eos, 2);
    fprintf(f, ",\n  \"hc_count\": %d,\n  \"hc_lowrank\": %d,\n  \"head_dim\": %d,\n", c->hc_count, c->hc_lowrank,
            c->head_dim);
    fprintf(f, "  \"heads_per_ngram\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n",
            c->heads_per_ngram, c->hidden_size);
    fprintf(f, "  \"indexer_budget\": %d,\n  \"indexer_compress_ratio\": %d,\n  \"indexer_head_dim\": %d,\n",
            c->indexer_budget, c->indexer_compress_ratio, c->indexer_head_dim);
    fprintf(f, "  \"indexer_kv_heads\": %d,\n  \"indexer_n_heads\": %d,\n  \"initializer_range\": 0.02,\n",
            c->indexer_kv_heads, c->indexer_n_heads);
    fputs("  \"layer_types\": [", f);
    for (int l = 0; l < c->num_hidden_layers; ++l)
        fprintf(f, "%s\"%s\"", l ? ", " : "", c->is_sparse_attention[l] ? "qwen_sparse_attention" : "linear_attention");
    fputs("],\n", f);
    fprintf(f, "  \"linear_conv_kernel_dim\": %d,\n  \"linear_key_head_dim\": %d,\n  \"linear_num_key_heads\": %d,\n",
            c->linear_conv_kernel_dim, c->linear_key_head_dim, c->linear_num_key_heads);
    fprintf(f, "  \"linear_num_value_heads\": %d,\n  \"linear_value_head_dim\": %d,\n", c->linear_num_value_heads,
            c->linear_value_head_dim);
    fprintf(f, "  \"make_ngram_vocab_size_divisible_by\": %d,\n  \"max_position_embeddings\": %d,\n",
            c->make_ngram_vocab_size_divisible_by, c->max_position_embeddings);
    fprintf(f, "  \"model_type\": \"qwen4_exp_text\",\n  \"moe_intermediate_size\": %d,\n  \"ngram_size\": %d,\n",
            c->moe_intermediate_size, c->ngram_size);
    fprintf(f, "  \"ngram_vocab_size_base\": %d,\n  \"norm_topk_prob\": true,\n  \"num_attention_heads\": %d,\n",
            c->ngram_vocab_size_base, c->num_attention_heads);
    fprintf(f, "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"num_hidden_layers\": %d,\n",
            c->num_experts, c->num_experts_per_tok, c->num_hidden_layers);
    fprintf(f, "  \"num_key_value_heads\": %d,\n  \"output_gate_type\": null,\n  \"output_router_logits\": false,\n",
            c->num_key_value_heads);
    fprintf(f, "  \"pad_token_id\": null,\n  \"ple_conv_kernel_size\": %d,\n  \"ple_embed_dim\": %d,\n",
            c->ple_conv_kernel_size, c->ple_embed_dim);
    fputs("  \"ple_layer_ids\": ", f);
    tm_write_int_list(f, c->ple_layer_ids, c->n_ple);
    if (c->nvfp4_experts) { /* what ModelOpt's convert_hf_quant_config_format() writes (tools/make_goldens.py) */
        fputs(",\n  \"quantization_config\": {\"config_groups\": {\"group_0\": {"
              "\"input_activations\": {\"dynamic\": false, \"group_size\": 16, \"num_bits\": 4, \"type\": \"float\"}, "
              "\"targets\": [\"Linear\"], "
              "\"weights\": {\"dynamic\": false, \"group_size\": 16, \"num_bits\": 4, \"type\": \"float\"}}}, \"ignore\": ",
              f);
        fputs(tm_quant_exclude, f);
        fputs(", \"producer\": {\"name\": \"modelopt\", \"version\": \"0.35.0\"}, \"quant_algo\": \"NVFP4\", "
              "\"quant_method\": \"modelopt\"}", f);
    }
    fputs(",\n  \"rms_norm_eps\": 1e-06,\n", f);
    fprintf(f, "  \"rope_parameters\": {\"partial_rotary_factor\": %g, \"rope_theta\": 10000000.0, "
               "\"rope_type\": \"default\"},\n",
            c->partial_rotary_factor);
    fprintf(f, "  \"router_aux_loss_coef\": 0.001,\n  \"seed\": %d,\n  \"shared_expert_intermediate_size\": %d,\n",
            c->seed, c->shared_expert_intermediate_size);
    fprintf(f, "  \"split_ngram_parts\": %d,\n  \"tie_word_embeddings\": false,\n", c->split_ngram_parts);
    fprintf(f, "  \"transformers_version\": \"5.17.0\",\n  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
            c->vocab_size);
    tm_close(f, path);
}

static void tm_write_generation_config(const char *dir, const tm_config *c)
{
    char path[4096];
    FILE *f = tm_open(dir, "generation_config.json", path, sizeof(path));
    fprintf(f,
            "{\n  \"do_sample\": true,\n  \"eos_token_id\": [%d, %d],\n  \"pad_token_id\": %d,\n"
            "  \"temperature\": 0.7,\n  \"top_k\": 20,\n  \"top_p\": 0.8,\n  \"transformers_version\": \"5.17.0\"\n}\n",
            c->eos_im_end, c->eos_endoftext, c->eos_endoftext);
    tm_close(f, path);
}

/* ------------------------------------------------------------------------------------------------ */
/* deterministic random weights                                                                      */

static const uint64_t TM_GAMMA = 0x9E3779B97F4A7C15ull;

static uint64_t tm_splitmix64(uint64_t v)
{
    v += TM_GAMMA;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

typedef struct tm_rng { uint64_t s; } tm_rng;

static uint64_t tm_next(tm_rng *r)
{
    uint64_t z = tm_splitmix64(r->s);
    r->s += TM_GAMMA;
    return z;
}

static double tm_uniform(tm_rng *r) { return (double)(tm_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Irwin-Hall with 4 terms, rescaled to unit variance: normal enough, and pure arithmetic */
static double tm_normal(tm_rng *r)
{
    double s = tm_uniform(r) + tm_uniform(r) + tm_uniform(r) + tm_uniform(r) - 2.0;
    return s * 1.7320508075688772;
}

/* each tensor has its own stream: values do not depend on the order tensors are generated in */
static tm_rng tm_rng_for(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; ++p) h = (h ^ *p) * 0x100000001b3ull;
    tm_rng r;
    r.s = tm_splitmix64(seed * TM_GAMMA ^ h);
    return r;
}

static uint16_t tm_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even; no NaN/Inf here */
    return (uint16_t)(u >> 16);
}

/* ------------------------------------------------------------------------------------------------ */
/* tensor list and safetensors writer                                                                */

enum { TM_BF16, TM_I64, TM_U8, TM_F8_E4M3, TM_F32 };
static const char *const tm_dtype_name[] = {"BF16", "I64", "U8", "F8_E4M3", "F32"};
static const unsigned tm_dtype_size[] = {2, 8, 1, 1, 4};

enum tm_init {
    TM_INIT_NORMAL,   /* N(0, scale) */
    TM_INIT_NORM0,    /* zero-centred RMSNorm weight: N(0, 0.1), used as (1 + w) */
    TM_INIT_NORM1,    /* plain RMSNorm weight (GDN gated norm): 1 + N(0, 0.1) */
    TM_INIT_ALOG,     /* log(uniform(1, 16)) */
    TM_INIT_DTBIAS,   /* 1 + N(0, 0.1) */
    TM_INIT_INT,      /* int64 values given */
    TM_INIT_NIBBLES,  /* NVFP4 packed E2M1 pairs: random bytes (every code, -0 included) */
    TM_INIT_E4M3,     /* NVFP4 block scales: E4M3 codes 0x30..0x3f (0.5 .. 1.875), never NaN */
    TM_INIT_CONST     /* every element `scale` (F32) */
};

typedef struct tm_tensor {
    char name[160];
    int dtype;
    int ndim;
    int64_t shape[4];
    int64_t numel;
    enum tm_init init; /* how the values are drawn (tm_fill), when the writer needs them */
    double scale;
    unsigned char *data; /* TM_INIT_INT only: the values given; else NULL */
    size_t nbytes;
} tm_tensor;

typedef struct tm_tensors {
    tm_tensor *t;
    int n, cap;
    uint64_t seed;
} tm_tensors;

static tm_tensor *tm_new_tensor(tm_tensors *ts, const char *name, int dtype, int ndim, const int64_t *shape)
{
    if (ts->n == ts->cap) {
        ts->cap = ts->cap ? ts->cap * 2 : 128;
        tm_tensor *nt = (tm_tensor *)realloc(ts->t, (size_t)ts->cap * sizeof(tm_tensor));
        if (!nt) die("out of memory", NULL);
        ts->t = nt;
    }
    tm_tensor *t = &ts->t[ts->n++];
    memset(t, 0, sizeof(*t));
    if (strlen(name) >= sizeof(t->name)) die("tensor name too long", name);
    strcpy(t->name, name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; ++i) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->nbytes = (size_t)t->numel * tm_dtype_size[dtype];
    return t;
}

/* A tensor's values into out (t->nbytes), from its own stream (tm_rng_for): the writer draws each
   tensor when it writes it, so only one is in memory at a time (a real-shape checkpoint is tens of GB) */
static void tm_fill(const tm_tensor *t, uint64_t seed, unsigned char *out)
{
    tm_rng r = tm_rng_for(seed, t->name);
    if (t->init == TM_INIT_NIBBLES || t->init == TM_INIT_E4M3) {
        for (int64_t i = 0; i < t->numel; i += 8) {
            uint64_t u = tm_next(&r);
            for (int b = 0; b < 8 && i + b < t->numel; ++b) {
                unsigned v = (unsigned)(u >> (8 * b)) & 0xffu;
                out[i + b] = (unsigned char)(t->init == TM_INIT_E4M3 ? 0x30u + (v & 15u) : v);
            }
        }
        return;
    }
    if (t->init == TM_INIT_CONST) {
        float v = (float)t->scale;
        for (int64_t i = 0; i < t->numel; ++i) memcpy(out + 4 * i, &v, 4); /* little endian hosts */
        return;
    }
    uint16_t *o = (uint16_t *)(void *)out;
    for (int64_t i = 0; i < t->numel; ++i) {
        double v;
        switch (t->init) {
        case TM_INIT_NORM0: v = 0.1 * tm_normal(&r); break;
        case TM_INIT_NORM1: v = 1.0 + 0.1 * tm_normal(&r); break;
        case TM_INIT_ALOG: v = log(1.0 + 15.0 * tm_uniform(&r)); break;
        case TM_INIT_DTBIAS: v = 1.0 + 0.1 * tm_normal(&r); break;
        default: v = t->scale * tm_normal(&r); break;
        }
        o[i] = tm_f32_to_bf16((float)v);
    }
}

static void tm_add_float(tm_tensors *ts, const char *name, enum tm_init init, double scale, int ndim, int64_t d0,
                         int64_t d1, int64_t d2)
{
    int64_t shape[3] = {d0, d1, d2};
    tm_tensor *t = tm_new_tensor(ts, name, TM_BF16, ndim, shape);
    t->init = init;
    t->scale = scale;
}

/* a linear layer weight [out, in] with std gain / sqrt(in) */
static void tm_add_linear(tm_tensors *ts, const char *name, int64_t out, int64_t in, double gain)
{
    tm_add_float(ts, name, TM_INIT_NORMAL, gain / sqrt((double)in), 2, out, in, 0);
}

static void tm_add_i64(tm_tensors *ts, const char *name, const int64_t *v, int64_t n)
{
    tm_tensor *t = tm_new_tensor(ts, name, TM_I64, 1, &n);
    t->init = TM_INIT_INT;
    t->data = (unsigned char *)xmalloc(t->nbytes);
    for (int64_t i = 0; i < n; ++i) {
        uint64_t u = (uint64_t)v[i];
        for (int b = 0; b < 8; ++b) t->data[i * 8 + b] = (unsigned char)(u >> (8 * b)); /* little endian */
    }
}

/* An expert's linear [out, in] in NVFP4, ModelOpt's layout (what tools/make_goldens.py writes):
   <base>.weight U8 [out, in / 2] (two E2M1 codes a byte, the first in the low nibble),
   .weight_scale F8_E4M3 [out, in / 16] (one per 16 weights), .weight_scale_2 F32 [] (global) and
   .input_scale F32 [].  Random codes and block scales (as tools/bench draws them: rms 2.926 and
   ~1.24), the global scale giving the weights a std of 1 / sqrt(in). */
static void tm_add_nvfp4(tm_tensors *ts, const char *base, int64_t out, int64_t in)
{
    char nm[192];
    int64_t shape[2] = {out, in / 2};
    snprintf(nm, sizeof(nm), "%s.weight", base);
    tm_new_tensor(ts, nm, TM_U8, 2, shape)->init = TM_INIT_NIBBLES;
    shape[1] = in / 16;
    snprintf(nm, sizeof(nm), "%s.weight_scale", base);
    tm_new_tensor(ts, nm, TM_F8_E4M3, 2, shape)->init = TM_INIT_E4M3;
    snprintf(nm, sizeof(nm), "%s.weight_scale_2", base);
    tm_tensor *t = tm_new_tensor(ts, nm, TM_F32, 0, shape);
    t->init = TM_INIT_CONST;
    t->scale = 1.0 / (sqrt((double)in) * 2.926 * 1.24);
    snprintf(nm, sizeof(nm), "%s.input_scale", base);
    t = tm_new_tensor(ts, nm, TM_F32, 0, shape);
    t->init = TM_INIT_CONST;
    t->scale = 1.0;
}

/* --- PLE helpers, exactly as the reference computes them --- */

static int tm_is_prime(int64_t v)
{
    if (v < 2) return 0;
    if (v % 2 == 0) return v == 2;
    for (int64_t d = 3; d * d <= v; d += 2)
        if (v % d == 0) return 0;
    return 1;
}

static int64_t tm_find_nth_prime_after(int64_t start, int count)
{
    int64_t p = start;
    for (int i = 0; i < count; ++i) {
        ++p;
        while (!tm_is_prime(p)) ++p;
    }
    return p;
}

static void tm_layer_multipliers(int64_t *out, int64_t unigram_vocab, int ngram_size, int ple_layer_index, int64_t seed)
{
    uint64_t max_long = 0x7FFFFFFFFFFFFFFFull;
    uint64_t multiplier_max = max_long / (uint64_t)(unigram_vocab > 1 ? unigram_vocab : 1);
    uint64_t half_bound = multiplier_max / 2 > 1 ? multiplier_max / 2 : 1;
    uint64_t base_seed = (uint64_t)seed + 10007ull * (uint64_t)ple_layer_index;
    for (int i = 0; i < ngram_size; ++i) {
        /* _build_layer_multipliers feeds base + GAMMA*(i+1) into a splitmix64 that adds GAMMA again */
        uint64_t value = base_seed + TM_GAMMA * (uint64_t)(i + 1);
        out[i] = (int64_t)(2 * (tm_splitmix64(value) % half_bound) + 1);
    }
}

static void tm_build_tensors(tm_tensors *ts, const tm_config *c)
{
    char nm[160];
    const int64_t H = c->hidden_size, V = c->vocab_size, HC = (int64_t)c->hc_count * c->hidden_size;
    const int64_t kdim = (int64_t)c->linear_num_key_heads * c->linear_key_head_dim;
    const int64_t vdim = (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
    const int64_t conv_dim = 2 * kdim + vdim;
    const int ngram_heads = (c->ngram_size - 1) * c->heads_per_ngram;

    tm_add_float(ts, "lm_head.weight", TM_INIT_NORMAL, 0.8, 2, V, H, 0); /* logits std ~3 */
    tm_add_float(ts, "model.embed_tokens.weight", TM_INIT_NORMAL, 0.5, 2, V, H, 0);

#define TM_HC(prefix, with_inject)                                                                                  \
    do {                                                                                                            \
        snprintf(nm, sizeof(nm), "%s.hc_norm.weight", prefix);                                                      \
        tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, HC, 0, 0);                                                        \
        snprintf(nm, sizeof(nm), "%s.input_mix_weight_down.weight", prefix);                                        \
        tm_add_linear(ts, nm, c->hc_lowrank, HC, 1.0);                                                              \
        snprintf(nm, sizeof(nm), "%s.input_mix_weight_up.weight", prefix);                                          \
        tm_add_linear(ts, nm, HC, c->hc_lowrank, 1.0);                                                              \
        if (with_inject) {                                                                                          \
            snprintf(nm, sizeof(nm), "%s.block_inject_weight.weight", prefix);                                      \
            tm_add_linear(ts, nm, c->hc_count, HC, 1.0);                                                            \
        }                                                                                                           \
    } while (0)

    TM_HC("model.hyper_connection_mixer", 0);

    for (int l = 0; l < c->num_hidden_layers; ++l) {
        char lp[64], pre[128];
        snprintf(lp, sizeof(lp), "model.layers.%d", l);

        snprintf(pre, sizeof(pre), "%s.attn_hyper_connection", lp);
        TM_HC(pre, 1);
        snprintf(pre, sizeof(pre), "%s.mlp_hyper_connection", lp);
        TM_HC(pre, 1);

        if (!c->is_sparse_attention[l]) {
            /* Gated DeltaNet */
            snprintf(nm, sizeof(nm), "%s.linear_attn.in_proj_qkv.weight", lp);
            tm_add_linear(ts, nm, conv_dim, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.in_proj_z.weight", lp);
            tm_add_linear(ts, nm, vdim, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.in_proj_b.weight", lp);
            tm_add_linear(ts, nm, c->linear_num_value_heads, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.in_proj_a.weight", lp);
            tm_add_linear(ts, nm, c->linear_num_value_heads, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.conv1d.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORMAL, 0.3, 3, conv_dim, 1, c->linear_conv_kernel_dim);
            snprintf(nm, sizeof(nm), "%s.linear_attn.dt_bias", lp);
            tm_add_float(ts, nm, TM_INIT_DTBIAS, 0, 1, c->linear_num_value_heads, 0, 0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.A_log", lp);
            tm_add_float(ts, nm, TM_INIT_ALOG, 0, 1, c->linear_num_value_heads, 0, 0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.norm.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM1, 0, 1, c->linear_value_head_dim, 0, 0);
            snprintf(nm, sizeof(nm), "%s.linear_attn.out_proj.weight", lp);
            tm_add_linear(ts, nm, H, vdim, 0.5);
        } else {
            /* gated attention + QSA indexer */
            const int64_t nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
            snprintf(nm, sizeof(nm), "%s.self_attn.q_proj.weight", lp);
            tm_add_linear(ts, nm, nh * hd * 2, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.self_attn.k_proj.weight", lp);
            tm_add_linear(ts, nm, nkv * hd, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.self_attn.v_proj.weight", lp);
            tm_add_linear(ts, nm, nkv * hd, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.self_attn.o_proj.weight", lp);
            tm_add_linear(ts, nm, H, nh * hd, 0.5);
            snprintf(nm, sizeof(nm), "%s.self_attn.q_norm.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, hd, 0, 0);
            snprintf(nm, sizeof(nm), "%s.self_attn.k_norm.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, hd, 0, 0);
            snprintf(nm, sizeof(nm), "%s.self_attn.indexer.index_qk_proj.weight", lp);
            tm_add_linear(ts, nm, (int64_t)(c->indexer_n_heads + c->indexer_kv_heads) * c->indexer_head_dim, H, 1.0);
            snprintf(nm, sizeof(nm), "%s.self_attn.indexer.q_layernorm.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, c->indexer_head_dim, 0, 0);
            snprintf(nm, sizeof(nm), "%s.self_attn.indexer.k_layernorm.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, c->indexer_head_dim, 0, 0);
        }

        /* MoE */
        snprintf(nm, sizeof(nm), "%s.mlp.gate.weight", lp);
        tm_add_linear(ts, nm, c->num_experts, H, 2.0);
        for (int e = 0; e < c->num_experts; ++e) {
            static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; ++p) {
                int64_t out = p < 2 ? c->moe_intermediate_size : H, in = p < 2 ? H : c->moe_intermediate_size;
                snprintf(nm, sizeof(nm), "%s.mlp.experts.%d.%s", lp, e, proj[p]);
                if (c->nvfp4_experts) {
                    tm_add_nvfp4(ts, nm, out, in);
                } else {
                    strcat(nm, ".weight");
                    tm_add_linear(ts, nm, out, in, 1.0);
                }
            }
        }
        snprintf(nm, sizeof(nm), "%s.mlp.shared_expert.gate_proj.weight", lp);
        tm_add_linear(ts, nm, c->shared_expert_intermediate_size, H, 1.0);
        snprintf(nm, sizeof(nm), "%s.mlp.shared_expert.up_proj.weight", lp);
        tm_add_linear(ts, nm, c->shared_expert_intermediate_size, H, 1.0);
        snprintf(nm, sizeof(nm), "%s.mlp.shared_expert.down_proj.weight", lp);
        tm_add_linear(ts, nm, H, c->shared_expert_intermediate_size, 1.0);
        snprintf(nm, sizeof(nm), "%s.mlp.shared_expert_gate.weight", lp);
        tm_add_linear(ts, nm, 1, H, 1.0);

        /* PLE */
        int ple_index = -1;
        for (int i = 0; i < c->n_ple; ++i)
            if (c->ple_layer_ids[i] == l + 1) ple_index = i;
        if (ple_index >= 0) {
            int64_t sizes[64], offsets[64], mult[16], total = 0;
            if (ngram_heads > 64 || c->ngram_size > 16) die("config", "too many n-gram heads for this tool");
            for (int h = 0; h < ngram_heads; ++h) {
                int global_head = ple_index * ngram_heads + h;
                sizes[h] = tm_find_nth_prime_after(c->ngram_vocab_size_base - 1, global_head + 1);
                offsets[h] = total;
                total += sizes[h];
            }
            int64_t div = c->make_ngram_vocab_size_divisible_by;
            /* the padded vocabulary in shards as torch.chunk cuts it: ceil(padded / parts) rows each, the
               last one shorter (the tiny model's divide evenly) */
            int64_t padded = (total + div - 1) / div * div;
            int64_t rows = (padded + c->split_ngram_parts - 1) / c->split_ngram_parts, cols = c->ple_embed_dim / ngram_heads;
            tm_layer_multipliers(mult, c->vocab_size, c->ngram_size, ple_index, c->seed);

            snprintf(nm, sizeof(nm), "%s.ple.ple_embedding.layer_multipliers", lp);
            tm_add_i64(ts, nm, mult, c->ngram_size);
            snprintf(nm, sizeof(nm), "%s.ple.ple_embedding.ngram_heads_offsets", lp);
            tm_add_i64(ts, nm, offsets, ngram_heads);
            snprintf(nm, sizeof(nm), "%s.ple.ple_embedding.ngram_heads_vocab_sizes", lp);
            tm_add_i64(ts, nm, sizes, ngram_heads);
            for (int s = 0; (int64_t)s * rows < padded; ++s) {
                snprintf(nm, sizeof(nm), "%s.ple.ple_embedding.ngram_embedding.shard_%d.weight", lp, s);
                tm_add_float(ts, nm, TM_INIT_NORMAL, 0.5, 2, padded - s * rows < rows ? padded - s * rows : rows, cols, 0);
            }
            snprintf(nm, sizeof(nm), "%s.ple.key_proj.weight", lp);
            tm_add_linear(ts, nm, HC, c->ple_embed_dim, 1.0);
            snprintf(nm, sizeof(nm), "%s.ple.value_proj.weight", lp);
            tm_add_linear(ts, nm, H, c->ple_embed_dim, 1.0);
            snprintf(nm, sizeof(nm), "%s.ple.norm_key.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, HC, 0, 0);
            snprintf(nm, sizeof(nm), "%s.ple.norm_query.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, HC, 0, 0);
            snprintf(nm, sizeof(nm), "%s.ple.norm_conv.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORM0, 0, 1, HC, 0, 0);
            snprintf(nm, sizeof(nm), "%s.ple.conv1d.weight", lp);
            tm_add_float(ts, nm, TM_INIT_NORMAL, 0.3, 3, HC, 1, c->ple_conv_kernel_size);
        }
    }
#undef TM_HC
}

/* safetensors order: larger element size first, then by name (what the safetensors library writes) */
static int tm_tensor_cmp(const void *pa, const void *pb)
{
    const tm_tensor *a = (const tm_tensor *)pa, *b = (const tm_tensor *)pb;
    if (tm_dtype_size[a->dtype] != tm_dtype_size[b->dtype]) return tm_dtype_size[a->dtype] > tm_dtype_size[b->dtype] ? -1 : 1;
    return strcmp(a->name, b->name);
}

static void tm_write_safetensors(const char *dir, tm_tensors *ts)
{
    qsort(ts->t, (size_t)ts->n, sizeof(tm_tensor), tm_tensor_cmp);
    size_t cap = 1 << 16, len = 0;
    char *hdr = (char *)xmalloc(cap);
#define TM_APPEND(...)                                                                                              \
    do {                                                                                                            \
        int k_ = snprintf(hdr + len, cap - len, __VA_ARGS__);                                                       \
        if (k_ < 0) die("header format", NULL);                                                                     \
        while ((size_t)k_ >= cap - len) {                                                                           \
            cap *= 2;                                                                                               \
            char *nh_ = (char *)realloc(hdr, cap);                                                                  \
            if (!nh_) die("out of memory", NULL);                                                                   \
            hdr = nh_;                                                                                              \
            k_ = snprintf(hdr + len, cap - len, __VA_ARGS__);                                                       \
        }                                                                                                           \
        len += (size_t)k_;                                                                                          \
    } while (0)
    TM_APPEND("{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < ts->n; ++i) {
        tm_tensor *t = &ts->t[i];
        TM_APPEND(",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, tm_dtype_name[t->dtype]);
        for (int d = 0; d < t->ndim; ++d) TM_APPEND("%s%lld", d ? "," : "", (long long)t->shape[d]);
        TM_APPEND("],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    TM_APPEND("}");
    while (len % 8) TM_APPEND(" "); /* data starts 8-byte aligned */
#undef TM_APPEND

    char path[4096];
    FILE *f = tm_open(dir, "model.safetensors", path, sizeof(path));
    unsigned char n8[8];
    for (int b = 0; b < 8; ++b) n8[b] = (unsigned char)((uint64_t)len >> (8 * b));
    fwrite(n8, 1, 8, f);
    fwrite(hdr, 1, len, f);
    size_t most = 0;
    for (int i = 0; i < ts->n; ++i) most = ts->t[i].nbytes > most ? ts->t[i].nbytes : most;
    unsigned char *buf = (unsigned char *)xmalloc(most);
    for (int i = 0; i < ts->n; ++i) {
        const tm_tensor *t = &ts->t[i];
        if (!t->data) tm_fill(t, ts->seed, buf);
        if (fwrite(t->data ? t->data : buf, 1, t->nbytes, f) != t->nbytes) die("write failed", path);
    }
    free(buf);
    tm_close(f, path);
    free(hdr);
}

/* ------------------------------------------------------------------------------------------------ */
/* main                                                                                              */

static void tm_mkdir_p(const char *dir)
{
    size_t n = strlen(dir);
    char *p = (char *)xmalloc(n + 1);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; ++i) {
        if (p[i] == '/' || p[i] == 0) {
            char save = p[i];
            p[i] = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) die("cannot create directory", p);
            p[i] = save;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) die("not a directory", dir);
    free(p);
}

static void tm_usage(void)
{
    fprintf(stderr, "usage: make_tiny_model OUT_DIR [--seed N] [--max-position-embeddings N]\n"
                    "                       [--real-shape LAYERS [--ple-vocab-base N]]\n"
                    "writes the built-in tiny Qwen4-Exp model (config, BF16 safetensors, BPE tokenizer);\n"
                    "--max-position-embeddings: the context in config.json (default 4096; the weights do not change)\n"
                    "--real-shape: instead, LAYERS (1-64) layers of the real Qwen3.8-Flash-Next shape with NVFP4\n"
                    "  experts (ModelOpt) and this tool's tokenizer: ~1.6 GB a layer plus 3.1 GB (embeddings,\n"
                    "  lm_head, PLE table); --ple-vocab-base: the PLE n-gram vocabulary base (default 100000)\n");
    exit(2);
}

int main(int argc, char **argv)
{
    cli_check_stdout("make_tiny_model");
    const char *out_dir = NULL;
    unsigned long long seed = 1;
    long max_pos = 0, real_layers = 0, ple_base = 100000;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            ++i;
            seed = cli_u64("--seed", argv[i]);
        } else if (strcmp(argv[i], "--max-position-embeddings") == 0 && i + 1 < argc) {
            char *end = NULL;
            max_pos = strtol(argv[++i], &end, 10);
            if (!end || *end || max_pos < 16 || max_pos > 1L << 30)
                die("--max-position-embeddings expects an integer in 16 .. 2^30", argv[i]);
        } else if (strcmp(argv[i], "--real-shape") == 0 && i + 1 < argc) {
            char *end = NULL;
            real_layers = strtol(argv[++i], &end, 10);
            if (!end || *end || real_layers < 1 || real_layers > TM_MAX_LAYERS)
                die("--real-shape expects a layer count in 1 .. 64", argv[i]);
        } else if (strcmp(argv[i], "--ple-vocab-base") == 0 && i + 1 < argc) {
            char *end = NULL;
            ple_base = strtol(argv[++i], &end, 10);
            if (!end || *end || ple_base < 1000 || ple_base > 100000000)
                die("--ple-vocab-base expects an integer in 1000 .. 10^8", argv[i]);
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            tm_usage();
        } else if (!out_dir && argv[i][0] != '-') {
            out_dir = argv[i];
        } else {
            tm_usage();
        }
    }
    if (!out_dir) tm_usage();

    /* corpus: the lines joined with newlines */
    size_t n_lines = sizeof(tm_corpus) / sizeof(tm_corpus[0]), clen = 0;
    for (size_t i = 0; i < n_lines; ++i) clen += strlen(tm_corpus[i]) + 1;
    char *corpus = (char *)xmalloc(clen + 1);
    clen = 0;
    for (size_t i = 0; i < n_lines; ++i) {
        size_t k = strlen(tm_corpus[i]);
        memcpy(corpus + clen, tm_corpus[i], k);
        clen += k;
        corpus[clen++] = '\n';
    }
    corpus[clen] = 0;

    tm_config cfg;
    tm_config_init(&cfg);
    if (max_pos) cfg.max_position_embeddings = (int)max_pos;
    else if (real_layers) cfg.max_position_embeddings = 262144;
    if (real_layers) tm_config_real(&cfg, (int)real_layers, (int)ple_base);
    const int target_vocab = 1024; /* including the 3 special tokens */
    tm_tokenizer tk;
    memset(&tk, 0, sizeof(tk));
    tm_train_bpe(&tk, corpus, target_vocab - 3);
    cfg.vocab_size = real_layers ? 248320 : tk.n_tokens + 3;
    cfg.eos_endoftext = tk.n_tokens + 0;
    cfg.eos_im_end = tk.n_tokens + 2;

    tm_mkdir_p(out_dir);
    tm_write_tokenizer_json(out_dir, &tk);
    tm_write_tokenizer_config(out_dir, &tk, &cfg);
    tm_write_config(out_dir, &cfg);
    tm_write_generation_config(out_dir, &cfg);
    if (cfg.nvfp4_experts) tm_write_hf_quant_config(out_dir);

    tm_tensors ts;
    memset(&ts, 0, sizeof(ts));
    ts.seed = (uint64_t)seed;
    tm_build_tensors(&ts, &cfg);
    tm_write_safetensors(out_dir, &ts);

    size_t total = 0;
    for (int i = 0; i < ts.n; ++i) total += ts.t[i].nbytes;
    printf("make_tiny_model: wrote %s (%s%d = 256 bytes + %d merges -> %d tokens + 3 special; %d layers; "
           "%d tensors, %zu bytes of weights; seed %llu; context %d)\n",
           out_dir, real_layers ? "the real shape, vocab 248320; tokenizer " : "vocab ", tk.n_tokens + 3, tk.n_merges,
           tk.n_tokens, cfg.num_hidden_layers, ts.n, total, seed, cfg.max_position_embeddings);

    for (int i = 0; i < ts.n; ++i) free(ts.t[i].data); /* (NULL but for the int64 buffers) */
    free(ts.t);
    for (int i = 0; i < tk.n_tokens; ++i) free(tk.bytes[i]);
    free(tk.bytes);
    free(tk.len);
    free(tk.merges);
    free(corpus);
    return 0;
}
