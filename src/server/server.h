/*
 * server/server.h: idemd's parts: configuration, the HTTP glue on
 * libmicrohttpd, the route table, metrics and logging. The server maps
 * HTTP to calls of the public API (idem/idem.h) and back; it holds no SQL
 * and no business rules.
 */
#ifndef IDEM_SERVER_H
#define IDEM_SERVER_H

#include <stdatomic.h>
#include <stdint.h>

#include "idem/idem.h"

#define SERVER_BODY_MAX (1024 * 1024)
/* An oversized body up to this size is read and dropped before the 413. */
#define SERVER_DRAIN_MAX (8 * 1024 * 1024)

typedef enum { LOG_TEXT, LOG_JSON } log_format;

typedef struct {
	char listen[128];
	char db[1024];
	int threads; /* --threads: libmicrohttpd's event threads */
	int64_t ttl_ms;
	log_format log_format;
	int mock_channel_delay_ms;
	char public_url[512]; /* notify_url base for connected channels */
	int channel_workers, channel_queue;
	int sweep_interval_ms, sweep_age_ms;
	int max_connections;
	int conn_timeout_s;
	int request_timeout_s;      /* head + body of one request, from its start */
	int max_connections_per_ip; /* 0: no cap */
	int synchronous_full;
	int busy_timeout_ms;
	int max_retries;
	int batch_max;
	int batch_wait_us;
	int writers;
	int queue_timeout_ms;
	int cache_mb;
	int cache_entries;
} server_config;

/* ---- logging (log.c) ---- */
void log_init(log_format fmt);
/* level: "info", "warn", "error". A message, never a secret. */
void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* route: the route template (/v1/payments/{id}), or "-" when none matched. */
void log_request(const char *request_id, const char *method, const char *route, int status,
                 const char *outcome, double duration_ms);

/* ---- metrics (metrics.c) ---- */
/* One finished request: its duration and, for claims, the outcome. */
void metrics_observe(double seconds, int claimed, int duplicate);
/* The conflict ratio over the sliding window, and the number of claims in it. */
double metrics_duplicate_ratio(uint64_t *claims_out);
/* Render everything in Prometheus text format; malloc'd into *out. */
int metrics_render(char **out, size_t *len, idem_store *store);

/* ---- HTTP (http.c, head.c, routes.c) ---- */

/* What a handler answers. body is malloc'd (or NULL) and owned by the response. */
typedef struct {
	int status;
	char *body;
	size_t len;
	const char *content_type; /* NULL: derived from status (json / problem+json) */
	int replayed;             /* Idempotent-Replayed: true */
	int retry_after;          /* seconds, 0: none */
	const char *allow;        /* Allow header for 405 */
	const char *outcome;      /* for the log line: "first", "replay", ... or "-" */
	int pending;              /* the answer comes later through http_write_done */
	int close;                /* Connection: close (the framing is not to be trusted) */
	const char *www_auth;     /* WWW-Authenticate header for 401 */
} http_answer;

/* One request as handlers see it. Borrowed for the call. */
typedef struct http_req http_req;

/*
 * The write a handler started with an idem_pay_*_async call; its strings
 * live in the request, which lives until the answer is given. Set
 * answer->pending, then pass http_write_done and the request as
 * done/done_ctx: it resumes the suspended connection with the answer, on
 * whatever thread has it, after which the request may be gone.
 */
idem_pay_request *req_write(http_req *r, char **key_buf, size_t *key_size, char **path_buf,
                            size_t *path_size);
void http_write_done(void *req, int rc, idem_result *res);
/* A header's raw bytes (*len of them; they may hold NUL), NULL when absent. */
const char *req_header(http_req *r, const char *name, size_t *len);
/* A decoded query value and its length, NULL when absent. */
const char *req_query(http_req *r, const char *name, size_t *len);
int req_header_count(http_req *r, const char *name);
const char *req_body(http_req *r, size_t *len);

typedef struct {
	idem_store *store;
	idem_pay *pay;
	const server_config *cfg;
} server_state;

/* Set a problem answer. */
void answer_problem(http_answer *a, int status, const char *code, const char *detail);
/* Turn a pay result (or error rc) into an answer. */
void answer_result(http_answer *a, int rc, idem_result *res);

/*
 * Routing, split by what may wait. route_begin runs on the event thread
 * when the headers are in (before the body): it picks the route and checks
 * the method and, from memory, the credentials; when it answers, the body
 * is never read. route_authenticate (a key the cache does not hold) and
 * route_run (the handler, once the body is in) may wait for the store and
 * run on a worker thread; route_run_fast is what a route answers without
 * waiting (/metrics, the replay shortcut), route_start a write it starts
 * without waiting (a payment queued for its writer).
 */
typedef struct route_match route_match;
typedef int (*route_handler)(server_state *s, http_req *r, route_match *m, http_answer *a);
typedef int (*route_starter)(server_state *s, http_req *r, route_match *m);
struct route_match {
	route_handler handler;           /* may wait: on a worker */
	route_handler fast;              /* never waits: 1 answered, 0 not; or NULL */
	route_starter start;             /* never waits: 1 the write started, 0 not; or NULL */
	const char *route;               /* the template matched, for the log; NULL: none */
	char merchant[IDEM_PAY_ID_SIZE]; /* authenticated merchant */
	char param[320];                 /* path parameter ({id}, {channel}, {type}) */
	char param2[320];                /* second path parameter ({key}) */
	size_t param2_len;
};

/* route_begin's answers: m is ready; a has the answer; the key needs a lookup. */
#define ROUTE_READY    0
#define ROUTE_ANSWERED (-1)
#define ROUTE_AUTH     1
int route_begin(server_state *s, http_req *r, const char *method, const char *path, route_match *m,
                http_answer *a);
/* The bearer key's merchant into m (may read the store): 0, or -1 with the 401/503 in a. */
int route_authenticate(server_state *s, http_req *r, route_match *m, http_answer *a);
/*
 * route_begin and, when it asks, route_authenticate, on the calling thread
 * under the request's deadline (tests/fuzz's glue, which runs a request on
 * one thread): 0 when m is ready to run, else a has the answer.
 */
int route_prepare(server_state *s, http_req *r, const char *method, const char *path,
                  route_match *m, http_answer *a);

/* 1 when the route answered a without waiting; 0: run route_run on a worker. */
int route_run_fast(server_state *s, http_req *r, route_match *m, http_answer *a);
/*
 * After route_run_fast said 0, with r suspended: start the route's write
 * without waiting, under deadline (the request's), on the event thread.
 * 1 when it started: its answer comes through http_write_done, as a write
 * started by route_run's does, and r may be answered from then on; 0 when
 * it would wait (nothing done): run route_run on a worker.
 */
int route_start(server_state *s, http_req *r, route_match *m, int64_t deadline);
/*
 * Run the route once the body is in, on a worker thread under the
 * request's deadline (ended here); a says the answer, or a->pending when a
 * write's answer comes later through http_write_done.
 */
void route_run(server_state *s, http_req *r, route_match *m, http_answer *a);

/* 415 unless a POST's Content-Type, when given, is application/json. */
int route_check_media(http_req *r, const char *method, http_answer *a);

/*
 * A request's arena (http.c): what one request needs while it is being
 * read and answered (header fields, a small body) comes from a block inside
 * the request, bumped, never zeroed and freed once with the request, like
 * h2o's req->pool; what does not fit comes from malloc, listed, and freed
 * at the same time. STYLE.md; docs/benchmarks.md has the profile.
 */
typedef struct arena_block arena_block;
typedef struct {
	unsigned char *mem;
	size_t used, cap;
	arena_block *heap; /* overflow blocks */
} req_arena;
void arena_init(req_arena *a, void *mem, size_t cap);
/* n bytes, 16-aligned, uninitialised; NULL when out of memory. */
void *arena_alloc(req_arena *a, size_t n);
void arena_release(req_arena *a);

/*
 * The request head as bytes (head.c): every header field with the raw
 * length of its value, checked for the framing RFC 9112 requires (one Host
 * on HTTP/1.1, one Content-Length, no Content-Length with
 * Transfer-Encoding, chunked as the only transfer coding, token field
 * names, no control bytes in values). Control bytes, NUL included, are
 * left in the values of Authorization, Idempotency-Key and X-Signature,
 * whose consumers refuse them with their own problem (401, 400
 * invalid_idempotency_key); in any other value they are a 400.
 */
struct MHD_Connection;
typedef struct {
	const char *name;
	size_t name_len;
	const char *value; /* len raw bytes */
	size_t len;
	int nul; /* bytes after a NUL are part of the value */
} head_field;
typedef struct {
	head_field *f;
	size_t n, cap;
	req_arena *arena; /* where f lives */
} req_head;
/* 0: h is filled in (its fields in arena); -1: a has the problem (a->close set). */
int head_parse(req_head *h, req_arena *arena, struct MHD_Connection *conn, const char *method,
               const char *url, const char *version, size_t raw_uri_len, http_answer *a);
/* The first field called name (case-insensitive), *len its raw length, *count how many. */
const char *head_get(const req_head *h, const char *name, size_t *len, int *count);
void head_trim(const char **v, size_t *len);

/*
 * Worker threads (workers.c) for what may wait, so that libmicrohttpd's
 * event threads never do: an item runs on an idle worker, else on a new
 * one, up to max at once, each with a stack of stack_size bytes; a worker
 * idle for idle_ms exits. An item is linked through next while queued and
 * is the caller's: run gets it back and may free it.
 */
typedef struct work_item work_item;
struct work_item {
	work_item *next;
	void (*run)(work_item *item);
};
typedef struct workers workers;
int workers_start(workers **out, int max, size_t stack_size, int idle_ms);
/* 0: item will run; -1: no worker is running and none could be started. */
int workers_submit(workers *w, work_item *item);
/* Join every worker; nothing may be submitted any more. NULL is accepted. */
void workers_stop(workers *w);

/*
 * The request deadline (watchdog.c): one conn_track per TCP connection;
 * a request's head and body must be in within request_timeout_s of the
 * connection's opening or its previous answer, else its socket is shut
 * down. track_set(t, 1): the next request's clock starts now (if it is not
 * running); 0: the request is being answered. track_pause / track_unpause:
 * the clock stops while a key lookup runs on a worker, and goes on after.
 * Every track_* call is made on the connection's event thread; t NULL (an
 * untracked connection) is accepted.
 */
typedef struct watchdog watchdog;
typedef struct conn_track conn_track;
int watchdog_start(watchdog **out, int request_timeout_s);
void watchdog_stop(watchdog *w);
conn_track *watchdog_add(watchdog *w, int fd); /* NULL when out of memory */
void watchdog_remove(watchdog *w, conn_track *t);
void track_set(conn_track *t, int reading);
void track_pause(conn_track *t);
void track_unpause(conn_track *t);

/* Start and stop the HTTP daemon. */
typedef struct http_server http_server;
int http_start(http_server **out, server_state *s, char *err, size_t errlen);
/* The port actually bound (for --listen with port 0). */
int http_port(http_server *h);
/*
 * Let in-flight requests finish (up to grace_ms; one begun meanwhile is
 * answered 503 shutting_down), then stop. Returns the number of requests
 * still in flight after grace_ms (then the daemon is left running: the
 * caller must exit without cleaning up).
 */
int http_stop(http_server *h, int grace_ms);

#endif
