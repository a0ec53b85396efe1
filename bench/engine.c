/*
 * bench/engine.c: the load threads. Each thread owns an epoll set and a
 * share of the connections; every connection is a persistent HTTP/1.1
 * keep-alive socket to the target with exactly one request in flight
 * (closed loop: the next request leaves when the answer is complete), so
 * `concurrency` is the number of requests in flight. A response must carry
 * Content-Length (libmicrohttpd's buffer responses do). A connection that
 * fails is reopened; the request it carried is reported lost, never
 * retried, because a retry would change the duplicate ratio being measured.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define DRAIN_NS (15ULL * 1000000000ULL) /* wait this long for answers after the stop */
#define IN_START 16384

typedef struct {
	int fd;
	int busy; /* a request is in flight */
	size_t out_off;
	char *in;
	size_t in_len, in_cap;
	uint64_t t0;
	bench_req rq;
} conn;

typedef struct {
	bench *b;
	bench_thread *t;
	conn *conns;
	int nconns;
	int ep;
	int active; /* connections with a request in flight */
	int fatal;
	char err[512];
} worker;

static int open_socket(const bench *b)
{
	struct sockaddr_in sa;
	int fd, one = 1, fl;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)b->cfg.port);
	if (inet_pton(AF_INET, b->cfg.host, &sa.sin_addr) != 1)
		return -1;
	if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return -1;
	/* loopback: a blocking connect returns at once; I/O is non-blocking after */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || (fl = fcntl(fd, F_GETFL)) < 0 ||
	    fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static void conn_close(worker *w, conn *c)
{
	if (c->fd >= 0) {
		epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	c->fd = -1;
	c->in_len = 0;
}

static int conn_open(worker *w, conn *c)
{
	struct epoll_event ev;

	if ((c->fd = open_socket(w->b)) < 0)
		return -1;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.ptr = c;
	if (epoll_ctl(w->ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
		conn_close(w, c);
		return -1;
	}
	return 0;
}

static void want_write(worker *w, conn *c, int on)
{
	struct epoll_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
	ev.data.ptr = c;
	epoll_ctl(w->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Writes what is left of the request; 0 (done or waiting for EPOLLOUT), -1. */
static int flush_out(worker *w, conn *c)
{
	while (c->out_off < c->rq.len) {
		ssize_t n =
		    send(c->fd, c->rq.buf + c->out_off, c->rq.len - c->out_off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			want_write(w, c, 1);
			return 0;
		}
		if (n <= 0)
			return -1;
		c->out_off += (size_t)n;
	}
	return 0;
}

/* Starts this connection's next request, or leaves it idle when the phase
 * has nothing more to send. */
static void start_next(worker *w, conn *c)
{
	int rc;

	if (c->busy)
		return;
	rc = workload_next(w->b, w->t, &c->rq);
	if (rc != 0) {
		if (rc < 0 && !w->fatal) {
			w->fatal = 1;
			snprintf(w->err, sizeof(w->err), "cannot build a request (out of memory?)");
			atomic_store(&w->b->stop, 1);
		}
		return;
	}
	if (c->fd < 0 && conn_open(w, c) < 0) {
		w->t->transport_errors++;
		workload_lost(w->b, &c->rq);
		return;
	}
	c->busy = 1;
	w->active++;
	c->out_off = 0;
	c->in_len = 0;
	c->t0 = now_ns();
	if (flush_out(w, c) < 0) {
		w->t->transport_errors++;
		workload_lost(w->b, &c->rq);
		c->busy = 0;
		w->active--;
		conn_close(w, c);
	}
}

/* The request in flight on c got no answer. */
static void lose(worker *w, conn *c)
{
	if (c->busy) {
		w->t->transport_errors++;
		workload_lost(w->b, &c->rq);
		c->busy = 0;
		w->active--;
	}
	conn_close(w, c);
}

/* A header's value inside [p, end), or NULL. */
static const char *header(const char *p, const char *end, const char *name, size_t *vlen)
{
	size_t nl = strlen(name);

	while (p < end) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));

		if (!eol)
			eol = end;
		if ((size_t)(eol - p) > nl + 1 && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
			const char *v = p + nl + 1, *ve = eol;

			while (v < ve && (*v == ' ' || *v == '\t'))
				v++;
			while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
				ve--;
			*vlen = (size_t)(ve - v);
			return v;
		}
		p = eol + 1;
	}
	return NULL;
}

/*
 * Parses what has arrived: 1 a whole response was handled, 0 need more,
 * -1 malformed or too large.
 */
static int try_response(worker *w, conn *c)
{
	const char *buf = c->in, *hend, *v;
	size_t vlen = 0, hlen, clen = 0;
	int status, keep = 1;
	uint64_t t1;

	if (c->in_len < 12)
		return 0;
	hend = memmem(buf, c->in_len, "\r\n\r\n", 4);
	if (!hend)
		return c->in_len > 65536 ? -1 : 0;
	hlen = (size_t)(hend - buf) + 4;
	if (strncmp(buf, "HTTP/1.", 7) != 0 || buf[8] != ' ')
		return -1;
	status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
	if (status < 100 || status > 599)
		return -1;
	if (!(v = header(buf, hend, "Content-Length", &vlen)))
		return -1;
	for (size_t i = 0; i < vlen; i++) {
		if (v[i] < '0' || v[i] > '9' || clen > BENCH_RESP_MAX)
			return -1;
		clen = clen * 10 + (size_t)(v[i] - '0');
	}
	if (clen > BENCH_RESP_MAX)
		return -1;
	if ((v = header(buf, hend, "Connection", &vlen)) && vlen == 5 &&
	    strncasecmp(v, "close", 5) == 0)
		keep = 0;
	if (c->in_len < hlen + clen)
		return 0;
	t1 = now_ns();
	hist_record(&w->t->hist, t1 - c->t0);
	w->t->status[status]++;
	w->t->by_type[c->rq.type]++;
	if (c->rq.dup)
		w->t->dups++;
	w->t->last_done_ns = t1;
	workload_answer(w->b, w->t, &c->rq, status, buf + hlen, clen);
	c->busy = 0;
	w->active--;
	c->in_len = 0;
	if (!keep)
		conn_close(w, c);
	return 1;
}

static void on_readable(worker *w, conn *c)
{
	for (;;) {
		ssize_t n;

		if (c->in_cap - c->in_len < 4096) {
			size_t cap = c->in_cap * 2;
			char *p;

			if (cap > BENCH_RESP_MAX + 65536 || !(p = realloc(c->in, cap))) {
				lose(w, c);
				return;
			}
			c->in = p;
			c->in_cap = cap;
		}
		n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0 || !c->busy) {
			/* closed or reset, or bytes nobody asked for */
			lose(w, c);
			start_next(w, c);
			return;
		}
		c->in_len += (size_t)n;
		switch (try_response(w, c)) {
		case 0: continue;
		case 1: start_next(w, c); return;
		default:
			lose(w, c);
			start_next(w, c);
			return;
		}
	}
}

static void *worker_loop(worker *w);

static void *worker_main(void *arg)
{
	worker *w = arg;

	worker_loop(w);
	atomic_fetch_sub(&w->b->running, 1);
	return NULL;
}

static void *worker_loop(worker *w)
{
	struct epoll_event evs[64];
	uint64_t stop_seen = 0;

	for (int i = 0; i < w->nconns; i++) {
		conn *c = &w->conns[i];

		if (c->fd < 0 && conn_open(w, c) < 0) {
			w->fatal = 1;
			snprintf(w->err, sizeof(w->err), "cannot connect to %s:%d: %s",
			         w->b->cfg.host, w->b->cfg.port, strerror(errno));
			atomic_store(&w->b->stop, 1);
			return NULL;
		}
	}
	for (int i = 0; i < w->nconns; i++)
		start_next(w, &w->conns[i]);
	while (w->active > 0) {
		int n = epoll_wait(w->ep, evs, 64, 100);

		for (int i = 0; i < n; i++) {
			conn *c = evs[i].data.ptr;

			if (c->fd < 0)
				continue;
			if (evs[i].events & EPOLLOUT) {
				if (flush_out(w, c) < 0) {
					lose(w, c);
					start_next(w, c);
					continue;
				}
				if (c->out_off == c->rq.len)
					want_write(w, c, 0);
			}
			if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				on_readable(w, c);
		}
		if (atomic_load_explicit(&w->b->stop, memory_order_relaxed)) {
			uint64_t now = now_ns();

			if (!stop_seen)
				stop_seen = now;
			else if (now - stop_seen > DRAIN_NS)
				for (int i = 0; i < w->nconns; i++)
					lose(w, &w->conns[i]);
		}
	}
	return NULL;
}

static conn conns[BENCH_MAX_CONNS]; /* kept open across phases */

/* One phase's load threads. */
typedef struct {
	worker ws[64];
	pthread_t tids[64];
	int n;       /* threads asked for */
	int started; /* threads running, to be joined */
} crew;

/* The connections' input buffers: made by the first phase, kept after. */
static int conns_init(int n, char *err, size_t errlen)
{
	static int inited;

	if (inited)
		return 0;
	for (int i = 0; i < n; i++) {
		conns[i].fd = -1;
		if (!(conns[i].in = malloc(IN_START))) {
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		conns[i].in_cap = IN_START;
	}
	inited = 1;
	return 0;
}

/* Sockets kept from the last phase join this phase's epoll set. */
static void watch_kept_sockets(worker *w)
{
	for (int k = 0; k < w->nconns; k++) {
		struct epoll_event ev;

		if (w->conns[k].fd < 0)
			continue;
		memset(&ev, 0, sizeof(ev));
		ev.events = EPOLLIN;
		ev.data.ptr = &w->conns[k];
		epoll_ctl(w->ep, EPOLL_CTL_ADD, w->conns[k].fd, &ev);
	}
}

/* A thread per worker, the connections shared out evenly. On a failure
 * the threads already running are told to stop. */
static int start_workers(bench *b, bench_thread *threads, crew *c, char *err, size_t errlen)
{
	int per = b->cfg.concurrency / c->n, extra = b->cfg.concurrency % c->n, off = 0;

	for (int i = 0; i < c->n; i++) {
		worker *w = &c->ws[i];

		w->b = b;
		w->t = &threads[i];
		w->conns = &conns[off];
		w->nconns = per + (i < extra);
		off += w->nconns;
		w->ep = epoll_create1(EPOLL_CLOEXEC);
		watch_kept_sockets(w);
		if (w->ep < 0 || pthread_create(&c->tids[i], NULL, worker_main, w) != 0) {
			snprintf(err, errlen, "cannot start a load thread");
			atomic_fetch_sub(&b->running, c->n - i);
			atomic_store(&b->stop, 1);
			return -1;
		}
		c->started++;
	}
	return 0;
}

/* The timed phase ends at --duration (unless only --requests bounds it),
 * or earlier when every worker is done or one failed. */
static void stop_at_deadline(bench *b)
{
	uint64_t end;

	if (b->phase != PHASE_MAIN || (b->cfg.requests && !b->cfg.duration_set))
		return;
	end = b->phase_start_ns + (uint64_t)(b->cfg.duration_s * 1e9);
	while (!atomic_load(&b->stop) && atomic_load(&b->running) > 0 && now_ns() < end) {
		uint64_t left = end - now_ns();
		struct timespec ts = {0, left > 50000000 ? 50000000 : (long)left};

		nanosleep(&ts, NULL);
	}
	atomic_store(&b->stop, 1);
}

/* Joins the threads and closes their epoll sets; rc, or -1 with the first
 * worker's error when rc was 0 and one failed. */
static int join_workers(crew *c, int rc, char *err, size_t errlen)
{
	for (int i = 0; i < c->started; i++)
		pthread_join(c->tids[i], NULL);
	for (int i = 0; i < c->n; i++) {
		if (c->ws[i].fatal && rc == 0) {
			snprintf(err, errlen, "%s", c->ws[i].err);
			rc = -1;
		}
		if (c->ws[i].ep >= 0)
			close(c->ws[i].ep);
	}
	return rc;
}

int engine_run(bench *b, bench_thread *threads, int nthreads, char *err, size_t errlen)
{
	crew c;
	int rc;

	if (nthreads > 64 || b->cfg.concurrency > BENCH_MAX_CONNS) {
		snprintf(err, errlen, "too many threads or connections");
		return -1;
	}
	if (conns_init(b->cfg.concurrency, err, errlen) < 0)
		return -1;
	memset(&c, 0, sizeof(c));
	c.n = nthreads;
	for (int i = 0; i < nthreads; i++)
		c.ws[i].ep = -1;
	atomic_store(&b->stop, 0);
	atomic_store(&b->issued, 0);
	b->phase_start_ns = now_ns();
	atomic_store(&b->running, nthreads);
	if ((rc = start_workers(b, threads, &c, err, errlen)) == 0)
		stop_at_deadline(b);
	return join_workers(&c, rc, err, errlen);
}
