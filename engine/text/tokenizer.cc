/* engine/text/tokenizer.cc - the tokenizer (tokenizer.h): SentencePiece models (BPE ones by spm.c,
 * the rest by SentencePiece's C++ processor) behind a C interface and the dispatch to the
 * tokenizer.json kinds (bpe.h: from a file or GGUF metadata); the incremental detokenizer is
 * detokenizer.cc (struct tokenizer: tokenizer_impl.h). C++, like detokenizer.cc: every entry point
 * catches everything, nothing exits.
 * Not here: chat templates or stop sequences (the server), BPE itself (bpe.c, tokenizer_json.c,
 * spm.c).
 * Tests: tests/test_tokenizer.c, tests/test_spm.py. */
#include "tokenizer.h"
#include "gpt2_files.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>

#include "bpe.h"
#include "tokenizer_impl.h"

namespace {

const char kSpaceSymbol[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */

/* SentencePiece's status as ours, with its message behind `what`. */
enum status status_from_sp(const sentencepiece::util::Status &st, enum status code,
                           const char *what)
{
    return status_errorf(code, "%s: %s", what, st.message());
}

}  // namespace

enum status tokenizer_decode_ids(const struct tokenizer *t, const std::vector<int> &ids, std::string *out)
{
    if (t->spm) {
        char *p = nullptr;
        size_t n = 0, cap = 0;
        static_assert(sizeof(int) == sizeof(int32_t), "ids are int32_t");
        enum status s = spm_decode(t->spm, (const int32_t *)ids.data(), ids.size(), &p, &n, &cap);
        if (s == STATUS_OK) out->assign(p ? p : "", n);
        free(p);
        return s;
    }
    const sentencepiece::util::Status st = t->sp.Decode(ids, out);
    if (!st.ok()) return status_from_sp(st, STATUS_INTERNAL, "tokenizer: decode failed");
    return STATUS_OK;
}

enum status tokenizer_decode_run(const struct tokenizer *t, const int32_t *ids, int n, bool behind_anchor,
                                std::string *out)
{
    std::vector<int> run;
    run.reserve((size_t)n + 1);
    if (behind_anchor) {
        if (t->anchor_id < 0) return status_errorf(STATUS_UNSUPPORTED, "tokenizer: this vocabulary has no anchor piece");
        run.push_back(t->anchor_id);
    }
    run.insert(run.end(), ids, ids + n);
    enum status st = tokenizer_decode_ids(t, run, out);
    if (st != STATUS_OK || !behind_anchor) return st;
    if (out->compare(0, t->anchor_text.size(), t->anchor_text) != 0)
        return status_errorf(STATUS_INTERNAL, "tokenizer: anchor text was not kept");
    out->erase(0, t->anchor_text.size());
    return STATUS_OK;
}

namespace {

/* Parses "<0xHH>"; -1 when the piece is not of that form. */
int parse_byte_piece(std::string_view p)
{
    if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const char c = p[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Picks the detokenizer's anchor: preferably a single printable ASCII character piece, else
 * any ordinary piece without a space marker, else a byte piece for an ASCII character, else
 * the unknown piece (which decodes to its surface, " ⁇ " by default). Each candidate must
 * decode to non-empty text alone. */
enum status choose_anchor(struct tokenizer *t)
{
    std::vector<int32_t> candidates;
    for (int pass = 0; pass < 4 && candidates.size() < 8; pass++) {
        for (int id = 0; id < t->vocab_size && candidates.size() < 8; id++) {
            const std::string_view p = piece_of(t, id);
            const uint8_t f = t->flags[id];
            const bool ordinary = !(f & (PIECE_CONTROL | PIECE_BYTE | PIECE_UNKNOWN | PIECE_UNUSED));
            bool ok = false;
            if (pass == 0)
                ok = ordinary && p.size() == 1 && p[0] > ' ' && p[0] < 127;
            else if (pass == 1)
                ok = ordinary && !p.empty() && p.find(kSpaceSymbol) == std::string_view::npos;
            else if (pass == 2)
                ok = (f & PIECE_BYTE) && t->byte_of[id] > ' ' && t->byte_of[id] < 127;
            else
                ok = (f & PIECE_UNKNOWN) != 0;
            if (ok) candidates.push_back(id);
        }
    }
    /* A piece that starts with a space marker, to check that the anchor keeps it a space. */
    int32_t probe = -1;
    for (int id = 0; id < t->vocab_size && probe < 0; id++)
        if (!(t->flags[id] & (PIECE_CONTROL | PIECE_BYTE | PIECE_UNKNOWN | PIECE_UNUSED)) &&
            piece_of(t, id).compare(0, 3, kSpaceSymbol) == 0)
            probe = id;
    for (int32_t id : candidates) {
        std::string text;
        if (tokenizer_decode_ids(t, std::vector<int>{id}, &text) != STATUS_OK || text.empty()) continue;
        if (probe >= 0) {
            std::string two;
            if (tokenizer_decode_ids(t, std::vector<int>{id, probe}, &two) != STATUS_OK ||
                two.size() <= text.size() || two.compare(0, text.size(), text) != 0 ||
                two[text.size()] != ' ')
                continue;
        }
        t->anchor_id = id;
        t->anchor_text = std::move(text);
        LOG_DEBUG("tokenizer", "detokenizer anchor: id %d \"%s\"", (int)id,
                  t->anchor_text.c_str());
        return STATUS_OK;
    }
    LOG_WARN("tokenizer", "no anchor piece found: incremental detokenization is unavailable");
    return STATUS_OK;
}

/* ---- the bound of tokenizer_min_tokens -------------------------------------------------------
 * Read from the serialized ModelProto itself (the C++ ModelProto header is not installed):
 * trainer_spec (field 2) byte_fallback (35), normalizer_spec (field 3) precompiled_charsmap (2). */

/* One field of a serialized protobuf message: its number, and its varint value or its bytes. */
struct pb_field {
    uint32_t number;
    uint64_t value;
    std::string_view bytes;
};

bool pb_varint(std::string_view b, size_t *at, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *at < b.size(); shift += 7) {
        const uint8_t c = (uint8_t)b[(*at)++];
        x |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* The last field `number` of message b into *f (protobuf's rule for a repeated singular
 * field); false when absent or when b is malformed. */
bool pb_find(std::string_view b, uint32_t number, struct pb_field *f)
{
    bool found = false;
    for (size_t at = 0; at < b.size();) {
        uint64_t tag, v = 0;
        if (!pb_varint(b, &at, &tag)) return false;
        std::string_view bytes;
        const size_t fixed = (tag & 7) == 1 ? 8 : (tag & 7) == 5 ? 4 : 0;
        if ((tag & 7) == 0) {
            if (!pb_varint(b, &at, &v)) return false;
        } else if (fixed) {
            if (b.size() - at < fixed) return false;
            at += fixed;
        } else if ((tag & 7) == 2) {
            if (!pb_varint(b, &at, &v) || v > b.size() - at) return false;
            bytes = b.substr(at, (size_t)v);
            at += (size_t)v;
        } else {
            return false; /* groups: not in a ModelProto */
        }
        if (tag >> 3 == number) *f = pb_field{number, v, bytes}, found = true;
    }
    return found;
}

/* Each id covers at most its piece's bytes of the normalized text (a byte piece one byte, a
 * control piece its string, which encode matches in the text), and the normalized text holds every input byte that is not a space
 * when (1) byte fallback is on, so that no run of unknown characters becomes one <unk> id, and
 * (2) there is no normalization rule set (nmt_nfkc and its kin may drop or fold characters);
 * space only grows (U+2581) or, with remove_extra_whitespaces, folds. 0 otherwise. */
size_t max_token_bytes(const struct tokenizer *t, std::string_view model)
{
    struct pb_field trainer{}, normalizer{}, f{};
    const bool byte_fallback = pb_find(model, 2, &trainer) && pb_find(trainer.bytes, 35, &f) && f.value;
    const bool rules = pb_find(model, 3, &normalizer) && pb_find(normalizer.bytes, 2, &f) && !f.bytes.empty();
    if (!byte_fallback || rules) return 0;
    size_t most = 1;
    for (int id = 0; id < t->vocab_size; id++)
        if (!(t->flags[id] & (PIECE_BYTE | PIECE_UNUSED)))
            most = piece_of(t, id).size() > most ? piece_of(t, id).size() : most;
    return most;
}

/* Whether SentencePiece BPE models go to libsentencepiece rather than spm.c:
 * SHARDLM_SENTENCEPIECE=lib (the comparison tests and a way back should spm.c ever differ). */
bool use_libsentencepiece()
{
    const char *v = getenv("SHARDLM_SENTENCEPIECE");
    return v && strcmp(v, "lib") == 0;
}

/* The vocabulary of spm.c's model into t. */
void fill_from_spm(struct tokenizer *t)
{
    t->vocab_size = spm_size(t->spm);
    t->flags.resize(t->vocab_size);
    t->byte_of.resize(t->vocab_size);
    int32_t unk, bos, eos, pad;
    spm_special_ids(t->spm, &unk, &bos, &eos, &pad);
    t->bos_id = bos, t->eos_id = eos, t->pad_id = pad, t->unk_id = unk;
    for (int id = 0; id < t->vocab_size; id++) {
        const enum spm_type type = spm_piece_type(t->spm, id);
        t->flags[id] = type == SPM_CONTROL ? PIECE_CONTROL : type == SPM_UNKNOWN ? PIECE_UNKNOWN
                     : type == SPM_UNUSED  ? PIECE_UNUSED  : type == SPM_BYTE    ? PIECE_BYTE : 0;
        t->byte_of[id] = (int16_t)(type == SPM_BYTE ? parse_byte_piece(piece_of(t, id)) : -1);
    }
}

/* The vocabulary of libsentencepiece's processor, loaded from bytes, into t. */
enum status fill_from_sp(struct tokenizer *t, std::string_view bytes, const char *name)
{
    const sentencepiece::util::Status st = t->sp.LoadFromSerializedProto(bytes);
    if (!st.ok())
        return status_errorf(STATUS_BAD_FORMAT, "%s: not a SentencePiece model (%s)", name, st.message());
    t->vocab_size = t->sp.GetPieceSize();
    if (t->vocab_size <= 0) return status_errorf(STATUS_BAD_FORMAT, "%s: SentencePiece model has no pieces", name);
    t->bos_id = t->sp.bos_id();
    t->eos_id = t->sp.eos_id();
    t->pad_id = t->sp.pad_id();
    t->unk_id = t->sp.unk_id();
    t->flags.resize(t->vocab_size);
    t->byte_of.resize(t->vocab_size);
    for (int id = 0; id < t->vocab_size; id++) {
        uint8_t f = 0;
        if (t->sp.IsControl(id)) f |= PIECE_CONTROL;
        if (t->sp.IsUnknown(id)) f |= PIECE_UNKNOWN;
        if (t->sp.IsUnused(id)) f |= PIECE_UNUSED;
        int b = -1;
        if (t->sp.IsByte(id)) {
            b = parse_byte_piece(piece_of(t, id));
            if (b < 0)
                return status_errorf(STATUS_BAD_FORMAT, "%s: byte piece %d is \"%s\"", name, id,
                                     std::string(piece_of(t, id)).c_str());
            f |= PIECE_BYTE;
        }
        t->flags[id] = f;
        t->byte_of[id] = (int16_t)b;
    }
    return STATUS_OK;
}

enum status load_proto(std::string_view bytes, const char *name, struct tokenizer **out)
{
    *out = nullptr;
    struct tokenizer *t = new (std::nothrow) tokenizer;
    if (!t) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", name);
    enum status s = use_libsentencepiece() ? STATUS_UNSUPPORTED : spm_load(bytes.data(), bytes.size(), &t->spm);
    if (s == STATUS_OK) {
        fill_from_spm(t);
    } else if (s == STATUS_UNSUPPORTED) {
        s = fill_from_sp(t, bytes, name);
    } else {
        s = status_errorf(s, "%s: %s", name, status_message());
    }
    if (s != STATUS_OK) {
        delete t;
        return s;
    }
    t->max_token_bytes = max_token_bytes(t, bytes);
    for (int id = 0; id < t->vocab_size; id++) {
        const std::string_view p = piece_of(t, id);
        if (!(t->flags[id] & (PIECE_CONTROL | PIECE_UNKNOWN)) || p.empty() || !t->special_ids.emplace(p, id).second) continue;
        t->special_first[(uint8_t)p[0]] = true;
        if (std::find(t->special_lens.begin(), t->special_lens.end(), p.size()) == t->special_lens.end())
            t->special_lens.push_back(p.size());
    }
    std::sort(t->special_lens.rbegin(), t->special_lens.rend());
    s = choose_anchor(t);
    if (s != STATUS_OK) {
        delete t;
        return s;
    }
    *out = t;
    return STATUS_OK;
}

/* A tokenizer.json text rather than a serialized ModelProto: JSON opens with '{' (after
 * whitespace), which a ModelProto cannot (0x7B would be field 15 starting a group). */
bool looks_like_json(std::string_view bytes)
{
    size_t i = 0;
    while (i < bytes.size() && (bytes[i] == ' ' || bytes[i] == '\t' || bytes[i] == '\n' || bytes[i] == '\r')) i++;
    return i < bytes.size() && bytes[i] == '{';
}

/* A tiktoken rank file: its first line is "BASE64 RANK" (a ModelProto opens with 0x0A). */
bool looks_like_tiktoken(std::string_view bytes)
{
    size_t i = 0;
    while (i < bytes.size() && (isalnum((unsigned char)bytes[i]) || bytes[i] == '+' || bytes[i] == '/' || bytes[i] == '=')) i++;
    return i > 0 && i + 1 < bytes.size() && bytes[i] == ' ' && isdigit((unsigned char)bytes[i + 1]);
}

/* A tokenizer.json kind from a tokenizer.json text or, with tiktoken, a rank file (pattern: see
 * bpe_load_tiktoken), and a tokenizer_config.json text. */
enum status load_bpe(std::string_view json, const char *name, const char *config, size_t config_n,
                     struct tokenizer **out, bool tiktoken = false, const char *pattern = nullptr)
{
    *out = nullptr;
    struct bpe *b = nullptr;
    enum status s = tiktoken ? bpe_load_tiktoken(json.data(), json.size(), name, pattern, config, config_n, &b)
                             : bpe_load_json(json.data(), json.size(), name, config, config_n, &b);
    if (s != STATUS_OK) return s;
    struct tokenizer *t = new (std::nothrow) tokenizer;
    if (!t) {
        bpe_free(b);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", name);
    }
    t->bpe = b;
    t->vocab_size = b->n_vocab;
    t->bos_id = b->bos_id, t->eos_id = b->eos_id, t->pad_id = b->pad_id, t->unk_id = b->unk_id;
    t->max_token_bytes = b->max_token_bytes;
    *out = t;
    return STATUS_OK;
}

/* The tokenizer_config.json beside path (same directory), into *config; empty when absent. */
enum status read_config_beside(const char *path, std::string *config)
{
    std::string dir(path);
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? std::string(".") : dir.substr(0, slash);
    const std::string cfg = dir + "/tokenizer_config.json";
    if (access(cfg.c_str(), F_OK) != 0) return STATUS_OK;
    char *text = nullptr;
    size_t n = 0;
    enum status s = base_read_file(cfg.c_str(), 64u << 20, "tokenizer_config.json", &text, &n);
    if (s != STATUS_OK) return s;
    config->assign(text, n);
    free(text);
    return STATUS_OK;
}

/* SentencePiece's ids[0..n) with control and unknown ids shown as their pieces
 * (tokenizer_decode_opts): each run between them decoded by SentencePiece, behind the anchor
 * once a shown id has been written (so that its leading space stays, as in Hugging Face's text,
 * whose Strip decoder only strips the very start). The streaming twin: detokenizer.cc's
 * sp_detok_push_shown. */
enum status sp_decode_shown(const struct tokenizer *t, const int32_t *ids, int n, std::string *out)
{
    out->clear();
    int shown = 0;
    for (int i = 0; i <= n;) {
        int j = i;
        while (j < n && !(t->flags[ids[j]] & SP_SHOWN)) j++;
        if (j > i) {
            std::string s;
            enum status st = tokenizer_decode_run(t, ids + i, j - i, shown, &s);
            if (st != STATUS_OK) return st;
            out->append(s);
        }
        if (j < n) out->append(piece_of(t, ids[j])), shown = 1;
        i = j + 1;
    }
    return STATUS_OK;
}

}  // namespace

extern "C" {

const struct bpe *tokenizer_bpe(const struct tokenizer *t) { return t->bpe; }

enum status tokenizer_load(const char *path, struct tokenizer **out) { return tokenizer_load_tiktoken(path, nullptr, out); }

enum status tokenizer_load_tiktoken(const char *path, const char *pattern, struct tokenizer **out)
{
    *out = nullptr;
    if (!path) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: no path given");
    int fd = -1;
    struct stat sb;
    enum status s = base_open_file(path, &fd, &sb);
    if (s != STATUS_OK) return s;
    try {
        std::string bytes;
        {
            bytes.resize((size_t)sb.st_size);
            size_t got = 0;
            while (got < bytes.size()) {
                const ssize_t r = read(fd, &bytes[got], bytes.size() - got);
                if (r < 0 && errno == EINTR) continue;
                if (r < 0) {
                    s = status_errorf(STATUS_IO, "%s: read: %s", path, strerror(errno));
                    break;
                }
                if (r == 0) {
                    s = status_errorf(STATUS_IO, "%s: file shrank while being read", path);
                    break;
                }
                got += (size_t)r;
            }
        }
        if (s == STATUS_OK && !pattern && gpt2_files_is_vocab(path)) { /* GPT-2's vocab.json + merges.txt */
            char *json = nullptr;
            s = gpt2_files_json(bytes.data(), bytes.size(), path, &json);
            if (s == STATUS_OK) {
                bytes.assign(json);
                free(json);
            }
        }
        const size_t plen = strlen(path);
        const bool json_name = plen >= 5 && !strcmp(path + plen - 5, ".json");
        const bool tiktoken = pattern || (!json_name && looks_like_tiktoken(bytes));
        if (s == STATUS_OK && (json_name || tiktoken || looks_like_json(bytes))) {
            std::string config;
            s = read_config_beside(path, &config);
            if (s == STATUS_OK)
                s = load_bpe(bytes, path, config.empty() ? nullptr : config.data(), config.size(), out, tiktoken, pattern);
        } else if (s == STATUS_OK) {
            s = load_proto(bytes, path, out);
        }
    } catch (const std::bad_alloc &) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    } catch (const std::exception &e) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: %s", path, e.what());
    } catch (...) {
        s = status_errorf(STATUS_INTERNAL, "%s: unknown exception while loading", path);
    }
    close(fd);
    return s;
}

enum status tokenizer_load_for_model(const char *model, const void *proto, size_t proto_n, int model_vocab,
                                     struct tokenizer **out)
{
    *out = nullptr;
    char path[4200];
    if (snprintf(path, sizeof path, proto ? "%s" : "%s/tokenizer.model", model) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: model path too long");
    /* A directory without tokenizer.model: its tokenizer.json (byte-level BPE), else GPT-2's
     * vocab.json + merges.txt. */
    if (!proto && access(path, F_OK) != 0 &&
        snprintf(path, sizeof path, "%s/tokenizer.json", model) < (int)sizeof path && access(path, F_OK) != 0 &&
        snprintf(path, sizeof path, "%s/vocab.json", model) < (int)sizeof path && access(path, F_OK) != 0)
        snprintf(path, sizeof path, "%s/tokenizer.model", model);
    struct tokenizer *t = nullptr;
    enum status s = proto ? tokenizer_load_from_memory(proto, proto_n, &t) : tokenizer_load(path, &t);
    if (s != STATUS_OK) return s;
    if (tokenizer_vocab_size(t) > model_vocab) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: the tokenizer has %d pieces, the model only %d rows of embeddings",
                          path, tokenizer_vocab_size(t), model_vocab);
        tokenizer_free(t);
        return s;
    }
    LOG_INFO("tokenizer", "%s: %d pieces (%s)", proto ? model : path, tokenizer_vocab_size(t),
             tokenizer_kind(t));
    *out = t;
    return STATUS_OK;
}

enum status tokenizer_load_from_memory(const void *data, size_t n, struct tokenizer **out)
{
    *out = nullptr;
    if (!data && n) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: NULL data");
    try {
        const std::string_view bytes(n ? (const char *)data : "", n);
        if (looks_like_json(bytes)) return load_bpe(bytes, "tokenizer.json (memory)", nullptr, 0, out);
        if (looks_like_tiktoken(bytes)) return load_bpe(bytes, "tiktoken (memory)", nullptr, 0, out, true);
        return load_proto(bytes, "tokenizer (memory)", out);
    } catch (const std::bad_alloc &) {
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer (memory): out of memory");
    } catch (const std::exception &e) {
        return status_errorf(STATUS_BAD_FORMAT, "tokenizer (memory): %s", e.what());
    } catch (...) {
        return status_errorf(STATUS_INTERNAL, "tokenizer (memory): unknown exception");
    }
}

enum status tokenizer_load_tiktoken_from_memory(const void *data, size_t n, const char *pattern, struct tokenizer **out)
{
    *out = nullptr;
    if (!data && n) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: NULL data");
    try {
        return load_bpe(std::string_view(n ? (const char *)data : "", n), "tiktoken (memory)", nullptr, 0, out, true, pattern);
    } catch (const std::bad_alloc &) {
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tiktoken (memory): out of memory");
    }
}

void tokenizer_free(struct tokenizer *t)
{
    try {
        delete t;
    } catch (...) {
        /* A destructor that throws would be a library bug; nothing useful to do about it. */
    }
}

int tokenizer_vocab_size(const struct tokenizer *t) { return t->vocab_size; }

const char *tokenizer_kind(const struct tokenizer *t)
{
    return t->bpe ? "tokenizer.json" : t->spm ? "sentencepiece-bpe" : "libsentencepiece";
}

int tokenizer_encodes_special(const struct tokenizer *t) { return t->bpe != nullptr || !t->special_ids.empty(); }
int tokenizer_bos_id(const struct tokenizer *t) { return t->bos_id; }
int tokenizer_eos_id(const struct tokenizer *t) { return t->eos_id; }
int tokenizer_pad_id(const struct tokenizer *t) { return t->pad_id; }
int tokenizer_unk_id(const struct tokenizer *t) { return t->unk_id; }

size_t tokenizer_min_tokens(const struct tokenizer *t, const char *const *texts, const size_t *lens, int n)
{
    if (!t->max_token_bytes) return 0;
    size_t counted = 0;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < lens[i]; k++) {
            const char c = texts[i][k];
            counted += !(c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f');
        }
    return (counted + t->max_token_bytes - 1) / t->max_token_bytes;
}

enum status tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                             int32_t **ids, int *n_ids)
{
    *ids = nullptr;
    *n_ids = 0;
    if (!text && len) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: NULL text");
    if (len > (size_t)INT_MAX)
        return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: text of %zu bytes is too long",
                             len);
    if (t->bpe) {
        size_t n = 0, cap = 0;
        int32_t *p = nullptr;
        enum status s = STATUS_OK;
        if (base_grow((void **)&p, &cap, len / 4 + 2, sizeof *p)) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
        if (s == STATUS_OK && add_bos && t->bos_id >= 0) p[n++] = t->bos_id;
        if (s == STATUS_OK) s = bpe_encode(t->bpe, text, len, &p, &n, &cap);
        for (int k = 0; s == STATUS_OK && add_bos && k < t->bpe->n_post_suffix; k++)
            s = bpe_push_id(&p, &n, &cap, t->bpe->post_suffix[k]);
        if (s == STATUS_OK && n > (size_t)INT_MAX) s = status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: too many tokens");
        if (s != STATUS_OK) {
            free(p);
            return s;
        }
        *ids = p;
        *n_ids = (int)n;
        return STATUS_OK;
    }
    if (add_bos && t->bos_id < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "tokenizer: add_bos asked but the model has no BOS piece");
    try {
        /* The strings of control pieces become their ids (leftmost, then longest); each text
         * between them is encoded on its own, with SentencePiece's dummy prefix. */
        std::vector<int> v, part;
        const std::string_view all(len ? text : "", len);
        size_t seg = 0;
        for (size_t i = 0; i <= len; i++) {
            int32_t id = -1;
            size_t hit = 0;
            for (size_t k = 0; i < len && t->special_first[(uint8_t)text[i]] && k < t->special_lens.size() && id < 0; k++) {
                if ((hit = t->special_lens[k]) > len - i) continue;
                const auto it = t->special_ids.find(all.substr(i, hit));
                if (it != t->special_ids.end()) id = it->second;
            }
            if (id < 0 && i < len) continue;
            if (i > seg || (seg == 0 && i == len)) {
                if (t->spm) {
                    int32_t *p = nullptr;
                    size_t got = 0, cap = 0;
                    const enum status es = spm_encode(t->spm, text + seg, i - seg, &p, &got, &cap);
                    if (es == STATUS_OK) part.assign(p, p + got);
                    free(p);
                    if (es != STATUS_OK) return es;
                } else {
                    const sentencepiece::util::Status st = t->sp.Encode(all.substr(seg, i - seg), &part);
                    if (!st.ok()) return status_from_sp(st, STATUS_INTERNAL, "tokenizer: encode failed");
                }
                v.insert(v.end(), part.begin(), part.end());
            }
            if (id < 0) break;
            v.push_back(id);
            seg = i + hit;
            i = seg - 1;
        }
        const size_t n = v.size() + (add_bos ? 1 : 0);
        if (n > (size_t)INT_MAX)
            return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: too many tokens");
        int32_t *p = (int32_t *)malloc((n ? n : 1) * sizeof *p);
        if (!p) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
        size_t j = 0;
        if (add_bos) p[j++] = t->bos_id;
        for (int id : v) p[j++] = id;
        *ids = p;
        *n_ids = (int)n;
        return STATUS_OK;
    } catch (const std::bad_alloc &) {
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    } catch (...) {
        return status_errorf(STATUS_INTERNAL, "tokenizer: exception while encoding");
    }
}

enum status tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, char **text,
                             size_t *len)
{
    return tokenizer_decode_opts(t, ids, n, 0, text, len);
}

enum status tokenizer_decode_opts(const struct tokenizer *t, const int32_t *ids, int n, int show_special,
                                  char **text, size_t *len)
{
    *text = nullptr;
    *len = 0;
    if (n < 0 || (!ids && n > 0))
        return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: bad id array (n=%d)", n);
    for (int i = 0; i < n; i++)
        if (!id_valid(t, ids[i]))
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "tokenizer: id %d at position %d is outside the vocabulary "
                                 "[0, %d)",
                                 (int)ids[i], i, t->vocab_size);
    if (t->bpe) {
        char *p = nullptr;
        size_t got = 0, cap = 0;
        enum status st = bpe_decode(t->bpe, ids, n, show_special, &p, &got, &cap);
        if (st != STATUS_OK) {
            free(p);
            return st;
        }
        *text = p;
        *len = got;
        return STATUS_OK;
    }
    try {
        std::string s;
        enum status st = show_special ? sp_decode_shown(t, ids, n, &s)
                                      : tokenizer_decode_ids(t, std::vector<int>(ids, ids + n), &s);
        if (st != STATUS_OK) return st;
        char *p = (char *)malloc(s.size() + 1);
        if (!p) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
        memcpy(p, s.data(), s.size());
        p[s.size()] = '\0';
        *text = p;
        *len = s.size();
        return STATUS_OK;
    } catch (const std::bad_alloc &) {
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    } catch (...) {
        return status_errorf(STATUS_INTERNAL, "tokenizer: exception while decoding");
    }
}

const char *tokenizer_id_to_piece(const struct tokenizer *t, int32_t id)
{
    if (!id_valid(t, id)) return nullptr;
    return t->bpe ? t->bpe->pieces[id] : piece_of(t, id).data(); /* NUL-terminated: see tokenizer_impl.h */
}

int32_t tokenizer_piece_to_id(const struct tokenizer *t, const char *piece)
{
    if (!piece) return -1;
    if (t->bpe) return bpe_piece_to_id(t->bpe, piece, strlen(piece));
    try {
        const int id = t->spm ? spm_piece_to_id(t->spm, piece, strlen(piece)) : t->sp.PieceToId(piece);
        /* SentencePiece answers the unk id for pieces it does not know. */
        if (!id_valid(t, id) || piece_of(t, id) != piece) return -1;
        return id;
    } catch (...) {
        return -1;
    }
}

int tokenizer_is_byte(const struct tokenizer *t, int32_t id)
{
    if (id_valid(t, id) && t->bpe) {
        const int v = t->bpe->model == BPE_MODEL_BYTE_LEVEL ? -1 : bpe_byte_piece_value(t->bpe->pieces[id]);
        return v >= 0 && t->bpe->byte_piece[v] == id;
    }
    return id_valid(t, id) && !t->bpe && (t->flags[id] & PIECE_BYTE);
}

int tokenizer_is_control(const struct tokenizer *t, int32_t id)
{
    if (!id_valid(t, id)) return 0;
    return t->bpe ? (t->bpe->flags[id] & BPE_PIECE_SPECIAL) != 0 : (t->flags[id] & PIECE_CONTROL) != 0;
}
}  // extern "C"
