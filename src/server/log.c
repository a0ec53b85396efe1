/*
 * server/log.c: idemd's log lines on stderr, as text or JSON, one line per
 * request. Only what is passed in is printed: callers never pass headers,
 * bodies or keys of merchants, so no secret can reach a log line; requests
 * are logged by their route template (/v1/payments/{id}), never by their
 * path. Every string is escaped first (control bytes, backslash and every
 * byte >= 0x7F as \xHH), so a client's bytes cannot forge a line, move a
 * terminal's cursor, or make a JSON line invalid UTF-8.
 *
 * Request lines never cost a write(2) on the request path: they are
 * appended to a bounded buffer that a flusher thread writes out, one
 * write per batch of lines (docs/benchmarks.md measured a write and an
 * fflush per request). A request thread waits only when the buffer is full,
 * so no line is ever dropped. log_msg (startup, warnings, errors) writes
 * synchronously, after everything queued before it, so the line that
 * precedes an _exit is on stderr, and lines keep their order: whoever
 * writes to fd 2 holds out_lock, and takes the queue with it.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#define QUEUE_MAX (256 * 1024) /* bytes of request lines waiting for the flusher */

static log_format format = LOG_TEXT;

static struct {
	pthread_mutex_t lock;     /* buf, len, stopping */
	pthread_mutex_t out_lock; /* writes to fd 2; taken before lock */
	pthread_cond_t more, room;
	char *buf, *spare; /* QUEUE_MAX each; the flusher writes spare */
	size_t len;
	int started, stopping;
	pthread_t thread;
} q = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .out_lock = PTHREAD_MUTEX_INITIALIZER,
       .more = PTHREAD_COND_INITIALIZER,
       .room = PTHREAD_COND_INITIALIZER};

static void write_all(const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(STDERR_FILENO, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* nowhere to log to: nothing better to do */
		p += w;
		n -= (size_t)w;
	}
}

/* With out_lock held: write out whatever is queued. */
static void drain_locked_out(void)
{
	char *batch;
	size_t n;

	pthread_mutex_lock(&q.lock);
	batch = q.buf;
	n = q.len;
	q.buf = q.spare;
	q.spare = batch;
	q.len = 0;
	pthread_cond_broadcast(&q.room);
	pthread_mutex_unlock(&q.lock);
	if (n)
		write_all(batch, n);
}

static void *flusher_main(void *arg)
{
	(void)arg;
	for (;;) {
		int stop;

		pthread_mutex_lock(&q.lock);
		while (!q.stopping && q.len == 0)
			pthread_cond_wait(&q.more, &q.lock);
		stop = q.stopping;
		pthread_mutex_unlock(&q.lock);
		/* Let a batch gather: at 30k requests/s this is ~15 lines a write. */
		if (!stop)
			nanosleep(&(struct timespec){0, 500 * 1000}, NULL);
		pthread_mutex_lock(&q.out_lock);
		drain_locked_out();
		pthread_mutex_unlock(&q.out_lock);
		if (stop)
			return NULL;
	}
}

/* Queued lines first, then this one, all before returning. */
static void write_now(const char *line, size_t n)
{
	pthread_mutex_lock(&q.out_lock);
	drain_locked_out();
	write_all(line, n);
	pthread_mutex_unlock(&q.out_lock);
}

/* Queue one line (with its \n) for the flusher; write it here without one. */
static void enqueue(const char *line, size_t n)
{
	pthread_mutex_lock(&q.lock);
	while (q.started && n <= QUEUE_MAX && q.len + n > QUEUE_MAX)
		pthread_cond_wait(&q.room, &q.lock);
	if (!q.started || n > QUEUE_MAX) { /* no flusher (any more) */
		pthread_mutex_unlock(&q.lock);
		write_now(line, n);
		return;
	}
	if (q.len == 0)
		pthread_cond_signal(&q.more);
	memcpy(q.buf + q.len, line, n);
	q.len += n;
	pthread_mutex_unlock(&q.lock);
}

static void log_stop(void)
{
	pthread_mutex_lock(&q.lock);
	if (!q.started) {
		pthread_mutex_unlock(&q.lock);
		return;
	}
	q.stopping = 1;
	pthread_cond_signal(&q.more);
	pthread_mutex_unlock(&q.lock);
	pthread_join(q.thread, NULL);
	pthread_mutex_lock(&q.lock);
	q.started = 0;
	pthread_cond_broadcast(&q.room);
	pthread_mutex_unlock(&q.lock);
	pthread_mutex_lock(&q.out_lock);
	drain_locked_out();
	pthread_mutex_unlock(&q.out_lock);
}

void log_init(log_format fmt)
{
	sigset_t all, old;

	format = fmt;
	if (q.started || !(q.buf = malloc(QUEUE_MAX)) || !(q.spare = malloc(QUEUE_MAX))) {
		free(q.buf);
		q.buf = NULL;
		return; /* every line is written synchronously */
	}
	/* The flusher must never take SIGTERM/SIGINT meant for main's sigwait. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	q.started = pthread_create(&q.thread, NULL, flusher_main, NULL) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (q.started)
		atexit(log_stop);
}

/*
 * "2026-12-04T01:02:03.456Z". The part up to the seconds is formatted once
 * per second per thread (gmtime_r and strftime cost more than the rest of
 * a line); the milliseconds are three digits.
 */
static void now_text(char out[40])
{
	static _Thread_local time_t cached_sec = -1;
	static _Thread_local char cached[32];
	static _Thread_local size_t cached_len;
	struct timespec ts;
	long ms;

	clock_gettime(CLOCK_REALTIME, &ts);
	if (ts.tv_sec != cached_sec) {
		struct tm tm;

		gmtime_r(&ts.tv_sec, &tm);
		cached_len = strftime(cached, sizeof(cached), "%Y-%m-%dT%H:%M:%S", &tm);
		cached_sec = ts.tv_sec;
	}
	ms = ts.tv_nsec / 1000000 % 1000;
	memcpy(out, cached, cached_len);
	out[cached_len] = '.';
	out[cached_len + 1] = (char)('0' + ms / 100);
	out[cached_len + 2] = (char)('0' + ms / 10 % 10);
	out[cached_len + 3] = (char)('0' + ms % 10);
	out[cached_len + 4] = 'Z';
	out[cached_len + 5] = '\0';
}

/* src as printable ASCII into out (always terminated, cut to fit). */
static const char *escape(char *out, size_t size, const char *src)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
		if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
			if (o + 1 >= size)
				break;
			out[o++] = (char)*p;
		} else {
			if (o + 4 >= size)
				break;
			out[o++] = '\\';
			out[o++] = 'x';
			out[o++] = hex[*p >> 4];
			out[o++] = hex[*p & 15];
		}
	}
	out[o] = '\0';
	return out;
}

/* The line of obj (JSON format) or text, with its newline, to the log. */
static void emit(json_t *obj, const char *text, int now)
{
	char *line = NULL, buf[1600];
	const char *s = text;
	size_t n;

	if (format == LOG_JSON && (line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER)))
		s = line;
	n = strlen(s);
	if (n + 1 <= sizeof(buf)) {
		memcpy(buf, s, n);
		buf[n++] = '\n';
		(now ? write_now : enqueue)(buf, n);
	} else {
		char *big = malloc(n + 1);

		if (big) {
			memcpy(big, s, n);
			big[n] = '\n';
			(now ? write_now : enqueue)(big, n + 1);
			free(big);
		}
	}
	free(line);
}

void log_msg(const char *level, const char *fmt, ...)
{
	char ts[40], raw[1024], msg[1024], text[1200];
	json_t *obj = NULL;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(raw, sizeof(raw), fmt, ap);
	va_end(ap);
	escape(msg, sizeof(msg), raw);
	now_text(ts);
	snprintf(text, sizeof(text), "%s %-5s %s", ts, level, msg);
	if (format == LOG_JSON)
		obj = json_pack("{s:s, s:s, s:s}", "ts", ts, "level", level, "msg", msg);
	emit(obj, text, 1);
	json_decref(obj);
}

/* Append s (NUL-terminated) to out at *o, cut to fit size. */
static void put(char *out, size_t size, size_t *o, const char *s)
{
	size_t n = strlen(s);

	if (*o + n >= size)
		n = *o + 1 < size ? size - *o - 1 : 0;
	memcpy(out + *o, s, n);
	*o += n;
	out[*o] = '\0';
}

/* Decimal of v (>= 0) into out at *o, at least min_digits digits. */
static void put_uint(char *out, size_t size, size_t *o, unsigned long long v, int min_digits)
{
	char d[24];
	int i = (int)sizeof(d) - 1;

	d[i] = '\0';
	do {
		d[--i] = (char)('0' + v % 10);
		v /= 10;
		min_digits--;
	} while ((v || min_digits > 0) && i > 0);
	put(out, size, o, d + i);
}

void log_request(const char *request_id, const char *raw_method, const char *route, int status,
                 const char *outcome, double duration_ms)
{
	char ts[40], text[1400], method[64], path[256];
	json_t *obj = NULL;
	size_t o = 0;
	unsigned long long us =
	    duration_ms > 0 ? (unsigned long long)(duration_ms * 1000.0 + 0.5) : 0;

	escape(method, sizeof(method), raw_method);
	escape(path, sizeof(path), route);
	now_text(ts);
	/* "%s info  req=%s %s %s %d %s %.3fms", without printf: with it the
	 * line was 7 % of a replay's own instructions (docs/benchmarks.md) */
	text[0] = '\0';
	put(text, sizeof(text), &o, ts);
	put(text, sizeof(text), &o, " info  req=");
	put(text, sizeof(text), &o, request_id);
	put(text, sizeof(text), &o, " ");
	put(text, sizeof(text), &o, method);
	put(text, sizeof(text), &o, " ");
	put(text, sizeof(text), &o, path);
	put(text, sizeof(text), &o, " ");
	if (status < 0) {
		put(text, sizeof(text), &o, "-");
		status = -status;
	}
	put_uint(text, sizeof(text), &o, (unsigned long long)status, 1);
	put(text, sizeof(text), &o, " ");
	put(text, sizeof(text), &o, outcome);
	put(text, sizeof(text), &o, " ");
	put_uint(text, sizeof(text), &o, us / 1000, 1);
	put(text, sizeof(text), &o, ".");
	put_uint(text, sizeof(text), &o, us % 1000, 3);
	put(text, sizeof(text), &o, "ms");
	if (format == LOG_JSON) /* the text line stands in if this fails */
		obj = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:s, s:f}", "ts", ts, "level",
		                "info", "request_id", request_id, "method", method, "path", path,
		                "status", status, "outcome", outcome, "duration_ms", duration_ms);
	emit(obj, text, 0);
	json_decref(obj);
}
