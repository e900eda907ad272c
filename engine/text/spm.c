/* engine/text/spm.c - SentencePiece's BPE model without libsentencepiece (spm.h): the proto's
 * pieces in one arena, two open-addressing tables (normal, user-defined and unused pieces; control,
 * unknown and byte pieces, looked up first, as SentencePiece's PieceToId does), and the encode
 * and decode of SentencePiece 0.1.97 step by step (the function comments name its code). */
#include "spm.h"

#include <stdlib.h>
#include <string.h>

#include "pbwire.h"

struct spm {
    int32_t   n;
    char     *arena;    /* every piece, NUL-terminated, in id order */
    uint32_t *off;      /* (n + 1) piece id is arena[off[id], off[id + 1] - 1) */
    float    *score;    /* (n) */
    uint8_t  *type;     /* (n) enum spm_type */
    uint32_t *normal;   /* slots of id + 1 (0: empty): NORMAL, USER_DEFINED, UNUSED pieces */
    uint32_t *reserved; /* CONTROL, UNKNOWN, BYTE pieces */
    uint32_t *user;     /* USER_DEFINED pieces (the prefix matcher's dictionary) */
    uint32_t  normal_mask, reserved_mask, user_mask;
    /* The distinct lengths of the user-defined pieces starting with byte c, longest first:
     * user_len[user_len_at[c] .. user_len_at[c + 1]). */
    uint32_t *user_len;
    uint32_t  user_len_at[257];
    /* user_second[c] bit d: a user-defined piece of two bytes or more starts with c, d; without
     * it only a one-byte piece can match (Gemma's 30 runs of spaces are not looked up before a
     * letter). */
    uint64_t  user_second[256][4];
    int32_t   unk_id;             /* the UNKNOWN piece (exactly one) */
    int32_t   special[4];         /* spm_special_ids: unk, bos, eos, pad */
    int32_t   byte_id[256];       /* the id of "<0xNN>", -1 when absent */
    int       byte_fallback, add_dummy_prefix, remove_extra_ws, escape_ws, ws_suffix;
    char     *unk_surface;        /* what decode writes for the unknown piece */
    size_t    n_unk_surface;
    /* Normal, user-defined or unused pieces whose string is also a control, unknown or byte
     * piece's, ascending: SentencePiece's Decode takes each id's piece back to an id with
     * PieceToId, which answers the other one (none in the vocabularies seen). */
    int32_t  *shadow;
    size_t    n_shadow;
};

static const char kSpace[] = "\xe2\x96\x81"; /* U+2581 */
static const char kReplacement[] = "\xef\xbf\xbd"; /* U+FFFD */

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory"); }

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = base_fnv1a(1469598103934665603ull, s, n); /* FNV-1a, then a final mix */
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static size_t piece_len(const struct spm *m, int32_t id) { return m->off[id + 1] - m->off[id] - 1; }

static int piece_is(const struct spm *m, int32_t id, const char *s, size_t n)
{
    return piece_len(m, id) == n && !memcmp(m->arena + m->off[id], s, n);
}

static int32_t table_find(const struct spm *m, const uint32_t *slots, uint32_t mask, const char *s, size_t n)
{
    if (!slots) return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        if (!slots[i]) return -1;
        if (piece_is(m, (int32_t)slots[i] - 1, s, n)) return (int32_t)slots[i] - 1;
    }
}

/* A table for count pieces: a power of two at least twice count. */
static uint32_t *table_new(uint32_t count, uint32_t *mask)
{
    uint32_t size = 16;
    while (size < 2 * count) size *= 2;
    *mask = size - 1;
    return calloc(size, sizeof(uint32_t));
}

/* Adds id; 0, or -1 when its piece is there already. */
static int table_add(const struct spm *m, uint32_t *slots, uint32_t mask, int32_t id)
{
    const char *s = m->arena + m->off[id];
    const size_t n = piece_len(m, id);
    uint32_t i = (uint32_t)hash_bytes(s, n) & mask;
    for (; slots[i]; i = (i + 1) & mask)
        if (piece_is(m, (int32_t)slots[i] - 1, s, n)) return -1;
    slots[i] = (uint32_t)id + 1;
    return 0;
}

void spm_free(struct spm *m)
{
    if (!m) return;
    free(m->arena);
    free(m->off);
    free(m->score);
    free(m->type);
    free(m->normal);
    free(m->reserved);
    free(m->user);
    free(m->user_len);
    free(m->unk_surface);
    free(m->shadow);
    free(m);
}

int32_t spm_size(const struct spm *m) { return m->n; }
enum spm_type spm_piece_type(const struct spm *m, int32_t id) { return (enum spm_type)m->type[id]; }

const char *spm_piece(const struct spm *m, int32_t id, size_t *len)
{
    if (len) *len = piece_len(m, id);
    return m->arena + m->off[id];
}

int32_t spm_piece_to_id(const struct spm *m, const char *s, size_t n)
{
    int32_t id = table_find(m, m->reserved, m->reserved_mask, s, n);
    if (id < 0) id = table_find(m, m->normal, m->normal_mask, s, n);
    return id < 0 ? m->unk_id : id;
}

void spm_special_ids(const struct spm *m, int32_t *unk, int32_t *bos, int32_t *eos, int32_t *pad)
{
    *unk = m->special[0], *bos = m->special[1], *eos = m->special[2], *pad = m->special[3];
}

/* ---- loading ------------------------------------------------------------------------------- */

/* The trainer and normalizer specs' fields spm reads, with sentencepiece_model.proto's defaults. */
struct spec {
    uint64_t model_type;  /* trainer 3: UNIGRAM (1) by default; BPE is 2 */
    uint64_t byte_fallback, ws_suffix;
    const uint8_t *names[4]; /* trainer 45-48: unk_piece, bos_piece, eos_piece, pad_piece */
    size_t n_names[4];
    const uint8_t *unk_surface; /* trainer 44 */
    size_t n_unk_surface;
    uint64_t add_dummy_prefix, remove_extra_ws, escape_ws;
    int rules;               /* normalizer 2 or 6 non-empty, or a denormalizer's */
};

/* Reads the fields of one TrainerSpec (which = 2), NormalizerSpec (3) or denormalizer (5) message:
 * a repeated occurrence merges into what came before, as protobuf does. -1 when malformed. */
static int read_spec(const uint8_t *p, size_t len, int which, struct spec *sp)
{
    struct pb_field f;
    for (size_t at = 0; at < len;) {
        if (pb_next_field(p, len, &at, &f)) return -1;
        uint64_t v = 0;
        if (f.wire_type == PB_WIRE_VARINT) {
            size_t a = f.payload;
            pb_read_varint(p, len, &a, &v);
        }
        const uint8_t *bytes = p + f.payload;
        const size_t n = f.end - f.payload;
        if (which == 2) {
            if (f.number == 3 && f.wire_type == PB_WIRE_VARINT) sp->model_type = v;
            else if (f.number == 35 && f.wire_type == PB_WIRE_VARINT) sp->byte_fallback = v != 0;
            else if (f.number == 24 && f.wire_type == PB_WIRE_VARINT) sp->ws_suffix = v != 0;
            else if (f.number == 44 && f.wire_type == PB_WIRE_LEN) sp->unk_surface = bytes, sp->n_unk_surface = n;
            else if (f.number >= 45 && f.number <= 48 && f.wire_type == PB_WIRE_LEN)
                sp->names[f.number - 45] = bytes, sp->n_names[f.number - 45] = n;
        } else if (which == 3) {
            if ((f.number == 2 || f.number == 6) && f.wire_type == PB_WIRE_LEN && n) sp->rules = 1;
            else if (f.number == 3 && f.wire_type == PB_WIRE_VARINT) sp->add_dummy_prefix = v != 0;
            else if (f.number == 4 && f.wire_type == PB_WIRE_VARINT) sp->remove_extra_ws = v != 0;
            else if (f.number == 5 && f.wire_type == PB_WIRE_VARINT) sp->escape_ws = v != 0;
        } else if ((f.number == 2 || f.number == 6) && f.wire_type == PB_WIRE_LEN && n) {
            sp->rules = 1; /* a denormalizer with rules */
        }
    }
    return 0;
}

/* One SentencePiece message (piece 1, score 2, type 3); -1 when malformed or of an unknown type. */
static int read_piece(const uint8_t *p, size_t len, const uint8_t **piece, size_t *n, float *score, int *type)
{
    struct pb_field f;
    *piece = NULL, *n = 0, *score = 0.0f, *type = SPM_NORMAL;
    for (size_t at = 0; at < len;) {
        if (pb_next_field(p, len, &at, &f)) return -1;
        if (f.number == 1 && f.wire_type == PB_WIRE_LEN) {
            *piece = p + f.payload, *n = f.end - f.payload;
        } else if (f.number == 2 && f.wire_type == PB_WIRE_32BIT) {
            memcpy(score, p + f.payload, 4);
        } else if (f.number == 3 && f.wire_type == PB_WIRE_VARINT) {
            uint64_t v = 0;
            size_t a = f.payload;
            pb_read_varint(p, len, &a, &v);
            if (v < SPM_NORMAL || v > SPM_BYTE) return -1; /* protobuf would keep it as unknown */
            *type = (int)v;
        }
    }
    return 0;
}

/* "<0xNN>" -> NN, else -1 (SentencePiece's PieceToByte: exactly that spelling, upper-case hex). */
static int byte_of_piece(const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    const char *hi = memchr(hex, s[3], 16), *lo = memchr(hex, s[4], 16);
    if (!hi || !lo) return -1;
    return (int)((hi - hex) * 16 + (lo - hex));
}

static int cmp_u32_desc(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

/* The prefix matcher's index: per first byte, the user-defined pieces' distinct lengths. */
static int index_user(struct spm *m, uint32_t n_user)
{
    uint32_t *lens = malloc((n_user ? n_user : 1) * sizeof *lens);
    uint8_t *first = malloc(n_user ? n_user : 1);
    m->user = table_new(n_user, &m->user_mask);
    if (!lens || !first || !m->user) {
        free(lens);
        free(first);
        return -1;
    }
    uint32_t k = 0;
    memset(m->user_len_at, 0, sizeof m->user_len_at);
    for (int32_t id = 0; id < m->n; id++) {
        if (m->type[id] != SPM_USER_DEFINED) continue;
        table_add(m, m->user, m->user_mask, id); /* a duplicate: refused by spm_load's check */
        first[k] = (uint8_t)m->arena[m->off[id]];
        lens[k++] = (uint32_t)piece_len(m, id);
        if (lens[k - 1] >= 2) {
            const uint8_t d = (uint8_t)m->arena[m->off[id] + 1];
            m->user_second[first[k - 1]][d >> 6] |= 1ull << (d & 63);
        }
        m->user_len_at[first[k - 1] + 1]++;
    }
    for (int c = 0; c < 256; c++) m->user_len_at[c + 1] += m->user_len_at[c];
    m->user_len = malloc((n_user ? n_user : 1) * sizeof *m->user_len);
    if (!m->user_len) {
        free(lens);
        free(first);
        return -1;
    }
    uint32_t fill[256];
    memcpy(fill, m->user_len_at, sizeof fill);
    for (uint32_t i = 0; i < k; i++) m->user_len[fill[first[i]]++] = lens[i];
    /* Sort each byte's lengths, longest first, and drop repeats (the tail stays unused). */
    for (int c = 0; c < 256; c++) {
        uint32_t *l = m->user_len + m->user_len_at[c];
        const uint32_t cnt = m->user_len_at[c + 1] - m->user_len_at[c];
        qsort(l, cnt, sizeof *l, cmp_u32_desc);
        uint32_t u = 0;
        for (uint32_t i = 0; i < cnt; i++)
            if (!u || l[u - 1] != l[i]) l[u++] = l[i];
        for (uint32_t i = u; i < cnt; i++) l[i] = 0; /* 0: end of this byte's list */
    }
    free(lens);
    free(first);
    return 0;
}

/* Whether a SelfTestData message (ModelProto field 4) holds samples, which SentencePiece encodes at
 * load and refuses the model when one differs (left to it), or is malformed, which fails its
 * parse (found by fuzz_spm: spm.c took a proto whose field 4 protobuf could not read). */
static int self_test_samples(const uint8_t *p, size_t len)
{
    struct pb_field f;
    for (size_t at = 0; at < len;)
        if (pb_next_field(p, len, &at, &f) || f.number == 1) return 1;
    return 0;
}

enum status spm_load(const void *proto, size_t len, struct spm **out)
{
    *out = NULL;
    const uint8_t *p = proto;
    struct spec sp = {.model_type = 1, .add_dummy_prefix = 1, .remove_extra_ws = 1, .escape_ws = 1};
    static const char *const default_names[4] = {"<unk>", "<s>", "</s>", "<pad>"};
    size_t n_pieces = 0, arena_bytes = 0;
    struct pb_field f;
    /* Pass 1: the specs, the number of pieces and their bytes. */
    for (size_t at = 0; at < len;) {
        if (pb_next_field(p, len, &at, &f)) return STATUS_UNSUPPORTED;
        if (f.wire_type != PB_WIRE_LEN) continue;
        if (f.number == 1) {
            const uint8_t *piece;
            size_t n;
            float score;
            int type;
            if (read_piece(p + f.payload, f.end - f.payload, &piece, &n, &score, &type) || !n || memchr(piece, 0, n))
                return STATUS_UNSUPPORTED; /* SentencePiece refuses empty pieces; NUL: its C strings */
            n_pieces++;
            arena_bytes += n + 1;
        } else if ((f.number == 2 || f.number == 3 || f.number == 5) &&
                   read_spec(p + f.payload, f.end - f.payload, (int)f.number, &sp)) {
            return STATUS_UNSUPPORTED;
        } else if (f.number == 4 && self_test_samples(p + f.payload, f.end - f.payload)) {
            return STATUS_UNSUPPORTED;
        }
    }
    if (sp.model_type != 2 || sp.rules || !n_pieces || n_pieces > INT32_MAX / 2 || arena_bytes > UINT32_MAX)
        return STATUS_UNSUPPORTED;

    struct spm *m = calloc(1, sizeof *m);
    if (!m) return oom();
    m->n = (int32_t)n_pieces;
    m->arena = malloc(arena_bytes);
    m->off = malloc((n_pieces + 1) * sizeof *m->off);
    m->score = malloc(n_pieces * sizeof *m->score);
    m->type = malloc(n_pieces);
    if (!m->arena || !m->off || !m->score || !m->type) {
        spm_free(m);
        return oom();
    }
    /* Pass 2: the pieces. */
    uint32_t k = 0, pos = 0, n_normal = 0, n_reserved = 0, n_user = 0;
    for (size_t at = 0; at < len;) {
        pb_next_field(p, len, &at, &f);
        if (f.wire_type != PB_WIRE_LEN || f.number != 1) continue;
        const uint8_t *piece;
        size_t n;
        int type;
        read_piece(p + f.payload, f.end - f.payload, &piece, &n, &m->score[k], &type);
        m->type[k] = (uint8_t)type;
        m->off[k++] = pos;
        memcpy(m->arena + pos, piece, n);
        m->arena[pos + n] = '\0';
        pos += (uint32_t)n + 1;
        if (type == SPM_NORMAL || type == SPM_USER_DEFINED || type == SPM_UNUSED) n_normal++;
        else n_reserved++;
        n_user += type == SPM_USER_DEFINED;
    }
    m->off[k] = pos;
    m->normal = table_new(n_normal, &m->normal_mask);
    m->reserved = table_new(n_reserved, &m->reserved_mask);
    if (!m->normal || !m->reserved || index_user(m, n_user)) {
        spm_free(m);
        return oom();
    }
    /* SentencePiece's InitializePieces: no piece twice within its table, exactly one unknown
     * piece, byte pieces only with byte_fallback and then all 256 of them. */
    int bad = 0, n_bytes = 0;
    m->unk_id = -1;
    for (int c = 0; c < 256; c++) m->byte_id[c] = -1;
    for (int32_t id = 0; id < m->n && !bad; id++) {
        const int t = m->type[id];
        const int normal = t == SPM_NORMAL || t == SPM_USER_DEFINED || t == SPM_UNUSED;
        bad |= table_add(m, normal ? m->normal : m->reserved, normal ? m->normal_mask : m->reserved_mask, id);
        if (t == SPM_UNKNOWN) {
            bad |= m->unk_id >= 0;
            m->unk_id = id;
        } else if (t == SPM_BYTE) {
            const int b = byte_of_piece(m->arena + m->off[id], piece_len(m, id));
            bad |= !sp.byte_fallback || b < 0;
            if (b >= 0 && m->byte_id[b] < 0) m->byte_id[b] = id, n_bytes++;
        }
    }
    if (bad || m->unk_id < 0 || (sp.byte_fallback && n_bytes != 256)) {
        spm_free(m);
        return STATUS_UNSUPPORTED;
    }
    for (int32_t id = 0; id < m->n; id++) {
        const int t = m->type[id];
        if ((t != SPM_NORMAL && t != SPM_USER_DEFINED && t != SPM_UNUSED) ||
            table_find(m, m->reserved, m->reserved_mask, m->arena + m->off[id], piece_len(m, id)) < 0)
            continue;
        int32_t *grown = realloc(m->shadow, (m->n_shadow + 1) * sizeof *grown);
        if (!grown) {
            spm_free(m);
            return oom();
        }
        m->shadow = grown;
        m->shadow[m->n_shadow++] = id;
    }
    m->byte_fallback = (int)sp.byte_fallback;
    m->add_dummy_prefix = (int)sp.add_dummy_prefix;
    m->remove_extra_ws = (int)sp.remove_extra_ws;
    m->escape_ws = (int)sp.escape_ws;
    m->ws_suffix = (int)sp.ws_suffix;
    const char *surface = sp.unk_surface ? (const char *)sp.unk_surface : " \xe2\x81\x87 ";
    m->n_unk_surface = sp.unk_surface ? sp.n_unk_surface : strlen(surface);
    /* SentencePiece reads unk_surface and the *_piece names as C strings. */
    const char *nul = memchr(surface, 0, m->n_unk_surface);
    if (nul) m->n_unk_surface = (size_t)(nul - surface);
    m->unk_surface = malloc(m->n_unk_surface + 1);
    if (!m->unk_surface) {
        spm_free(m);
        return oom();
    }
    memcpy(m->unk_surface, surface, m->n_unk_surface);
    m->unk_surface[m->n_unk_surface] = '\0';
    for (int s = 0; s < 4; s++) {
        const char *name = sp.names[s] ? (const char *)sp.names[s] : default_names[s];
        size_t n = sp.names[s] ? sp.n_names[s] : strlen(name);
        const char *z = memchr(name, 0, n);
        if (z) n = (size_t)(z - name);
        const int32_t id = spm_piece_to_id(m, name, n);
        const int want = s == 0 ? SPM_UNKNOWN : SPM_CONTROL;
        m->special[s] = m->type[id] == want ? id : -1;
    }
    *out = m;
    return STATUS_OK;
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* SentencePiece's string_util::DecodeUTF8 length and validity (IsValidDecodeUTF8: a well-formed
 * U+FFFD is valid). */
static int utf8_valid(const uint8_t *s, size_t len, size_t *mblen)
{
    *mblen = 1;
    if (s[0] < 0x80) return 1;
    uint32_t cp;
    size_t need;
    if (len >= 2 && (s[0] & 0xE0) == 0xC0) cp = s[0] & 0x1F, need = 2;
    else if (len >= 3 && (s[0] & 0xF0) == 0xE0) cp = s[0] & 0x0F, need = 3;
    else if (len >= 4 && (s[0] & 0xF8) == 0xF0) cp = s[0] & 0x07, need = 4;
    else return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[need] || (cp >= 0xD800 && cp < 0xE000) || cp > 0x10FFFF) return 0;
    *mblen = need;
    return 1;
}

/* PrefixMatcher::PrefixMatch: the longest user-defined piece at s (*found), else one
 * character's bytes by its lead byte (at most len). */
static size_t prefix_match(const struct spm *m, const char *s, size_t len, int *found)
{
    const uint8_t c = (uint8_t)s[0];
    const int longer = len >= 2 && (m->user_second[c][(uint8_t)s[1] >> 6] >> ((uint8_t)s[1] & 63) & 1);
    for (uint32_t i = m->user_len_at[c]; i < m->user_len_at[c + 1] && m->user_len[i]; i++) {
        const uint32_t l = m->user_len[i];
        if (l <= len && (l == 1 || longer) && table_find(m, m->user, m->user_mask, s, l) >= 0) {
            *found = 1;
            return l;
        }
    }
    *found = 0;
    static const uint8_t one_char[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    const size_t l = one_char[c >> 4];
    return l < len ? l : len;
}

struct buf {
    char  *p;
    size_t n, cap;
};

static int buf_put(struct buf *b, const char *s, size_t n)
{
    if (!n) return 0; /* an empty unk_surface: nothing to add (and b->p may still be NULL) */
    if (base_grow((void **)&b->p, &b->cap, b->n + n, 1)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* Normalizer::NormalizePrefix at in[at, len): a user-defined piece whole, else one valid
 * character, else U+FFFD for one byte; *used: the input bytes it takes. */
static const char *norm_prefix(const struct spm *m, const char *in, size_t len, size_t at, size_t *n_piece, size_t *used)
{
    int found;
    size_t l = prefix_match(m, in + at, len - at, &found);
    if (!found && !utf8_valid((const uint8_t *)in + at, len - at, &l)) {
        *n_piece = 3, *used = 1;
        return kReplacement;
    }
    *n_piece = *used = l;
    return in + at;
}

/* Normalizer::Normalize without a character map: in[0, len) -> b. */
static int normalize(const struct spm *m, const char *in, size_t len, struct buf *b)
{
    const char *ws = m->escape_ws ? kSpace : " ";
    const size_t n_ws = m->escape_ws ? 3 : 1;
    size_t at = 0, n_piece, used;
    while (m->remove_extra_ws && at < len) {
        const char *piece = norm_prefix(m, in, len, at, &n_piece, &used);
        if (n_piece != 1 || piece[0] != ' ') break;
        at += used;
    }
    if (at == len) return 0;
    if (!m->ws_suffix && m->add_dummy_prefix && buf_put(b, ws, n_ws)) return -1;
    int prev_space = m->remove_extra_ws;
    while (at < len) {
        const char *piece = norm_prefix(m, in, len, at, &n_piece, &used);
        while (prev_space && n_piece && piece[0] == ' ') piece++, n_piece--;
        if (n_piece) {
            for (size_t i = 0; i < n_piece; i++)
                if (m->escape_ws && piece[i] == ' ' ? buf_put(b, kSpace, 3) : buf_put(b, piece + i, 1)) return -1;
            prev_space = piece[n_piece - 1] == ' ';
        }
        at += used;
        if (!m->remove_extra_ws) prev_space = 0;
    }
    if (m->remove_extra_ws)
        while (b->n >= n_ws && !memcmp(b->p + b->n - n_ws, ws, n_ws)) b->n -= n_ws;
    if (m->ws_suffix && m->add_dummy_prefix && buf_put(b, ws, n_ws)) return -1;
    return 0;
}

struct symbol {
    int32_t prev, next; /* -1 at the ends */
    int     freeze;     /* a user-defined piece: never merged */
    uint32_t at, n;     /* the bytes norm[at, at + n); n = 0 once merged into its left */
};

struct pair {
    int32_t  left, right;
    float    score;
    uint32_t size;
};

/* The agenda's order (bpe_model.cc SymbolPairComparator): the higher score, then the leftmost. */
static int pair_before(const struct pair *x, const struct pair *y)
{
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

struct heap {
    struct pair *h;
    size_t n, cap;
};

static int heap_push(struct heap *q, struct pair v)
{
    if (base_grow((void **)&q->h, &q->cap, q->n + 1, sizeof *q->h)) return -1;
    size_t i = q->n++;
    while (i && pair_before(&v, &q->h[(i - 1) / 2])) {
        q->h[i] = q->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->h[i] = v;
    return 0;
}

static struct pair heap_pop(struct heap *q)
{
    const struct pair top = q->h[0], last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && pair_before(&q->h[c + 1], &q->h[c])) c++;
        if (!pair_before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

/* rev_merge: for each merged string that is an unused piece, the split that made it last
 * (bpe_model.cc keys its map by the string: a later pair overwrites). */
struct rev {
    uint32_t at, n, left_n; /* norm[at, at + n), its left part left_n bytes */
};

struct encoder {
    const struct spm *m;
    const char *norm;
    struct symbol *sym;
    struct heap agenda;
    struct rev *revs;
    size_t n_revs, cap_revs;
    uint32_t *rev_slots, rev_mask; /* index + 1 into revs, by string: built after the merges */
};

/* MaybeAddNewSymbolPair. */
static int add_pair(struct encoder *e, int32_t left, int32_t right)
{
    if (left < 0 || right < 0 || e->sym[left].freeze || e->sym[right].freeze) return 0;
    const struct spm *m = e->m;
    const char *s = e->norm + e->sym[left].at;
    const uint32_t n = e->sym[left].n + e->sym[right].n;
    const int32_t id = table_find(m, m->normal, m->normal_mask, s, n);
    if (id < 0) return 0;
    if (heap_push(&e->agenda, (struct pair){left, right, m->score[id], n})) return -1;
    if (m->type[id] == SPM_UNUSED) {
        if (base_grow((void **)&e->revs, &e->cap_revs, e->n_revs + 1, sizeof *e->revs)) return -1;
        e->revs[e->n_revs++] = (struct rev){e->sym[left].at, n, e->sym[left].n};
    }
    return 0;
}

static int build_revs(struct encoder *e)
{
    if (!e->n_revs) return 0;
    e->rev_slots = table_new((uint32_t)e->n_revs, &e->rev_mask);
    if (!e->rev_slots) return -1;
    for (size_t r = 0; r < e->n_revs; r++) {
        const char *s = e->norm + e->revs[r].at;
        const uint32_t n = e->revs[r].n;
        uint32_t i = (uint32_t)hash_bytes(s, n) & e->rev_mask;
        for (; e->rev_slots[i]; i = (i + 1) & e->rev_mask) {
            const struct rev *o = &e->revs[e->rev_slots[i] - 1];
            if (o->n == n && !memcmp(e->norm + o->at, s, n)) break;
        }
        e->rev_slots[i] = (uint32_t)r + 1; /* the later one wins */
    }
    return 0;
}

static const struct rev *find_rev(const struct encoder *e, const char *s, uint32_t n)
{
    if (!e->rev_slots) return NULL;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & e->rev_mask; e->rev_slots[i]; i = (i + 1) & e->rev_mask) {
        const struct rev *o = &e->revs[e->rev_slots[i] - 1];
        if (o->n == n && !memcmp(e->norm + o->at, s, n)) return o;
    }
    return NULL;
}

/* What PopulateSentencePieceText makes of the model's output, one piece at a time. */
struct emitter {
    const struct spm *m;
    int32_t **ids;
    size_t *n, *cap;
    int prev_unk, control; /* control: a control id came out (SentencePiece's consumed check fails) */
};

static int emit_id(struct emitter *o, int32_t id)
{
    if (base_grow((void **)o->ids, o->cap, *o->n + 1, sizeof **o->ids)) return -1;
    (*o->ids)[(*o->n)++] = id;
    return 0;
}

static int emit_piece(struct emitter *o, const char *s, uint32_t n, int32_t id)
{
    const struct spm *m = o->m;
    const int unk = m->type[id] == SPM_UNKNOWN;
    int rc = 0;
    if (m->type[id] == SPM_CONTROL) {
        o->control = 1;
        rc = emit_id(o, id);
    } else if (unk && m->byte_fallback) {
        for (uint32_t i = 0; i < n && !rc; i++) rc = emit_id(o, m->byte_id[(uint8_t)s[i]]);
    } else if (!(unk && o->prev_unk)) {
        rc = emit_id(o, id);
    }
    o->prev_unk = unk;
    return rc;
}

/* The resegment lambda: an unused piece goes back to the pair that made it, recursively. */
static int resegment(const struct encoder *e, struct emitter *o, const char *s, uint32_t n, int depth)
{
    const int32_t id = spm_piece_to_id(e->m, s, n);
    const struct rev *r = e->m->type[id] == SPM_UNUSED && depth < 4096 ? find_rev(e, s, n) : NULL;
    if (!r) return emit_piece(o, s, n, id);
    const char *base = e->norm + r->at;
    if (resegment(e, o, base, r->left_n, depth + 1)) return -1;
    return resegment(e, o, base + r->left_n, n - r->left_n, depth + 1);
}

/* bpe::Model::SampleEncode (alpha 0) over norm[0, len). */
static int encode_normalized(const struct spm *m, const char *norm, size_t len, struct emitter *o)
{
    struct encoder e = {.m = m, .norm = norm};
    size_t n_sym = 0;
    int rc = -1;
    e.sym = malloc((len ? len : 1) * sizeof *e.sym);
    if (!e.sym) return -1;
    for (size_t at = 0; at < len;) {
        int found;
        const size_t l = prefix_match(m, norm + at, len - at, &found);
        e.sym[n_sym] = (struct symbol){(int32_t)n_sym - 1, -1, found, (uint32_t)at, (uint32_t)l};
        at += l;
        if (at < len) e.sym[n_sym].next = (int32_t)n_sym + 1;
        n_sym++;
    }
    for (size_t i = 1; i < n_sym; i++)
        if (add_pair(&e, (int32_t)i - 1, (int32_t)i)) goto done;
    while (e.agenda.n) {
        const struct pair top = heap_pop(&e.agenda);
        struct symbol *l = &e.sym[top.left], *r = &e.sym[top.right];
        if (!l->n || !r->n || l->n + r->n != top.size) continue;
        l->n += r->n;
        l->next = r->next;
        if (r->next >= 0) e.sym[r->next].prev = top.left;
        r->n = 0;
        if (add_pair(&e, l->prev, top.left) || add_pair(&e, top.left, l->next)) goto done;
    }
    if (build_revs(&e)) goto done;
    for (int32_t i = n_sym ? 0 : -1; i >= 0; i = e.sym[i].next)
        if (resegment(&e, o, norm + e.sym[i].at, e.sym[i].n, 0)) goto done;
    rc = 0;
done:
    free(e.sym);
    free(e.agenda.h);
    free(e.revs);
    free(e.rev_slots);
    return rc;
}

enum status spm_encode(const struct spm *m, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap)
{
    struct buf norm = {0};
    struct emitter o = {.m = m, .ids = ids, .n = n, .cap = cap};
    if (normalize(m, text, len, &norm) || encode_normalized(m, norm.p, norm.n, &o)) {
        free(norm.p);
        return oom();
    }
    free(norm.p);
    if (o.control)
        return status_errorf(STATUS_INTERNAL, "tokenizer: encode failed (a piece of the text is also a control piece)");
    return STATUS_OK;
}

/* ---- decoding ------------------------------------------------------------------------------ */

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* ProcessBytePieces: the bytes of a run of byte pieces, one U+FFFD per byte that does not start
 * a well-formed character. */
static int flush_bytes(struct buf *b, const uint8_t *bytes, size_t n)
{
    for (size_t at = 0; at < n;) {
        size_t mb;
        const int ok = utf8_valid(bytes + at, n - at, &mb);
        if (ok ? buf_put(b, (const char *)bytes + at, mb) : buf_put(b, kReplacement, 3)) return -1;
        at += mb;
    }
    return 0;
}

enum status spm_decode(const struct spm *m, const int32_t *ids, size_t n, char **out, size_t *len, size_t *cap)
{
    struct buf b = {*out, *len, *cap};
    const size_t start = b.n; /* SentencePiece's text starts empty: only what this call writes counts */
    uint8_t *bytes = malloc(n ? n : 1);
    size_t n_bytes = 0;
    int is_bos_ws = 1, bos_ws_seen = 0, rc = bytes ? 0 : -1;
    const int strip_first = m->add_dummy_prefix || m->remove_extra_ws;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (m->n_shadow && bsearch(&id, m->shadow, m->n_shadow, sizeof id, cmp_i32))
            id = spm_piece_to_id(m, m->arena + m->off[id], piece_len(m, id));
        const int t = m->type[id];
        if (t == SPM_BYTE) {
            bytes[n_bytes++] = (uint8_t)byte_of_piece(m->arena + m->off[id], piece_len(m, id));
            continue;
        }
        rc = flush_bytes(&b, bytes, n_bytes);
        n_bytes = 0;
        if (bos_ws_seen || b.n > start) is_bos_ws = 0;
        bos_ws_seen = 0;
        if (t == SPM_CONTROL) continue;
        if (t == SPM_UNKNOWN) {
            rc = rc ? rc : buf_put(&b, m->unk_surface, m->n_unk_surface);
            continue;
        }
        const char *s = m->arena + m->off[id];
        size_t k = piece_len(m, id);
        if (is_bos_ws && strip_first && k >= 3 && !memcmp(s, kSpace, 3)) {
            s += 3, k -= 3;
            bos_ws_seen = !m->remove_extra_ws;
        }
        for (size_t j = 0; j < k && !rc;) {
            if (j + 3 <= k && !memcmp(s + j, kSpace, 3)) {
                rc = buf_put(&b, " ", 1);
                j += 3;
            } else {
                rc = buf_put(&b, s + j, 1);
                j++;
            }
        }
    }
    if (!rc) rc = flush_bytes(&b, bytes, n_bytes);
    free(bytes);
    *out = b.p, *len = b.n, *cap = b.cap;
    return rc ? oom() : STATUS_OK;
}
