/*
 * server/log.c: idemd's log lines on stderr, as text or JSON, one line per
 * request. Only what is passed in is printed: callers never pass headers,
 * bodies or keys of merchants, so no secret can reach a log line; requests
 * are logged by their route template (/v1/payments/{id}), never by their
 * path. Every string is escaped first (control bytes, backslash and every
 * byte >= 0x7F as \xHH), so a client's bytes cannot forge a line, move a
 * terminal's cursor, or make a JSON line invalid UTF-8.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

static log_format format = LOG_TEXT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

void log_init(log_format fmt)
{
	format = fmt;
}

static void now_text(char out[40])
{
	struct timespec ts;
	struct tm tm;
	size_t n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(out, 40, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, 40 - n, ".%03ldZ", ts.tv_nsec / 1000000 % 1000);
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

static void emit(json_t *obj, const char *text)
{
	char *line = NULL;

	if (format == LOG_JSON)
		line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
	pthread_mutex_lock(&lock);
	fprintf(stderr, "%s\n", line ? line : text);
	fflush(stderr);
	pthread_mutex_unlock(&lock);
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
	emit(obj, text);
	json_decref(obj);
}

void log_request(const char *request_id, const char *raw_method, const char *route, int status,
                 const char *outcome, double duration_ms)
{
	char ts[40], text[1400], method[64], path[256];
	json_t *obj = NULL;

	escape(method, sizeof(method), raw_method);
	escape(path, sizeof(path), route);
	now_text(ts);
	snprintf(text, sizeof(text), "%s info  req=%s %s %s %d %s %.3fms", ts, request_id, method,
	         path, status, outcome, duration_ms);
	if (format == LOG_JSON)
		obj = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:s, s:f}", "ts", ts, "level",
		                "info", "request_id", request_id, "method", method, "path", path,
		                "status", status, "outcome", outcome, "duration_ms", duration_ms);
	emit(obj, text);
	json_decref(obj);
}
