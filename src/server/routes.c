/*
 * server/routes.c: the route table of API v1 and the handlers, each a thin
 * mapping from an HTTP request to one idem_pay call and back. Authentication
 * (bearer key or channel signature) happens here, before any body is read
 * or any claim is made; a request that fails it leaves nothing behind.
 * What never waits (the route, the bearer key's form and a key the cache
 * verified, /metrics, a replay of the very bytes of an answered request)
 * is split from what may wait for the store (route_authenticate,
 * route_run), so that http.c runs the first on libmicrohttpd's event
 * threads and hands only the second to a worker thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server.h"

#define WWW_AUTH_BEARER    "Bearer realm=\"idem\""
#define WWW_AUTH_SIGNATURE "Signature realm=\"idem\", header=\"X-Signature\""

/* ---- Idempotency-Key ---- */

/*
 * The header's raw bytes, optional whitespace around them stripped: a bare
 * token or a Structured Fields string ("abc", with \\ and \" escapes).
 * Either way the key must then be 1..255 bytes of 0x21..0x7E (a NUL is not
 * one of them). Returns 0 with the key in out, -1 when malformed.
 */
static int parse_idem_key(const char *v, size_t vlen, char *out, size_t outsz, size_t *len)
{
	size_t n = 0;

	head_trim(&v, &vlen);
	if (vlen == 0 || v[0] != '"') {
		if (vlen >= outsz)
			return -1;
		memcpy(out, v, vlen);
		out[vlen] = '\0';
		n = vlen;
	} else {
		size_t i = 1;

		for (; i < vlen && v[i] != '"'; i++) {
			char c = v[i];

			if (c == '\\') {
				if (++i >= vlen)
					return -1;
				c = v[i];
				if (c != '\\' && c != '"')
					return -1;
			} else if ((unsigned char)c < 0x20 || (unsigned char)c > 0x7e) {
				return -1;
			}
			if (n + 1 >= outsz)
				return -1;
			out[n++] = c;
		}
		if (i != vlen - 1 || v[i] != '"')
			return -1;
		out[n] = '\0';
	}
	*len = n;
	return idem_key_validate(out, n) == 0 ? 0 : -1;
}

/* ---- handlers ---- */

typedef void (*pay_write_fn)(idem_pay *, const idem_pay_request *, idem_done_fn, void *);

/*
 * The write request of r into the request's own buffers (req_write), its
 * Idempotency-Key parsed; 0 and *out, or -1 with the 400 in a.
 */
static int write_request(http_req *r, const char *path, const char *caller, http_answer *a,
                         idem_pay_request **out)
{
	char *key, *path_buf;
	size_t key_size, path_size, key_len = 0, body_len = 0, hdr_len = 0;
	const char *hdr = req_header(r, "Idempotency-Key", &hdr_len);
	idem_pay_request *rq = req_write(r, &key, &key_size, &path_buf, &path_size);

	if (req_header_count(r, "Idempotency-Key") > 1) {
		answer_problem(a, 400, "invalid_idempotency_key",
		               "send exactly one Idempotency-Key header");
		return -1;
	}
	memset(rq, 0, sizeof(*rq));
	rq->key_invalid = hdr && parse_idem_key(hdr, hdr_len, key, key_size, &key_len) < 0;
	rq->caller = caller;
	rq->key = hdr && !rq->key_invalid ? key : NULL;
	rq->key_len = key_len;
	rq->method = "POST";
	snprintf(path_buf, path_size, "%s", path);
	rq->path = path_buf;
	rq->body = req_body(r, &body_len);
	rq->body_len = body_len;
	*out = rq;
	return 0;
}

/*
 * Start the write; its answer arrives through http_write_done, after the
 * group commit's COMMIT (or at once for what needs no commit), while the
 * connection is suspended and no thread waits for it. From the call of fn
 * on, r may be answered and freed at any moment: nothing here reads it.
 */
static int do_write(server_state *s, http_req *r, route_match *m, http_answer *a, pay_write_fn fn,
                    const char *path, const char *caller)
{
	idem_pay_request *rq = NULL;

	(void)m;
	if (write_request(r, path, caller, a, &rq) < 0)
		return 0;
	a->pending = 1;
	fn(s->pay, rq, http_write_done, r);
	return 0;
}

/*
 * The replay shortcut without waiting (idem_pay_try_replay): 1 when a has
 * the answer (the replay, or the 400 of a bad header), 0 to run the write.
 */
static int fast_write(server_state *s, http_req *r, route_match *m, http_answer *a,
                      const char *path)
{
	idem_pay_request *rq = NULL;
	idem_result res = {0};

	if (write_request(r, path, m->merchant, a, &rq) < 0)
		return 1;
	if (!idem_pay_try_replay(&res, s->pay, rq))
		return 0;
	answer_result(a, 0, &res);
	return 1;
}

static int f_create_payment(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	return fast_write(s, r, m, a, "/v1/payments");
}

static int f_refund(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	return fast_write(s, r, m, a, "/v1/refunds");
}

/*
 * The payment started on the event thread (idem_pay_create_payment_nowait):
 * 1 when it started, its answer to come through http_write_done, as
 * do_write's; 0 when it would wait, nothing done. Only after
 * f_create_payment said 0, which it says only with r's write request made
 * (write_request): that request is the one started.
 */
static int s_create_payment(server_state *s, http_req *r, route_match *m)
{
	char *key, *path;
	size_t key_size, path_size;
	idem_pay_request *rq = req_write(r, &key, &key_size, &path, &path_size);

	(void)m;
	return idem_pay_create_payment_nowait(s->pay, rq, http_write_done, r) == 0;
}

static int h_create_payment(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	return do_write(s, r, m, a, idem_pay_create_payment_async, "/v1/payments", m->merchant);
}

static int h_refund(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	return do_write(s, r, m, a, idem_pay_refund_async, "/v1/refunds", m->merchant);
}

static int h_transfer(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	return do_write(s, r, m, a, idem_pay_transfer_async, "/v1/transfers", m->merchant);
}

static int h_notify(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	char path[400];
	size_t len = 0, sig_len = 0;
	const char *sig = req_header(r, "X-Signature", &sig_len);
	const char *body = req_body(r, &len);
	int rc;

	if (sig)
		head_trim(&sig, &sig_len);
	rc = idem_pay_verify_signature(s->pay, m->param, sig, sig_len, body, len);
	if (rc == IDEM_ENOTFOUND) {
		answer_problem(a, 401, "invalid_signature",
		               "X-Signature must be the hex HMAC-SHA256 of the body with the "
		               "channel's secret");
		a->www_auth = WWW_AUTH_SIGNATURE;
		return 0;
	}
	if (rc < 0) {
		idem_result res = {0};

		answer_result(a, rc, &res);
		return 0;
	}
	snprintf(path, sizeof(path), "/v1/notifications/%s", m->param);
	return do_write(s, r, m, a, idem_pay_notify_async, path, m->param);
}

static int h_get_payment(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	idem_result res = {0};

	(void)r;
	answer_result(a, idem_pay_get_payment(&res, s->pay, m->merchant, m->param), &res);
	a->outcome = "-";
	return 0;
}

static int h_find_payment(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	size_t no_len = 0;
	const char *no = req_query(r, "merchant_order_no", &no_len);
	idem_result res = {0};

	if (no && memchr(no, '\0', no_len)) {
		answer_problem(a, 400, "invalid_request", "merchant_order_no holds a NUL byte");
		return 0;
	}
	if (!no) {
		answer_problem(a, 400, "invalid_request",
		               "give ?merchant_order_no=… or GET /v1/payments/{id}");
		return 0;
	}
	answer_result(a, idem_pay_find_payment(&res, s->pay, m->merchant, no), &res);
	a->outcome = "-";
	return 0;
}

static int h_balance(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	idem_result res = {0};

	(void)r;
	answer_result(a, idem_pay_get_balance(&res, s->pay, m->merchant), &res);
	a->outcome = "-";
	return 0;
}

static int h_record(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	idem_result res = {0};

	(void)r;
	answer_result(
	    a, idem_pay_get_record(&res, s->pay, m->merchant, m->param, m->param2, m->param2_len),
	    &res);
	a->outcome = "-";
	return 0;
}

static int h_healthz(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	char body[128];
	int ok = idem_store_ping(s->store) == 0;

	(void)r;
	(void)m;
	snprintf(body, sizeof(body), "{\"status\":\"%s\",\"store\":\"%s\"}",
	         ok ? "ok" : "unavailable", idem_store_backend(s->store));
	a->status = ok ? 200 : 503;
	a->body = strdup(body);
	a->len = a->body ? strlen(a->body) : 0;
	a->content_type = "application/json; charset=utf-8";
	a->retry_after = ok ? 0 : 1;
	a->outcome = "-";
	return 0;
}

static int h_metrics(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	(void)r;
	(void)m;
	a->outcome = "-";
	if (metrics_render(&a->body, &a->len, s->store) < 0) {
		answer_problem(a, 500, "internal_error", "cannot render metrics");
		return 0;
	}
	{
		/* The channel and sweeper counters, from the payment domain. */
		char *more = NULL, *all;
		size_t n = 0;

		if (idem_pay_metrics_text(s->pay, &more, &n) == 0 &&
		    (all = realloc(a->body, a->len + n + 1))) {
			memcpy(all + a->len, more, n);
			a->len += n;
			all[a->len] = '\0';
			a->body = all;
		}
		free(more);
	}
	a->status = 200;
	a->content_type = "text/plain; version=0.0.4; charset=utf-8";
	return 0;
}

/* Counters in memory only: always answered where it is asked. */
static int f_metrics(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	h_metrics(s, r, m, a);
	return 1;
}

/* ---- the table ---- */

typedef enum { AUTH_NONE, AUTH_BEARER, AUTH_SIGNATURE } auth_kind;

typedef struct {
	const char *method;
	const char *pattern; /* literal segments; "*" one parameter; "**" the rest */
	const char *name;    /* the template, as logged */
	auth_kind auth;
	route_handler handler; /* may wait for the store: run on a worker thread */
	route_handler fast;    /* never waits: 1 when it answered, 0 to run handler; or NULL */
	route_starter start;   /* never waits: 1 the write started, 0 to run handler; or NULL */
} route;

static const route routes[] = {
    {"POST", "/v1/payments", "/v1/payments", AUTH_BEARER, h_create_payment, f_create_payment,
     s_create_payment},
    {"GET", "/v1/payments", "/v1/payments", AUTH_BEARER, h_find_payment, NULL, NULL},
    {"GET", "/v1/payments/*", "/v1/payments/{id}", AUTH_BEARER, h_get_payment, NULL, NULL},
    {"POST", "/v1/refunds", "/v1/refunds", AUTH_BEARER, h_refund, f_refund, NULL},
    {"POST", "/v1/transfers", "/v1/transfers", AUTH_BEARER, h_transfer, NULL, NULL},
    {"GET", "/v1/balance", "/v1/balance", AUTH_BEARER, h_balance, NULL, NULL},
    {"POST", "/v1/notifications/*", "/v1/notifications/{channel}", AUTH_SIGNATURE, h_notify, NULL,
     NULL},
    {"GET", "/v1/idempotency-records/*/**", "/v1/idempotency-records/{type}/{key}", AUTH_BEARER,
     h_record, NULL, NULL},
    {"GET", "/healthz", "/healthz", AUTH_NONE, h_healthz, NULL, NULL},
    {"GET", "/metrics", "/metrics", AUTH_NONE, h_metrics, f_metrics, NULL},
};

#define NROUTES (sizeof(routes) / sizeof(routes[0]))

/* Match path against pattern, capturing up to two parameters. */
static int match(const char *pattern, const char *path, route_match *m)
{
	const char *p = pattern, *u = path;
	int nparam = 0;

	m->param[0] = m->param2[0] = '\0';
	m->param2_len = 0;
	while (*p && *u) {
		if (p[0] == '*' && p[1] == '*') {
			size_t n = strlen(u);

			if (n == 0 || n >= sizeof(m->param2))
				return 0;
			memcpy(m->param2, u, n + 1);
			m->param2_len = n;
			return 1;
		}
		if (*p == '*') {
			size_t n = strcspn(u, "/");
			char *dst = nparam++ == 0 ? m->param : m->param2;

			if (n == 0 || n >= sizeof(m->param))
				return 0;
			memcpy(dst, u, n);
			dst[n] = '\0';
			if (dst == m->param2)
				m->param2_len = n;
			u += n;
			p++;
			continue;
		}
		if (*p != *u)
			return 0;
		p++;
		u++;
	}
	return *p == '\0' && *u == '\0';
}

/* The bearer key's bytes, or NULL (and a 401 in a) when the header is not one. */
static const char *bearer_key(http_req *r, size_t *len, http_answer *a)
{
	const char *auth = req_header(r, "Authorization", len);

	if (auth)
		head_trim(&auth, len);
	if (!auth || *len < 7 || strncasecmp(auth, "Bearer ", 7) != 0) {
		answer_problem(a, 401, "unauthorized", "send Authorization: Bearer <api key>");
		a->www_auth = WWW_AUTH_BEARER;
		return NULL;
	}
	auth += 7;
	*len -= 7;
	head_trim(&auth, len);
	return auth;
}

/* What a key lookup's rc answers: 0 for a merchant, else -1 with the 401 or 503 in a. */
static int auth_answer(int rc, http_answer *a)
{
	if (rc == IDEM_ENOTFOUND) {
		answer_problem(a, 401, "unauthorized", "the API key is not valid");
		a->www_auth = WWW_AUTH_BEARER;
		return -1;
	}
	if (rc < 0) {
		idem_result res = {0};

		answer_result(a, rc, &res);
		return -1;
	}
	return 0;
}

int route_authenticate(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	size_t len = 0;
	const char *key = bearer_key(r, &len, a);

	if (!key)
		return -1;
	/* every byte counts: a NUL and what follows it are part of the key */
	return auth_answer(idem_pay_authenticate(s->pay, key, len, m->merchant), a);
}

/* route_authenticate from the cache alone: ROUTE_AUTH when it cannot say. */
static int authenticate_cached(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	size_t len = 0;
	const char *key = bearer_key(r, &len, a);
	int rc;

	if (!key)
		return ROUTE_ANSWERED;
	rc = idem_pay_authenticate_cached(s->pay, key, len, m->merchant);
	if (rc == 1)
		return ROUTE_READY;
	if (rc == 0)
		return ROUTE_AUTH;
	return auth_answer(rc, a) < 0 ? ROUTE_ANSWERED : ROUTE_READY;
}

/* The route for method and path into m; -1: a has the 404 or 405. */
static const route *find_route(const char *method, const char *path, route_match *m, http_answer *a)
{
	int has_get = 0, has_post = 0;

	if (strcmp(method, "HEAD") == 0) /* GET without the body (libmicrohttpd drops it) */
		method = "GET";
	for (size_t i = 0; i < NROUTES; i++) {
		route_match tmp = {0};

		if (!match(routes[i].pattern, path, &tmp))
			continue;
		m->route = routes[i].name;
		if (strcmp(routes[i].method, method) == 0) {
			*m = tmp;
			m->route = routes[i].name;
			return &routes[i];
		}
		has_get |= strcmp(routes[i].method, "GET") == 0;
		has_post |= strcmp(routes[i].method, "POST") == 0;
	}
	if (has_get || has_post) {
		answer_problem(a, 405, "method_not_allowed", "this path does not take that method");
		a->allow = has_get && has_post ? "GET, HEAD, POST" : has_get ? "GET, HEAD" : "POST";
	} else {
		answer_problem(a, 404, "not_found", "no such resource");
	}
	return NULL;
}

int route_begin(server_state *s, http_req *r, const char *method, const char *path, route_match *m,
                http_answer *a)
{
	const route *found;

	memset(m, 0, sizeof(*m));
	a->outcome = "-";
	if (!(found = find_route(method, path, m, a)))
		return ROUTE_ANSWERED;
	m->handler = found->handler;
	m->fast = found->fast;
	m->start = found->start;
	if (found->auth == AUTH_BEARER)
		return authenticate_cached(s, r, m, a);
	if (found->auth == AUTH_SIGNATURE && !req_header(r, "X-Signature", NULL)) {
		/* The signature itself is checked once the body is in. */
		answer_problem(a, 401, "invalid_signature", "X-Signature is required");
		a->www_auth = WWW_AUTH_SIGNATURE;
		return ROUTE_ANSWERED;
	}
	return ROUTE_READY;
}

int route_prepare(server_state *s, http_req *r, const char *method, const char *path,
                  route_match *m, http_answer *a)
{
	int rc;

	/* The request's one deadline, from its arrival: the key lookup, every
	 * read and the write it queues all end by it (idem_deadline_begin). */
	idem_deadline_begin(s->store);
	if ((rc = route_begin(s, r, method, path, m, a)) == ROUTE_AUTH)
		rc = route_authenticate(s, r, m, a);
	if (rc != 0)
		idem_deadline_end(); /* answered now: the request ends here */
	return rc;
}

int route_run_fast(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	return m->fast ? m->fast(s, r, m, a) : 0;
}

int route_start(server_state *s, http_req *r, route_match *m, int64_t deadline)
{
	int started;

	if (!m->start)
		return 0;
	idem_deadline_adopt(deadline);
	started = m->start(s, r, m);
	idem_deadline_end(); /* a queued write's unit carries its own copy */
	return started;
}

void route_run(server_state *s, http_req *r, route_match *m, http_answer *a)
{
	m->handler(s, r, m, a);
	idem_deadline_end(); /* a queued write's unit carries its own copy */
}

int route_check_media(http_req *r, const char *method, http_answer *a)
{
	size_t len = 0;
	const char *ct = req_header(r, "Content-Type", &len);

	if (strcmp(method, "POST") != 0 || !ct)
		return 0;
	if (memchr(ct, '\0', len)) /* head.c refuses NUL here already; be sure */
		goto bad;
	if (strncasecmp(ct, "application/json", 16) == 0 &&
	    (ct[16] == '\0' || ct[16] == ';' || ct[16] == ' '))
		return 0;
bad:
	answer_problem(a, 415, "unsupported_media_type", "send the body as application/json");
	return -1;
}
