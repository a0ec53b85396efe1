/*
 * server/head.c: the request head as bytes. libmicrohttpd 0.9.75 (Debian 12)
 * hands header values over as C strings, so a NUL in a value silently cut
 * it short ("Bearer <key>\0junk" authenticated), and it accepts framing that
 * RFC 9112 says to reject (two Content-Length headers, whitespace before a
 * colon, HTTP/1.1 without Host, unknown transfer codings that then hang).
 *
 * 0.9.75 parses the head in place: the request line and every header line
 * stay where they were received, their CR, LF and colon overwritten by NUL,
 * and MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE tells where the head ends. So
 * the raw length of each value is the distance to the next line, less its
 * line terminator; walking the head checks that nothing else is in between.
 * Newer libmicrohttpd (>= 1.0) checks these bytes itself
 * (MHD_OPTION_CLIENT_DISCIPLINE_LVL) and keeps lengths; there the values are
 * taken as it reports them.
 *
 * The one form the walk cannot see: a NUL right before a bare LF ("v\0\n")
 * looks exactly like "v\r\n" once parsed; such a value is read as "v".
 */
#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server.h"

#define HEAD_FIELDS_MAX 256

static int is_tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

typedef struct {
	req_head *h;
	int overflow, nomem;
} collect_ctx;

/* Fields room in the arena to begin with; requests rarely send more. */
#define HEAD_FIELDS_FIRST 16

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                               const char *value, size_t value_size)
{
	collect_ctx *c = cls;
	head_field *f;

	(void)kind;
	if (c->h->n >= HEAD_FIELDS_MAX) {
		c->overflow = 1;
		return MHD_NO;
	}
	if (c->h->n == c->h->cap) { /* rare: more fields than the first guess */
		size_t cap = c->h->cap * 2 < HEAD_FIELDS_MAX ? c->h->cap * 2 : HEAD_FIELDS_MAX;
		head_field *more = arena_alloc(c->h->arena, cap * sizeof(*more));

		if (!more) {
			c->nomem = 1;
			return MHD_NO;
		}
		memcpy(more, c->h->f, c->h->n * sizeof(*more));
		c->h->f = more;
		c->h->cap = cap;
	}
	f = &c->h->f[c->h->n++];
	f->name = key;
	f->name_len = key_size;
	f->value = value ? value : "";
	f->len = value ? value_size : 0;
	f->nul = 0;
	return MHD_YES;
}

static int bad(http_answer *a, int status, const char *code, const char *detail)
{
	answer_problem(a, status, code, detail);
	a->close = 1;
	return -1;
}

static int all_zero(uintptr_t from, uintptr_t to)
{
	for (const char *p = (const char *)from; (uintptr_t)p < to; p++)
		if (*p)
			return 0;
	return 1;
}

#if MHD_VERSION < 0x00097600
/* The in-place walk described at the top. 0: the fields' len are raw. */
static int walk(req_head *h, struct MHD_Connection *conn, const char *method, const char *url,
                const char *version, size_t raw_uri_len, http_answer *a)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
	uintptr_t start = (uintptr_t)method, end, pos;

	if (!ci || ci->header_size == 0)
		return bad(a, 400, "invalid_request", "malformed request head");
	end = start + ci->header_size;
	if ((uintptr_t)url != start + strlen(method) + 1)
		return bad(a, 400, "invalid_request",
		           "the request line must be METHOD SP target SP version");
	if ((uintptr_t)version != (uintptr_t)url + raw_uri_len + 1 || strlen(version) != 8)
		return bad(a, 400, "invalid_request", "the request line holds a NUL byte");
	pos = (uintptr_t)version + 8; /* the request line's CR LF, now NUL NUL */
	if (h->n == 0) {
		if (end < pos + 2 || end > pos + 4 || !all_zero(pos, end))
			return bad(a, 400, "invalid_request", "malformed request line");
		return 0;
	}
	if ((uintptr_t)h->f[0].name < pos + 1 || (uintptr_t)h->f[0].name > pos + 2 ||
	    !all_zero(pos, (uintptr_t)h->f[0].name))
		return bad(a, 400, "invalid_request", "malformed request line");
	for (size_t i = 0; i < h->n; i++) {
		head_field *f = &h->f[i];
		const char *k = f->name;
		uintptr_t v = (uintptr_t)f->value, ows = (uintptr_t)k + f->name_len + 1;
		uintptr_t next = i + 1 < h->n ? (uintptr_t)h->f[i + 1].name : end, stop = next;
		size_t strip = i + 1 < h->n ? 2 : 4; /* CR LF, and the empty line's */

		if (f->name_len == 0 || k[f->name_len] != '\0')
			return bad(a, 400, "invalid_request", "malformed header section");
		for (size_t j = 0; j < f->name_len; j++)
			if (!is_tchar((unsigned char)k[j]))
				return bad(a, 400, "invalid_request",
				           "a header name is not a token (whitespace before the "
				           "colon?)");
		/* folded (obs-fold) values are copied elsewhere: rejected here */
		if (v < ows || next <= v + f->len || next > end)
			return bad(a, 400, "invalid_request", "malformed header section");
		for (; ows < v; ows++)
			if (*(const char *)ows != ' ' && *(const char *)ows != '\t')
				return bad(a, 400, "invalid_request", "malformed header section");
		while (strip-- > 0 && stop > v + f->len && *(const char *)(stop - 1) == '\0')
			stop--;
		if (stop > v + f->len) { /* bytes after a NUL: part of the value */
			f->nul = 1;
			f->len = (size_t)(stop - v);
		}
	}
	return 0;
}
#endif

static const head_field *find(const req_head *h, const char *name, int *count)
{
	const head_field *found = NULL;
	size_t nlen = strlen(name);

	*count = 0;
	for (size_t i = 0; i < h->n; i++) {
		if (h->f[i].name_len == nlen && strncasecmp(h->f[i].name, name, nlen) == 0) {
			if (!found)
				found = &h->f[i];
			(*count)++;
		}
	}
	return found;
}

const char *head_get(const req_head *h, const char *name, size_t *len, int *count)
{
	int n = 0;
	const head_field *f = find(h, name, &n);

	if (count)
		*count = n;
	if (len)
		*len = f ? f->len : 0;
	return f ? f->value : NULL;
}

/* Trim optional whitespace (SP, HTAB) on both sides of a value. */
void head_trim(const char **v, size_t *len)
{
	while (*len > 0 && (**v == ' ' || **v == '\t')) {
		(*v)++;
		(*len)--;
	}
	while (*len > 0 && ((*v)[*len - 1] == ' ' || (*v)[*len - 1] == '\t'))
		(*len)--;
}

/* Headers whose consumers check every byte and answer with their own problem. */
static int checked_later(const head_field *f)
{
	static const struct {
		const char *name;
		size_t len;
	} names[] = {{"Authorization", 13}, {"Idempotency-Key", 15}, {"X-Signature", 11}};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (f->name_len == names[i].len &&
		    strncasecmp(f->name, names[i].name, f->name_len) == 0)
			return 1;
	return 0;
}

static int framing(const req_head *h, const char *version, http_answer *a)
{
	static const char *const single[] = {"Host",          "Content-Length", "Transfer-Encoding",
	                                     "Authorization", "Content-Type",   "X-Signature"};
	const char *v;
	size_t len;
	int n, has_cl;

	for (size_t i = 0; i < h->n; i++) {
		const head_field *f = &h->f[i];

		if (f->len == 0 || checked_later(f)) /* once per field, not per byte */
			continue;
		for (size_t j = 0; j < f->len; j++) {
			unsigned char c = (unsigned char)f->value[j];

			if ((c < 0x20 && c != '\t') || c == 0x7f)
				return bad(a, 400, "invalid_request",
				           "a header value holds a control character");
		}
	}
	for (size_t i = 0; i < sizeof(single) / sizeof(single[0]); i++) {
		head_get(h, single[i], NULL, &n);
		if (n > 1)
			return bad(a, 400, "invalid_request",
			           single[i][0] == 'H' ? "send exactly one Host header"
			           : single[i][0] == 'C'
			               ? "send each of Content-Length and "
			                 "Content-Type at most once"
			               : "a header that must be unique is repeated");
	}
	if (strcmp(version, "HTTP/1.0") != 0 && !head_get(h, "Host", NULL, NULL))
		return bad(a, 400, "invalid_request", "HTTP/1.1 requires a Host header");
	v = head_get(h, "Content-Length", &len, NULL);
	has_cl = v != NULL;
	if (v) {
		head_trim(&v, &len);
		if (len == 0 || len > 19 || strspn(v, "0123456789") < len)
			return bad(a, 400, "invalid_request", "Content-Length is not a number");
	}
	if ((v = head_get(h, "Transfer-Encoding", &len, NULL)) != NULL) {
		size_t last;

		if (has_cl)
			return bad(a, 400, "invalid_request",
			           "send Content-Length or Transfer-Encoding, not both");
		head_trim(&v, &len);
		if (len == 7 && strncasecmp(v, "chunked", 7) == 0)
			return 0;
		/* chunked must be the final coding (RFC 9112 6.3); any other is
		 * one idemd does not implement */
		last = len;
		while (last > 0 && v[last - 1] != ',')
			last--;
		v += last;
		len -= last;
		head_trim(&v, &len);
		if (len == 7 && strncasecmp(v, "chunked", 7) == 0 && last > 0) {
			answer_problem(a, 501, "not_implemented",
			               "the only transfer coding idemd accepts is chunked");
			a->close = 1;
			return -1;
		}
		return bad(a, 400, "invalid_request",
		           "Transfer-Encoding must end with chunked; send chunked or "
		           "Content-Length");
	}
	return 0;
}

int head_parse(req_head *h, req_arena *arena, struct MHD_Connection *conn, const char *method,
               const char *url, const char *version, size_t raw_uri_len, http_answer *a)
{
	collect_ctx c = {h, 0, 0};

	h->f = NULL;
	h->n = 0;
	h->cap = HEAD_FIELDS_FIRST;
	h->arena = arena;
	if (!method[0])
		return bad(a, 400, "invalid_request", "no method");
	for (const char *p = method; *p; p++)
		if (!is_tchar((unsigned char)*p))
			return bad(a, 400, "invalid_request", "the method is not a token");
	if (!(h->f = arena_alloc(arena, h->cap * sizeof(*h->f)))) {
		answer_problem(a, 500, "internal_error", "out of memory");
		return -1;
	}
	MHD_get_connection_values_n(conn, MHD_HEADER_KIND, collect, &c);
	if (c.nomem) {
		answer_problem(a, 500, "internal_error", "out of memory");
		return -1;
	}
	if (c.overflow)
		return bad(a, 431, "header_fields_too_large", "more than 256 header fields");
#if MHD_VERSION < 0x00097600
	if (walk(h, conn, method, url, version, raw_uri_len, a) < 0)
		return -1;
#else
	(void)method;
	(void)url;
	(void)raw_uri_len;
#endif
	return framing(h, version, a);
}

/* The request arena (server.h): here, beside its first user, the head. */
struct arena_block {
	arena_block *next;
	max_align_t data[];
};

void arena_init(req_arena *a, void *mem, size_t cap)
{
	a->mem = mem;
	a->used = 0;
	a->cap = cap;
	a->heap = NULL;
}

void *arena_alloc(req_arena *a, size_t n)
{
	size_t at = (a->used + 15) & ~(size_t)15;
	arena_block *b;

	if (n <= a->cap && at <= a->cap - n) {
		a->used = at + n;
		return a->mem + at;
	}
	if (n > SIZE_MAX - sizeof(*b) || !(b = malloc(sizeof(*b) + n)))
		return NULL;
	b->next = a->heap;
	a->heap = b;
	return b->data;
}

void arena_release(req_arena *a)
{
	for (arena_block *b = a->heap, *next; b; b = next) {
		next = b->next;
		free(b);
	}
	a->heap = NULL;
	a->used = 0;
}
