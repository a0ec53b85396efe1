/*
 * server/http.c: the libmicrohttpd glue. Collects each request's body
 * under a hard cap (1 MiB: larger is 413 without reading it when the
 * Content-Length says so), runs the route, frames the answer with its
 * headers, and logs one line per request with its duration and outcome.
 * A request's header fields and a small body live in its own arena
 * (server.h), freed once with it: no allocation per field.
 *
 * Every connection has a thread of its own (libmicrohttpd's
 * thread-per-connection mode): a handler that waits for the store, up to
 * its deadline on a frozen database, holds only its own connection, never
 * another client's or /healthz. A write waits on its thread for the
 * group-commit writer's answer, given after its COMMIT returned, so a 2xx
 * never leaves before it is durable.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

/* The request's own arena block: its header fields and a small body fit. */
#define HTTP_ARENA_SIZE 4096
/* A body up to this size lives in the arena; a larger one in malloc. */
#define HTTP_BODY_INLINE 2048
/* Each connection's thread (address space mostly; glibc's default is 8 MiB):
 * a handler runs a store read (libpq, MariaDB Connector/C, SQLite) at most. */
#define HTTP_STACK_SIZE (1024 * 1024)

struct http_req {
	struct MHD_Connection *conn;
	http_server *server;
	char request_id[17];
	char method[12];
	int started;                /* on_request has seen the head */
	int refused;                /* begun after http_stop: 503, not counted in active */
	size_t raw_uri_len;         /* the target as received, up to a NUL */
	const char *target_problem; /* why the target is refused, or NULL */
	int target_status;
	req_head head;
	struct timespec start;
	route_match match;
	int answered; /* a response was queued */
	int too_large;
	size_t dropped; /* body bytes read past SERVER_BODY_MAX and dropped */
	char *body;
	size_t len, cap;
	int body_heap;      /* body is malloc'd (it outgrew its arena block) */
	http_answer answer; /* what was sent, for the log */

	/* A write in flight (group commit): the connection's thread waits on
	 * cond until the writer thread has left the answer in later. */
	idem_pay_request write;
	char key[IDEM_KEY_MAX + 2];
	char write_path[400];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int ready;
	http_answer later;

	req_arena arena;
	/* Not zeroed: everything above is, once per request (on_uri). */
	_Alignas(16) unsigned char arena_mem[HTTP_ARENA_SIZE];
};

idem_pay_request *req_write(http_req *r, char **key_buf, size_t *key_size, char **path_buf,
                            size_t *path_size)
{
	*key_buf = r->key;
	*key_size = sizeof(r->key);
	*path_buf = r->write_path;
	*path_size = sizeof(r->write_path);
	return &r->write;
}

/*
 * r->later holds the answer: wake the connection's thread waiting for it.
 * The lock is held while signalling: on_completed frees r only after
 * on_request returned, and on_request returns only after it saw ready
 * under the same lock, so r is still ours until the unlock.
 */
static void req_ready(http_req *r)
{
	pthread_mutex_lock(&r->lock);
	r->ready = 1;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

void http_write_done(void *ctx, int rc, idem_result *res)
{
	http_req *r = ctx;

	answer_result(&r->later, rc, res);
	req_ready(r);
}

/*
 * One per TCP connection (libmicrohttpd's socket context), on a list the
 * watchdog walks. --connection-timeout is an idle timeout that every byte
 * resets, so a client dripping a byte at a time held a connection forever
 * (slowloris). The watchdog gives each request a deadline instead: its head
 * and body must be in within --request-timeout of the connection's opening
 * or its previous answer, else the socket is shut down. A request that is
 * being answered (its body is in) is never cut.
 */
typedef struct conn_track {
	struct conn_track *prev, *next;
	int fd;
	/*
	 * (since << 1) | reading: when the current request's clock started (ms,
	 * CLOCK_MONOTONIC) and whether its head or body is still arriving. One
	 * word, so that a request thread sets it without the list lock (three
	 * times per request, on every server thread) and the watchdog cuts only
	 * with a compare-and-swap from the very word it judged: a request whose
	 * body came in meanwhile has another word and is never cut.
	 */
	_Atomic uint64_t state;
	int cut; /* the watchdog's, under conns_lock */
} conn_track;

struct http_server {
	struct MHD_Daemon *daemon;
	server_state *state;
	_Atomic int active;   /* requests begun and not completed, refused ones aside */
	_Atomic int draining; /* http_stop began: new requests are refused */

	pthread_mutex_t conns_lock; /* conns, and every conn_track's cut */
	pthread_cond_t wake;
	conn_track *conns;
	pthread_t watchdog;
	int watchdog_started, stopping;
	_Atomic unsigned long cut_total;
};

static uint64_t now_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

static conn_track *track_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* reading 1: the next request's clock starts now; 0: it is being answered. */
static void track_set(http_server *h, struct MHD_Connection *conn, int reading)
{
	conn_track *t = track_of(conn);
	uint64_t w;

	(void)h;
	if (!t)
		return;
	w = atomic_load(&t->state);
	if (reading && !(w & 1)) /* the clock starts now */
		atomic_store(&t->state, now_ms() << 1 | 1);
	else if (!reading && (w & 1))
		atomic_store(&t->state, w & ~(uint64_t)1);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
	http_server *h = cls;
	conn_track *t = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		if (!ci || !(t = calloc(1, sizeof(*t))))
			return; /* untracked: only the idle timeout applies */
		t->fd = ci->connect_fd;
		atomic_init(&t->state, now_ms() << 1 | 1);
		pthread_mutex_lock(&h->conns_lock);
		t->next = h->conns;
		if (h->conns)
			h->conns->prev = t;
		h->conns = t;
		pthread_mutex_unlock(&h->conns_lock);
		*socket_context = t;
		return;
	}
	if (!t)
		return;
	/* Called before libmicrohttpd closes the fd: once t is off the list
	 * under the lock, the watchdog can no longer touch that fd. */
	pthread_mutex_lock(&h->conns_lock);
	if (t->prev)
		t->prev->next = t->next;
	else
		h->conns = t->next;
	if (t->next)
		t->next->prev = t->prev;
	pthread_mutex_unlock(&h->conns_lock);
	free(t);
	*socket_context = NULL;
}

static void *watchdog_main(void *arg)
{
	http_server *h = arg;
	uint64_t limit = (uint64_t)h->state->cfg->request_timeout_s * 1000u;

	pthread_mutex_lock(&h->conns_lock);
	while (!h->stopping) {
		struct timespec until;
		unsigned long cut = 0;
		uint64_t now = now_ms();

		for (conn_track *t = h->conns; t; t = t->next) {
			uint64_t w = atomic_load(&t->state);

			/* since may be a moment after now (set since now was read) */
			if ((w & 1) && !t->cut && now > (w >> 1) && now - (w >> 1) > limit &&
			    atomic_compare_exchange_strong(&t->state, &w, w & ~(uint64_t)1)) {
				shutdown(t->fd, SHUT_RDWR);
				t->cut = 1;
				cut++;
			}
		}
		if (cut) {
			atomic_fetch_add(&h->cut_total, cut);
			log_msg("warn", "http: %lu connection(s) past --request-timeout %ds closed",
			        cut, h->state->cfg->request_timeout_s);
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 200 * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&h->wake, &h->conns_lock, &until);
	}
	pthread_mutex_unlock(&h->conns_lock);
	return NULL;
}

static void watchdog_stop(http_server *h)
{
	if (!h->watchdog_started)
		return;
	pthread_mutex_lock(&h->conns_lock);
	h->stopping = 1;
	pthread_cond_signal(&h->wake);
	pthread_mutex_unlock(&h->conns_lock);
	pthread_join(h->watchdog, NULL);
	h->watchdog_started = 0;
}

const char *req_header(http_req *r, const char *name, size_t *len)
{
	return head_get(&r->head, name, len, NULL);
}

const char *req_query(http_req *r, const char *name, size_t *len)
{
	const char *v = NULL;

	*len = 0;
	if (MHD_lookup_connection_value_n(r->conn, MHD_GET_ARGUMENT_KIND, name, strlen(name), &v,
	                                  len) != MHD_YES)
		return NULL;
	if (!v)
		v = "";
	return v;
}

int req_header_count(http_req *r, const char *name)
{
	int n = 0;

	head_get(&r->head, name, NULL, &n);
	return n;
}

const char *req_body(http_req *r, size_t *len)
{
	*len = r->len;
	return r->body ? r->body : "";
}

void answer_problem(http_answer *a, int status, const char *code, const char *detail)
{
	free(a->body);
	a->body = NULL;
	a->len = 0;
	a->status = status;
	a->content_type = "application/problem+json";
	if (idem_pay_problem(&a->body, &a->len, status, code, detail, NULL, NULL) < 0) {
		a->body = NULL;
		a->len = 0;
	}
	if (status == 503)
		a->retry_after = 1;
}

void answer_result(http_answer *a, int rc, idem_result *res)
{
	if (rc < 0) {
		const idem_error *e = idem_error_last();

		/* Never a replay, never a 422: the request had no effect. */
		log_msg("error", "store failure: %s (code %d, driver %d%s%s): %s",
		        idem_strerror(rc), rc, e->driver_code, e->sqlstate[0] ? ", sqlstate " : "",
		        e->sqlstate, e->message);
		if (rc == IDEM_ENOMEM || rc == IDEM_EINVAL) {
			answer_problem(a, 500, "internal_error",
			               "the request could not be processed");
		} else {
			answer_problem(a, 503, "store_unavailable",
			               "the idempotency store is unavailable; retry later");
		}
		a->outcome = "error";
		idem_result_clear(res);
		return;
	}
	free(a->body);
	a->status = res->http_status;
	a->body = (char *)res->body;
	a->len = res->body_len;
	res->body = NULL;
	res->body_len = 0;
	a->content_type = NULL;
	a->replayed = res->outcome == IDEM_REPLAY;
	a->retry_after = res->outcome == IDEM_IN_PROGRESS || res->http_status == 503 ? 1 : 0;
	a->outcome = res->outcome ? idem_outcome_name(res->outcome) : "-";
	if (res->outcome == IDEM_FIRST && !res->stored)
		a->outcome = "rejected";
	idem_result_clear(res);
}

static unsigned char id_prefix[4];

static void init_prefix(void)
{
	RAND_bytes(id_prefix, sizeof(id_prefix));
}

/*
 * Request ids: a random prefix per process and a counter, unique across
 * instances and restarts without a trip to the random generator each time.
 */
static void request_id(char out[17])
{
	static const char hex[] = "0123456789abcdef";
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	static _Atomic uint32_t counter;
	uint32_t n;

	pthread_once(&once, init_prefix);
	n = atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
	/* %02x x4 then %08x, by hand: snprintf was 2 % of a replay */
	for (int i = 0; i < 4; i++) {
		out[2 * i] = hex[id_prefix[i] >> 4];
		out[2 * i + 1] = hex[id_prefix[i] & 15];
	}
	for (int i = 0; i < 8; i++)
		out[8 + i] = hex[(n >> (28 - 4 * i)) & 15];
	out[16] = '\0';
}

static double since_start(const http_req *r)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - r->start.tv_sec) +
	       (double)(now.tv_nsec - r->start.tv_nsec) / 1e9;
}

/*
 * The metrics see a request before its client sees the answer: observed
 * after the response is complete (on_completed), a client that read its
 * replay and asked /metrics at once could find it not yet counted.
 */
static void observe(const char *outcome, double secs)
{
	int dup = strcmp(outcome, "replay") == 0 || strcmp(outcome, "in_progress") == 0 ||
	          strcmp(outcome, "mismatch") == 0;

	metrics_observe(secs, dup || strcmp(outcome, "first") == 0, dup);
}

static enum MHD_Result send_answer(http_req *r, http_answer *a)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char retry[16];
	const char *ctype = a->content_type;

	if (!ctype)
		ctype = a->status >= 400 ? "application/problem+json"
		                         : "application/json; charset=utf-8";
	resp = MHD_create_response_from_buffer(a->len, a->body ? a->body : (void *)"",
	                                       a->body ? MHD_RESPMEM_MUST_FREE
	                                               : MHD_RESPMEM_PERSISTENT);
	if (!resp)
		return MHD_NO;
	a->body = NULL; /* owned by the response now */
	MHD_add_response_header(resp, "Content-Type", ctype);
	MHD_add_response_header(resp, "X-Request-Id", r->request_id);
	MHD_add_response_header(resp, "Cache-Control", "no-store");
	if (a->replayed)
		MHD_add_response_header(resp, "Idempotent-Replayed", "true");
	if (a->retry_after > 0) {
		snprintf(retry, sizeof(retry), "%d", a->retry_after);
		MHD_add_response_header(resp, "Retry-After", retry);
	}
	if (a->allow)
		MHD_add_response_header(resp, "Allow", a->allow);
	if (a->www_auth)
		MHD_add_response_header(resp, "WWW-Authenticate", a->www_auth);
	if (a->close)
		MHD_add_response_header(resp, "Connection", "close");
	r->answered = 1;
	r->answer.status = a->status;
	r->answer.outcome = a->outcome ? a->outcome : "-";
	r->answer.replayed = a->replayed;
	observe(r->answer.outcome, since_start(r));
	ret = MHD_queue_response(r->conn, (unsigned)a->status, resp);
	MHD_destroy_response(resp);
	track_set(r->server, r->conn, 0);
	return ret;
}

#define TARGET_MAX       8192
#define QUERY_PARAMS_MAX 256

/*
 * The request line is in: libmicrohttpd calls this with the target as
 * received, before it splits and decodes the query, and makes the return
 * value the request's context. The raw target is checked here: its bytes,
 * no %00 (a decoded NUL would cut the path or a query value short), and at
 * most QUERY_PARAMS_MAX parameters: 0.9.75 runs out of connection memory on
 * thousands of them and then never answers, so the query of such a target
 * is emptied before it is parsed and the request answered 414.
 */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	http_server *h = cls;
	http_req *r = malloc(sizeof(*r));
	size_t params = 0;
	char *q;

	if (!r)
		return NULL;
	memset(r, 0, offsetof(http_req, arena_mem));
	arena_init(&r->arena, r->arena_mem, sizeof(r->arena_mem));
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	r->server = h;
	r->conn = conn;
	snprintf(r->method, sizeof(r->method), "-");
	clock_gettime(CLOCK_MONOTONIC, &r->start);
	request_id(r->request_id);
	/*
	 * Counted, then the drain flag read; http_stop sets the flag, then
	 * reads the count (both sequentially consistent): either it sees this
	 * request and waits for it, or this request sees the flag and is
	 * refused at once, so MHD_stop_daemon never joins a connection thread
	 * waiting for a write.
	 */
	atomic_fetch_add(&h->active, 1);
	if (atomic_load(&h->draining)) {
		atomic_fetch_sub(&h->active, 1);
		r->refused = 1;
	}
	r->raw_uri_len = strlen(uri);
	for (size_t i = 0; i < r->raw_uri_len; i++) {
		unsigned char c = (unsigned char)uri[i];

		params += c == '&';
		if (c < 0x21 || c > 0x7e) {
			r->target_problem = "the request target holds a byte outside 0x21..0x7E";
			r->target_status = 400;
		} else if (c == '%' && uri[i + 1] == '0' && uri[i + 2] == '0') {
			r->target_problem = "the request target holds %00";
			r->target_status = 400;
		}
	}
	if (r->raw_uri_len > TARGET_MAX || params >= QUERY_PARAMS_MAX) {
		r->target_problem = "the request target is too long or has too many parameters";
		r->target_status = 414;
		/* the same buffer libmicrohttpd parses next: leave it no query */
		if ((q = strchr(uri, '?')) != NULL)
			q[1] = '\0';
	}
	return r;
}

/*
 * The head is in (the first call for a request): refuse what the target,
 * the framing, the route, the credentials, the size or the media type
 * rule out, before any of the body is read.
 */
static enum MHD_Result on_head(http_server *h, http_req *r, struct MHD_Connection *conn,
                               const char *url, const char *method, const char *version)
{
	http_answer a = {0};
	const char *cl;
	size_t cl_len = 0;

	r->started = 1;
	snprintf(r->method, sizeof(r->method), "%s", method);
	if (r->refused) {
		answer_problem(&a, 503, "shutting_down",
		               "the server is shutting down; retry on another instance");
		a.close = 1;
		return send_answer(r, &a);
	}
	if (r->target_problem) {
		answer_problem(&a, r->target_status,
		               r->target_status == 414 ? "uri_too_long" : "invalid_request",
		               r->target_problem);
		a.close = 1;
		return send_answer(r, &a);
	}
	if (head_parse(&r->head, &r->arena, conn, method, url, version, r->raw_uri_len, &a) != 0)
		return send_answer(r, &a);
	if (route_prepare(h->state, r, method, url, &r->match, &a) != 0)
		return send_answer(r, &a);
	cl = req_header(r, "Content-Length", &cl_len);
	if (cl && strtoull(cl, NULL, 10) > SERVER_DRAIN_MAX) {
		answer_problem(&a, 413, "payload_too_large", "the body is larger than 1 MiB");
		a.close = 1;
		return send_answer(r, &a);
	}
	/* Up to SERVER_DRAIN_MAX, the body is read and dropped before the
	 * 413: a client that sends it whole before reading (Python's
	 * http.client does) then reads the problem, not a broken pipe. */
	if (cl && strtoull(cl, NULL, 10) > SERVER_BODY_MAX) {
		r->too_large = 1;
		return MHD_YES;
	}
	if (route_check_media(r, method, &a) != 0)
		return send_answer(r, &a);
	return MHD_YES;
}

/*
 * n more body bytes: kept up to SERVER_BODY_MAX (in the arena while they
 * fit HTTP_BODY_INLINE, then in malloc), counted and dropped beyond it.
 */
static enum MHD_Result body_append(http_req *r, const char *upload, size_t n)
{
	if (r->too_large || r->len + n > SERVER_BODY_MAX) {
		r->too_large = 1;
		r->dropped += n;
		/* chunked: no more than SERVER_DRAIN_MAX, then the connection goes */
		return r->len + r->dropped > SERVER_DRAIN_MAX ? MHD_NO : MHD_YES;
	}
	if (r->len + n + 1 > r->cap) {
		size_t cap = r->cap ? r->cap * 2 : HTTP_BODY_INLINE;
		char *p;

		while (cap < r->len + n + 1)
			cap *= 2;
		if (!r->cap && cap == HTTP_BODY_INLINE) {
			p = arena_alloc(&r->arena, cap);
		} else if (r->body_heap) {
			p = realloc(r->body, cap);
		} else if ((p = malloc(cap)) != NULL) {
			if (r->len)
				memcpy(p, r->body, r->len);
			r->body_heap = 1;
		}
		if (!p)
			return MHD_NO;
		r->body = p;
		r->cap = cap;
	}
	memcpy(r->body + r->len, upload, n);
	r->len += n;
	r->body[r->len] = '\0';
	return MHD_YES;
}

/* The body is in: run the route and send its answer (a write's once its writer gave it). */
static enum MHD_Result on_body_done(http_server *h, http_req *r, struct MHD_Connection *conn)
{
	http_answer a = {0};

	if (r->too_large) {
		answer_problem(&a, 413, "payload_too_large", "the body is larger than 1 MiB");
		return send_answer(r, &a);
	}
	track_set(h, conn, 0); /* the request is in: no deadline while it is answered */
	a.outcome = "-";
	route_run(h->state, r, &r->match, &a);
	if (!a.pending)
		return send_answer(r, &a);
	/* A write: its answer comes from the writer (or came already). */
	pthread_mutex_lock(&r->lock);
	while (!r->ready)
		pthread_cond_wait(&r->cond, &r->lock);
	pthread_mutex_unlock(&r->lock);
	return send_answer(r, &r->later);
}

/*
 * libmicrohttpd's access handler, called on the connection's thread: once
 * with the head, once per piece of body, once more when the body is in.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
	http_server *h = cls;
	http_req *r = *con_cls;
	size_t n;

	if (!r) /* no context: out of memory in on_uri */
		return MHD_NO;
	if (!r->started)
		return on_head(h, r, conn, url, method, version);
	if (r->answered) { /* answered early: drop whatever still arrives */
		*upload_size = 0;
		return MHD_YES;
	}
	if ((n = *upload_size) > 0) {
		*upload_size = 0;
		return body_append(r, upload, n);
	}
	return on_body_done(h, r, conn);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
	http_server *h = cls;
	http_req *r = *con_cls;
	double secs;
	int refused;
	const char *o;

	if (!r)
		return;
	secs = since_start(r);
	o = r->answered ? r->answer.outcome : "aborted";
	if (!r->answered)
		observe(o, secs);
	log_request(r->request_id, r->method, r->match.route ? r->match.route : "-",
	            r->answered ? r->answer.status : 0,
	            toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? o : "client-gone", secs * 1000.0);
	track_set(h, conn, 1);
	refused = r->refused;
	free(r->later.body);
	if (r->body_heap)
		free(r->body);
	arena_release(&r->arena);
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r);
	*con_cls = NULL;
	if (!refused)
		atomic_fetch_sub(&h->active, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];

	(void)cls;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	msg[strcspn(msg, "\n")] = '\0';
	log_msg("warn", "http: %s", msg);
}

/* "host:port", "[v6]:port" or ":port" into a socket address. */
static int parse_listen(const char *spec, struct sockaddr_storage *ss, char *err, size_t errlen)
{
	char host[128] = "", port[16] = "";
	const char *colon;
	struct addrinfo hints = {0}, *ai = NULL;
	int rc;

	if (spec[0] == '[') {
		const char *end = strchr(spec, ']');

		if (!end || end[1] != ':' || (size_t)(end - spec - 1) >= sizeof(host))
			goto bad;
		memcpy(host, spec + 1, (size_t)(end - spec - 1));
		snprintf(port, sizeof(port), "%s", end + 2);
	} else {
		if (!(colon = strrchr(spec, ':')) || (size_t)(colon - spec) >= sizeof(host))
			goto bad;
		memcpy(host, spec, (size_t)(colon - spec));
		snprintf(port, sizeof(port), "%s", colon + 1);
	}
	/* At most 5 digits, so strtoul cannot overflow; no atol (STYLE.md). */
	if (!port[0] || strlen(port) > 5 || strspn(port, "0123456789") != strlen(port) ||
	    strtoul(port, NULL, 10) > 65535)
		goto bad;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	if ((rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai)) != 0) {
		snprintf(err, errlen, "cannot resolve listen address '%s': %s", spec,
		         gai_strerror(rc));
		return -1;
	}
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return 0;
bad:
	snprintf(err, errlen, "listen address '%s' is not host:port", spec);
	return -1;
}

int http_start(http_server **out, server_state *s, char *err, size_t errlen)
{
	struct sockaddr_storage ss = {0};
	http_server *h;
	/* poll, not epoll: thread-per-connection allows no other. */
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
	                 MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;

	*out = NULL;
	if (parse_listen(s->cfg->listen, &ss, err, errlen) < 0)
		return -1;
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	if (!(h = calloc(1, sizeof(*h)))) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	h->state = s;
	pthread_mutex_init(&h->conns_lock, NULL);
	pthread_cond_init(&h->wake, NULL);
	h->daemon = MHD_start_daemon(
	    flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_STACK_SIZE,
	    (size_t)HTTP_STACK_SIZE, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg->conn_timeout_s,
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_LISTEN_BACKLOG_SIZE,
	    1024u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_URI_LOG_CALLBACK,
	    on_uri, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections_per_ip,
	    MHD_OPTION_END);
	if (!h->daemon) {
		snprintf(err, errlen, "cannot listen on %s (address in use or not permitted?)",
		         s->cfg->listen);
		free(h);
		return -1;
	}
	if (pthread_create(&h->watchdog, NULL, watchdog_main, h) == 0)
		h->watchdog_started = 1;
	else
		log_msg("warn", "http: no request deadline (cannot start the watchdog thread)");
	*out = h;
	return 0;
}

int http_port(http_server *h)
{
	const union MHD_DaemonInfo *info =
	    MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);

	return info ? info->port : 0;
}

int http_stop(http_server *h, int grace_ms)
{
	int left;

	if (!h)
		return 0;
	/*
	 * Requests in flight finish and are answered; one begun from now on is
	 * answered 503 with Connection: close (the listen socket stays open
	 * until MHD_stop_daemon). Not MHD_quiesce_daemon: with the epoll
	 * thread pool idemd used before, it removed the listen socket from
	 * each worker's epoll set from this thread while a worker at its
	 * connection limit could remove it too, and the loser's EPOLL_CTL_DEL
	 * failed with ENOENT, which 0.9.75 turns into MHD_PANIC ("Failed to
	 * remove listen FD from epoll set"); and a keep-alive request suspended
	 * just after the count was read made MHD_stop_daemon panic ("called
	 * while we have suspended connections"). tests/http/test_shutdown_load.py.
	 */
	atomic_store(&h->draining, 1);
	for (int waited = 0; atomic_load(&h->active) > 0 && waited < grace_ms; waited += 10)
		nanosleep(&(struct timespec){0, 10000000}, NULL);
	/* A request still waiting for its writer or channel thread: its
	 * connection thread cannot be joined, so MHD_stop_daemon is not called. */
	if ((left = atomic_load(&h->active)) > 0)
		return left;
	MHD_stop_daemon(h->daemon);
	watchdog_stop(h);
	free(h);
	return 0;
}
