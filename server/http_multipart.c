/* server/http_multipart.c - multipart/form-data bodies (RFC 7578), as the openai client's
 * files.create sends them: split into parts with their name, filename and bytes (borrowed from the
 * body). Used by /v1/files (http_finetune.c). Tests: tests/server/test_finetune.py. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base.h"
#include "http_internal.h"

/* The value of `key="..."` in a Content-Disposition line [p, end). */
static void disposition_value(const char *p, const char *end, const char *key, char *out, size_t cap)
{
    out[0] = 0;
    char pat[32];
    snprintf(pat, sizeof pat, "%s=\"", key);
    for (const char *q = p; q + strlen(pat) <= end; q++) {
        if (strncmp(q, pat, strlen(pat)) || (q > p && q[-1] != ' ' && q[-1] != ';')) continue;
        q += strlen(pat);
        const char *e = memchr(q, '"', (size_t)(end - q));
        if (!e) return;
        size_t n = (size_t)(e - q) < cap - 1 ? (size_t)(e - q) : cap - 1;
        memcpy(out, q, n);
        out[n] = 0;
        return;
    }
}

enum status http_multipart(const char *ctype, const char *body, size_t len, struct http_part *parts, int max, int *n)
{
    const char *b = ctype ? strstr(ctype, "boundary=") : NULL;
    if (!ctype || strncasecmp(ctype, "multipart/form-data", 19) || !b)
        return status_errorf(STATUS_INVALID_ARGUMENT, "an upload is multipart/form-data with a boundary (the openai "
                                                      "client's files.create sends one)");
    char delim[200];
    b += 9;
    size_t bl = strcspn(b, "; ");
    if (*b == '"') b++, bl = strcspn(b, "\"");
    if (bl == 0 || bl > 150) return status_errorf(STATUS_INVALID_ARGUMENT, "multipart boundary of %zu bytes", bl);
    int dl = snprintf(delim, sizeof delim, "\r\n--%.*s", (int)bl, b);
    *n = 0;
    /* The first delimiter has no CRLF before it. */
    const char *p = memmem(body, len, delim + 2, (size_t)dl - 2), *end = body + len;
    while (p) {
        p += dl - 2;
        if (end - p >= 2 && !memcmp(p, "--", 2)) return STATUS_OK; /* the closing delimiter */
        if (end - p < 2 || memcmp(p, "\r\n", 2)) break;
        p += 2;
        const char *hdr_end = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hdr_end) break;
        const char *next = memmem(hdr_end + 4, (size_t)(end - hdr_end - 4), delim, (size_t)dl);
        if (!next) break;
        if (*n == max) return status_errorf(STATUS_INVALID_ARGUMENT, "more than %d parts in the upload", max);
        struct http_part *pt = &parts[(*n)++];
        disposition_value(p, hdr_end, "name", pt->name, sizeof pt->name);
        disposition_value(p, hdr_end, "filename", pt->filename, sizeof pt->filename);
        pt->data = hdr_end + 4;
        pt->len = (size_t)(next - pt->data);
        p = next + 2;
    }
    return status_errorf(STATUS_INVALID_ARGUMENT, "the multipart/form-data body is malformed (no closing boundary)");
}

