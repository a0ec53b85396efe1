/*
 * server/http.c: the libmicrohttpd glue. Collects each request's body
 * under a hard cap (1 MiB: larger is 413 without reading it when the
 * Content-Length says so), runs the route, frames the answer with its
 * headers, and logs one line per request with its duration and outcome.
 * A request's header fields and a small body live in its own arena
 * (server.h), freed once with it: no allocation per field.
 *
 * libmicrohttpd runs a pool of --threads event threads (epoll), each
 * serving many connections, and they must never wait: on them run only the
 * head and the body, the route, every 4xx, /metrics, a key the auth cache
 * verified, and a replay of an answered request's very bytes from the front
 * cache. Whatever may wait for the store (a key lookup, a read, /healthz's
 * ping, the start of a write) runs on a worker thread of its own
 * (workers.c) while the connection is suspended, so a request that waits
 * out its deadline on a frozen database holds only that worker, never an
 * event thread with /healthz and every other connection behind it. A write
 * holds no thread while it waits: the group-commit writer resumes the
 * connection after its COMMIT returned, so a 2xx never leaves before it is
 * durable (DESIGN.md §5). Who may touch a request when: below, before
 * struct http_req.
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
/* Each event and worker thread's stack (address space mostly; glibc's default
 * is 8 MiB): a worker runs a store read (libpq, MariaDB Connector/C, SQLite)
 * at most. */
#define HTTP_STACK_SIZE (1024 * 1024)
/* A worker idle this long exits (workers.c). */
#define WORKER_IDLE_MS 5000

/*
 * Who touches a request, and when.
 *
 * A request (http_req r) is made by on_uri and ended by on_completed (freed,
 * or kept for the connection's next request), both on the event thread that
 * owns its connection (libmicrohttpd calls every callback of a connection on
 * the thread of the pool that accepted it).
 * Apart from that thread, at most one other thread owns r at any time: the
 * worker running r's item (req_work) and, for a write, the thread that
 * calls http_write_done (a group-commit writer after its COMMIT, the
 * channel pool, or the worker itself when no commit is needed).
 *
 * Hand-over: the event thread hands r over only from its access handler,
 * by MHD_suspend_connection and then workers_submit (req_suspend), and
 * does not touch r again until libmicrohttpd calls the handler for it
 * again, which it does only after a resume. It suspends in two states
 * only, and 0.9.75 (connection.c, MHD_connection_handle_idle) calls again
 * in the same state: after the first call (HEADERS_PROCESSED) the first
 * call again, upload NULL, before it reads any body or sends 100 Continue
 * (REQ_HEAD_WAIT: head_resumed); after the final call
 * (FULL_REQ_RECEIVED) the final call again (REQ_RUN_WAIT: the answer). A
 * response queued in that call is sent; one queued in the first call with
 * a body still to come closes the connection after it, unread.
 *
 * The owner hands r back by writing the answer (r->later;
 * r->match.merchant after a key lookup) and then calling
 * MHD_resume_connection (req_resume), and touches r no more:
 * libmicrohttpd may answer and free it at once. The daemon's lock, taken in
 * MHD_resume_connection and again when the event thread takes the
 * connection back, orders the owner's writes before the event thread's
 * reads. While suspended, libmicrohttpd neither reads the connection nor
 * times it out nor closes it (0.9.75 takes it off its lists), so r and the
 * connection both live until the resume; a worker may read the request's
 * head and query meanwhile.
 *
 * One resume per suspend: each suspend is followed by one submit of r's
 * item (when no thread can take it, the event thread resumes at once with
 * a 503), each item ends in exactly one resume: req_work resumes after a
 * key lookup, a read, /healthz or a write refused before it started; a
 * started write (answer.pending) returns without touching r, and the
 * write's done callback, which idem_pay_*_async calls exactly once,
 * resumes. No resume comes before its suspend: the item is submitted
 * after it.
 *
 * No suspended connection at MHD_stop_daemon: a request is counted in
 * h->active from on_uri to on_completed (refused ones aside), only a
 * counted request suspends, and on_completed cannot run for a suspended
 * connection, so active == 0 means none is suspended. on_uri counts, then
 * reads the drain flag; http_stop sets the flag, then reads the count
 * (both sequentially consistent): a request is either seen by http_stop,
 * which waits for it, or sees the flag and is answered 503 shutting_down
 * at once, without suspending. A resumer is still inside
 * MHD_resume_connection for a moment after the event thread may have
 * completed the request (it wakes the thread through the daemon's ITC), so
 * it counts itself in h->resuming around the call, and http_stop waits for
 * that count as well: the increment comes before the resume, hence before
 * the decrement of active that http_stop saw.
 */

/* Where a request is: its head not seen yet; a key lookup, or the route,
 * on a worker (suspended); reading its body; answered or being answered. */
enum { REQ_NEW, REQ_HEAD_WAIT, REQ_BODY, REQ_RUN_WAIT, REQ_DONE };

struct http_req {
	struct MHD_Connection *conn;
	http_server *server;
	char request_id[17];
	char method[12];
	int phase;                  /* REQ_*: the event thread's, but for the hand-over */
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

	/* On a worker (REQ_HEAD_WAIT, REQ_RUN_WAIT): the item, the request's
	 * store deadline (from its arrival), the answer left for the event
	 * thread, and a write's request (its strings live here). */
	work_item item;
	int64_t deadline;
	http_answer later;
	idem_pay_request write;
	char key[IDEM_KEY_MAX + 2];
	char write_path[400];

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

struct http_server {
	struct MHD_Daemon *daemon;
	server_state *state;
	_Atomic int active;   /* requests begun and not completed, refused ones aside */
	_Atomic int draining; /* http_stop began: new requests are refused */
	_Atomic int resuming; /* threads inside req_resume */
	workers *workers;
	watchdog *watchdog;
};

/*
 * One per TCP connection (libmicrohttpd's socket context), touched only on
 * its event thread: its place on the watchdog's list (NULL: untracked, only
 * the idle timeout applies), and the last request's memory, kept for the
 * next request on the connection: a request is some 6 KiB, and a malloc
 * that large made glibc consolidate its fast bins on every request. Under
 * AddressSanitizer every request's memory is freed instead, so that a touch
 * of a request after its hand-back (above http_req) is still caught.
 */
#if defined(__SANITIZE_ADDRESS__)
#define HTTP_REUSE_REQ 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HTTP_REUSE_REQ 0
#endif
#endif
#ifndef HTTP_REUSE_REQ
#define HTTP_REUSE_REQ 1
#endif

typedef struct {
	conn_track *track;
	http_req *spare;
} http_conn;

static http_conn *conn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

static conn_track *track_of(struct MHD_Connection *conn)
{
	http_conn *c = conn_of(conn);

	return c ? c->track : NULL;
}

/* libmicrohttpd's word on a TCP connection: opened, or closed (after the
 * last request's on_completed, before the socket is closed). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
	http_server *h = cls;
	http_conn *c = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		if ((c = calloc(1, sizeof(*c))) != NULL && ci)
			c->track = watchdog_add(h->watchdog, ci->connect_fd);
		*socket_context = c;
		return;
	}
	if (!c)
		return;
	if (c->track)
		watchdog_remove(h->watchdog, c->track);
	free(c->spare);
	free(c);
	*socket_context = NULL;
}

/*
 * Test hooks (tests/http/test_pool.py, test_hardening.py ResumeRace):
 * IDEMD_TEST_WORKER_DELAY_MS holds every worker that long before its item,
 * as a slow store would; IDEMD_TEST_RESUME_DELAY_US holds a resumer that
 * long just after MHD_resume_connection, when the request may already be
 * answered and freed.
 */
static long worker_delay_ms, resume_delay_us;

static void sleep_us(long us)
{
	nanosleep(&(struct timespec){us / 1000000, us % 1000000 * 1000}, NULL);
}

/* The owner's last touch of r (above http_req: hand-over). */
static void req_resume(http_server *h, http_req *r)
{
	struct MHD_Connection *conn = r->conn;

	atomic_fetch_add(&h->resuming, 1);
	MHD_resume_connection(conn);
	/* r may be answered and freed from here on */
	if (resume_delay_us > 0)
		sleep_us(resume_delay_us);
	atomic_fetch_sub(&h->resuming, 1);
}

/* A write's answer, on the thread that has it: back to the event thread. */
void http_write_done(void *ctx, int rc, idem_result *res)
{
	http_req *r = ctx;

	answer_result(&r->later, rc, res);
	req_resume(r->server, r);
}

/* On a worker: what r was suspended for, under the request's deadline. */
static void req_work(work_item *item)
{
	http_req *r = (http_req *)(void *)((char *)item - offsetof(http_req, item));
	http_server *h = r->server;
	http_answer a = {0};

	if (worker_delay_ms > 0)
		sleep_us(worker_delay_ms * 1000);
	idem_deadline_adopt(r->deadline);
	a.outcome = "-";
	if (r->phase == REQ_HEAD_WAIT) {
		route_authenticate(h->state, r, &r->match, &a); /* a.status 0: the merchant is in */
		idem_deadline_end();
	} else {
		route_run(h->state, r, &r->match, &a);
		if (a.pending)
			return; /* a write: its done callback resumes r, maybe did: not ours */
	}
	r->later = a;
	req_resume(h, r);
}

/*
 * On the event thread, in the access handler: hand r to a worker for what
 * may wait (phase REQ_HEAD_WAIT: the key lookup; REQ_RUN_WAIT: the route).
 * libmicrohttpd calls the handler again once the worker resumed it.
 */
static void req_hold(http_req *r, int phase)
{
	r->phase = phase;
	r->item.run = req_work;
	track_pause(track_of(r->conn));
	MHD_suspend_connection(r->conn);
}

/* r is held (req_hold): its item to a worker, or a 503 when none can start. */
static enum MHD_Result req_submit(http_server *h, http_req *r)
{
	if (workers_submit(h->workers, &r->item) == 0)
		return MHD_YES;
	answer_problem(&r->later, 503, "server_busy",
	               "no thread could be started for this request; retry later");
	r->later.outcome = "error";
	req_resume(h, r);
	return MHD_YES;
}

static enum MHD_Result req_suspend(http_server *h, http_req *r, int phase)
{
	req_hold(r, phase);
	return req_submit(h, r);
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
	track_set(track_of(r->conn), 0);
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
	http_conn *hc = conn_of(conn);
	http_req *r = hc && hc->spare ? hc->spare : malloc(sizeof(*r));
	size_t params = 0;
	char *q;

	if (!r)
		return NULL;
	if (hc)
		hc->spare = NULL;
	memset(r, 0, offsetof(http_req, arena_mem));
	arena_init(&r->arena, r->arena_mem, sizeof(r->arena_mem));
	r->server = h;
	r->conn = conn;
	snprintf(r->method, sizeof(r->method), "-");
	clock_gettime(CLOCK_MONOTONIC, &r->start);
	request_id(r->request_id);
	/*
	 * Counted, then the drain flag read; http_stop sets the flag, then
	 * reads the count (both sequentially consistent): either it sees this
	 * request and waits for it, or this request sees the flag and is
	 * refused at once without suspending (above http_req), so
	 * MHD_stop_daemon never finds a suspended connection.
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

/* The head's checks after the credentials: size, then media type. */
static enum MHD_Result head_rest(http_req *r, const char *method)
{
	http_answer a = {0};
	const char *cl;
	size_t cl_len = 0;

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
 * The head is in (the first call for a request): refuse what the target,
 * the framing, the route, the credentials, the size or the media type
 * rule out, before any of the body is read. A bearer key the cache does
 * not hold is looked up on a worker with the connection suspended in this
 * first call; libmicrohttpd 0.9.75 then calls it again once resumed, still
 * before it reads the body or sends 100 Continue (head_resumed).
 */
static enum MHD_Result on_head(http_server *h, http_req *r, struct MHD_Connection *conn,
                               const char *url, const char *method, const char *version)
{
	http_answer a = {0};
	int rc;

	r->phase = REQ_BODY;
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
	/* The request's one deadline in the store, from its arrival: a worker
	 * adopts it for the key lookup, every read and the write it queues. */
	idem_deadline_begin(h->state->store);
	r->deadline = idem_deadline_get();
	idem_deadline_end();
	if ((rc = route_begin(h->state, r, method, url, &r->match, &a)) == ROUTE_ANSWERED)
		return send_answer(r, &a);
	if (rc == ROUTE_AUTH)
		return req_suspend(h, r, REQ_HEAD_WAIT);
	return head_rest(r, method);
}

/* Called again after the key lookup: its 401 or 503, or the rest of the head. */
static enum MHD_Result head_resumed(http_req *r, const char *method)
{
	r->phase = REQ_BODY;
	track_unpause(track_of(r->conn));
	if (r->later.status)
		return send_answer(r, &r->later);
	return head_rest(r, method);
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

/*
 * The body is in: answer what never waits here (413, /metrics, the replay
 * shortcut), start here what needs no wait to start (a payment queued for
 * its writer: route_start, with r held as for a worker, since the writer
 * may resume r before route_start returns), and hand the rest to a
 * worker; the answer is sent when libmicrohttpd calls again after the
 * resume (phase REQ_RUN_WAIT).
 */
static enum MHD_Result on_body_done(http_server *h, http_req *r, struct MHD_Connection *conn)
{
	http_answer a = {0};

	r->phase = REQ_DONE;
	if (r->too_large) {
		answer_problem(&a, 413, "payload_too_large", "the body is larger than 1 MiB");
		return send_answer(r, &a);
	}
	track_set(track_of(conn), 0); /* the request is in: no deadline while it is answered */
	a.outcome = "-";
	if (route_run_fast(h->state, r, &r->match, &a))
		return send_answer(r, &a);
	free(a.body); /* a 0 leaves nothing, but be sure */
	req_hold(r, REQ_RUN_WAIT);
	if (route_start(h->state, r, &r->match, r->deadline))
		return MHD_YES; /* r may be answered from here on: not ours */
	return req_submit(h, r);
}

/*
 * libmicrohttpd's access handler, on the event thread owning the
 * connection: once with the head (and once more after a key lookup), once
 * per piece of body, once more when the body is in (and once more after
 * the worker or the writer resumed the connection).
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
	if (r->phase == REQ_NEW)
		return on_head(h, r, conn, url, method, version);
	if (r->phase == REQ_HEAD_WAIT)
		return head_resumed(r, method);
	if (r->phase == REQ_RUN_WAIT) {
		r->phase = REQ_DONE;
		return send_answer(r, &r->later);
	}
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
	http_conn *c = conn_of(conn);
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
	track_set(c ? c->track : NULL, 1);
	refused = r->refused;
	free(r->later.body);
	if (r->body_heap)
		free(r->body);
	arena_release(&r->arena);
	if (HTTP_REUSE_REQ && c && !c->spare)
		c->spare = r; /* for the next request on this connection */
	else
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
	/* epoll on Linux; ITC so that a resume wakes the connection's thread. */
	unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG |
	                 MHD_ALLOW_SUSPEND_RESUME;
	const char *hook;

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
	worker_delay_ms =
	    (hook = getenv("IDEMD_TEST_WORKER_DELAY_MS")) ? strtol(hook, NULL, 10) : 0;
	resume_delay_us =
	    (hook = getenv("IDEMD_TEST_RESUME_DELAY_US")) ? strtol(hook, NULL, 10) : 0;
	/* As many workers as connections: each has at most one item in flight. */
	if (workers_start(&h->workers, s->cfg->max_connections, HTTP_STACK_SIZE, WORKER_IDLE_MS) <
	        0 ||
	    watchdog_start(&h->watchdog, s->cfg->request_timeout_s) < 0) {
		snprintf(err, errlen, "out of memory");
		workers_stop(h->workers);
		free(h);
		return -1;
	}
	h->daemon = MHD_start_daemon(
	    flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE,
	    (unsigned)s->cfg->threads, MHD_OPTION_THREAD_STACK_SIZE, (size_t)HTTP_STACK_SIZE,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg->conn_timeout_s,
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_LISTEN_BACKLOG_SIZE,
	    1024u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_URI_LOG_CALLBACK,
	    on_uri, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections_per_ip,
	    MHD_OPTION_END);
	if (!h->daemon) {
		snprintf(err, errlen, "cannot listen on %s (address in use or not permitted?)",
		         s->cfg->listen);
		workers_stop(h->workers);
		watchdog_stop(h->watchdog);
		free(h);
		return -1;
	}
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
	 * thread pool it removes the listen socket from each event thread's
	 * epoll set from this thread while an event thread at its connection
	 * limit may remove it too, and the loser's EPOLL_CTL_DEL fails with
	 * ENOENT, which 0.9.75 turns into MHD_PANIC ("Failed to remove listen
	 * FD from epoll set"). And the count, not a quiesce, is what rules out
	 * "MHD_stop_daemon() called while we have suspended connections"
	 * (above http_req). tests/http/test_shutdown_load.py.
	 */
	atomic_store(&h->draining, 1);
	for (int waited = 0; atomic_load(&h->active) > 0 && waited < grace_ms; waited += 10)
		sleep_us(10000);
	/* A request still waiting for its worker, writer or channel thread is
	 * suspended: the daemon must not be stopped under it. */
	if ((left = atomic_load(&h->active)) > 0)
		return left;
	while (atomic_load(&h->resuming) > 0) /* the end of a MHD_resume_connection */
		sleep_us(1000);
	MHD_stop_daemon(h->daemon);
	workers_stop(h->workers);
	watchdog_stop(h->watchdog);
	free(h);
	return 0;
}
