/*
 * tests/fuzz/fuzz_http.c: the request decoding of idemd (issue 15): the
 * Idempotency-Key header bytes, Authorization: Bearer parsing, query value
 * decoding, Content-Type, through the real routes.c (route_prepare, the
 * handlers) with the connection replaced by the bytes of the input:
 *
 *   METHOD SP PATH[?QUERY] LF (Name: value LF)* LF body
 *
 * Header values may carry NUL bytes: the routes see their raw bytes and
 * length, as idemd's header iteration hands them over. Query values are
 * percent-decoded by libmicrohttpd's own MHD_http_unescape (%00 gives a NUL
 * inside the value). @KEY@, @MERCHANT@, @PAY@, @CH@ are
 * replaced by this run's values, "X-Signature: @SIG@" by the body's right
 * signature. Checks: authentication passes only with the real key (or the
 * real signature), answers are 2xx..5xx, a 2xx write retried replays.
 */
#include <microhttpd.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuzz_env.h"
#include "server_glue.h"

/* Next line of [*p, end): NUL-terminated in place (the LF replaced), its
 * length (NULs included) in *n. */
static char *next_line(char **p, char *end, size_t *n)
{
	char *s = *p, *lf;

	if (s >= end)
		return NULL;
	lf = memchr(s, '\n', (size_t)(end - s));
	if (!lf)
		lf = end;
	*lf = '\0';
	*n = (size_t)(lf - s);
	*p = lf + 1;
	return s;
}

static void sign(const fuzz_env *e, const char *body, size_t len, char hex[65])
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int n = 0;

	if (!HMAC(EVP_sha256(), e->secret, (int)strlen(e->secret), (const unsigned char *)body, len,
	          mac, &n) ||
	    n != 32)
		fuzz_fail("HMAC failed");
	for (unsigned int i = 0; i < 32; i++) {
		hex[2 * i] = "0123456789abcdef"[mac[i] >> 4];
		hex[2 * i + 1] = "0123456789abcdef"[mac[i] & 15];
	}
	hex[64] = '\0';
}

static void run(server_state *s, http_req *r, const char *method, const char *path, http_answer *a,
                int *authed)
{
	*authed = glue_run(s, r, method, path, a);
	if (a->status < 200 || a->status > 599)
		fuzz_fail("answer status out of range");
}

/* The query string q into r's fields, percent-decoded in place. */
static void parse_query(http_req *r, char *q)
{
	while (q && *q && r->nquery < GLUE_MAX_FIELDS) {
		char *amp = strchr(q, '&'), *eq;
		size_t vlen = 0;

		if (amp)
			*amp++ = '\0';
		if ((eq = strchr(q, '='))) {
			*eq++ = '\0';
			vlen = MHD_http_unescape(eq);
		} else {
			eq = "";
		}
		MHD_http_unescape(q);
		r->query[r->nquery++] = (glue_field){q, eq, vlen};
		q = amp;
	}
}

/* The input [p, end) into r: the request line (*method and *path point into
 * it), the query, the headers up to the empty line, the rest the body.
 * -1 when there is no request line. */
static int parse_request(http_req *r, char *p, char *end, char **method, char **path)
{
	char *line, *sp, *q;
	size_t n;

	if (!(line = next_line(&p, end, &n)) || !(sp = strchr(line, ' ')))
		return -1;
	*sp = '\0';
	*method = line;
	*path = sp + 1;
	if ((q = strchr(*path, '?'))) {
		*q++ = '\0';
		parse_query(r, q);
	}
	while ((line = next_line(&p, end, &n)) && n && r->nheaders < GLUE_MAX_FIELDS) {
		char *colon = memchr(line, ':', n);

		if (!colon)
			continue;
		*colon++ = '\0';
		/* libmicrohttpd hands a value over without the blanks after the colon */
		while (colon < line + n && (*colon == ' ' || *colon == '\t'))
			colon++;
		r->headers[r->nheaders++] = (glue_field){line, colon, (size_t)(line + n - colon)};
	}
	r->body = p < end ? p : "";
	r->body_len = p < end ? (size_t)(end - p) : 0;
	return 0;
}

/* "X-Signature: @SIG@" becomes sig, the body's right signature. */
static void put_signature(http_req *r, const char *sig)
{
	for (int i = 0; i < r->nheaders; i++)
		if (strcasecmp(r->headers[i].name, "X-Signature") == 0 && r->headers[i].len == 5 &&
		    memcmp(r->headers[i].value, "@SIG@", 5) == 0) {
			r->headers[i].value = sig;
			r->headers[i].len = 64;
		}
}

/* Every /v1/ route but the callbacks takes the merchant's key: exactly its
 * bytes (optional whitespace around them aside), a NUL and what follows it
 * included. */
static void check_bearer(const fuzz_env *e, http_req *r, const char *path, int authed)
{
	size_t alen = 0;
	const char *auth = req_header(r, "Authorization", &alen);

	if (!authed || strncmp(path, "/v1/", 4) != 0 ||
	    strncmp(path, "/v1/notifications/", 18) == 0)
		return;
	while (auth && alen && (*auth == ' ' || *auth == '\t'))
		auth++, alen--;
	if (!auth || alen < 7 || strncasecmp(auth, "Bearer ", 7) != 0)
		fuzz_fail("bearer route ran without Authorization: Bearer");
	auth += 7;
	alen -= 7;
	while (alen && (*auth == ' ' || *auth == '\t'))
		auth++, alen--;
	while (alen && (auth[alen - 1] == ' ' || auth[alen - 1] == '\t'))
		alen--;
	if (alen != strlen(e->api_key) || memcmp(auth, e->api_key, alen) != 0)
		fuzz_fail("authenticated with a key that is not the merchant's");
}

/* A callback accepted carried the channel's signature of its body. */
static void check_callback_signature(const fuzz_env *e, http_req *r, const char *method,
                                     const char *path, const http_answer *a, const char *sig)
{
	size_t hlen = 0;
	const char *hs;

	if (strcmp(method, "POST") != 0 || strncmp(path, "/v1/notifications/", 18) != 0 ||
	    a->status < 200 || a->status >= 300)
		return;
	hs = req_header(r, "X-Signature", &hlen);
	while (hs && hlen && (*hs == ' ' || *hs == '\t'))
		hs++, hlen--;
	while (hs && hlen && (hs[hlen - 1] == ' ' || hs[hlen - 1] == '\t'))
		hlen--;
	if (strcmp(path + 18, e->channel) != 0 || !hs || hlen != 64 ||
	    strncasecmp(hs, sig, 64) != 0)
		fuzz_fail("callback accepted without the channel's signature");
}

/* A 2xx write sent once more must replay the same answer. */
static void check_replay(server_state *s, http_req *r, const char *method, const char *path,
                         const http_answer *a)
{
	http_answer b = {0};
	http_req *r2;
	int again;

	if (strcmp(method, "POST") != 0 || a->status < 200 || a->status >= 300)
		return;
	if (!(r2 = calloc(1, sizeof(*r2))))
		fuzz_fail("out of memory");
	memcpy(r2->headers, r->headers, sizeof(r->headers));
	r2->nheaders = r->nheaders;
	memcpy(r2->query, r->query, sizeof(r->query));
	r2->nquery = r->nquery;
	r2->body = r->body;
	r2->body_len = r->body_len;
	run(s, r2, method, path, &b, &again);
	if (b.status != a->status || b.len != a->len || (a->len && memcmp(a->body, b.body, a->len)))
		fuzz_fail("retried write did not replay");
	free(b.body);
	free(r2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_env *e = fuzz_env_get();
	server_state s = {e->store, e->pay, NULL};
	size_t len;
	char *buf = fuzz_subst(data, size, &len), sig[65], *method, *path;
	http_req *r = calloc(1, sizeof(*r));
	http_answer a = {0};
	int authed;

	if (!r)
		fuzz_fail("out of memory");
	if (parse_request(r, buf, buf + len, &method, &path) < 0)
		goto done;
	sign(e, r->body, r->body_len, sig);
	put_signature(r, sig);
	run(&s, r, method, path, &a, &authed);
	check_bearer(e, r, path, authed);
	check_callback_signature(e, r, method, path, &a, sig);
	check_replay(&s, r, method, path, &a);
	free(a.body);
done:
	free(r);
	free(buf);
	return 0;
}
