/*
 * server/metrics.c: request latency histogram, the duplicate ratio over a
 * sliding window, and the Prometheus text rendering of everything,
 * including the library's per-type outcome counters. Observing a request
 * costs a few atomic adds and one short mutex hold; nothing touches the
 * database.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

#define WINDOW_SECONDS  60
#define WARN_RATIO      0.05
#define WARN_MIN_CLAIMS 20

static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                0.1,    0.25,  0.5,    1.0,   2.5,  5.0};
#define NBOUNDS (sizeof(bounds) / sizeof(bounds[0]))

static _Atomic uint64_t buckets[NBOUNDS + 1];
static _Atomic uint64_t sum_us, count;

static struct {
	pthread_mutex_t lock;
	int64_t second[WINDOW_SECONDS];
	uint64_t claims[WINDOW_SECONDS], dups[WINDOW_SECONDS];
	int64_t last_warn;
} win = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

/* Sum the window; call with the lock held. */
static void window_sum(int64_t now, uint64_t *claims, uint64_t *dups)
{
	*claims = *dups = 0;
	for (int i = 0; i < WINDOW_SECONDS; i++)
		if (now - win.second[i] < WINDOW_SECONDS) {
			*claims += win.claims[i];
			*dups += win.dups[i];
		}
}

void metrics_observe(double seconds, int claimed, int duplicate)
{
	size_t b = 0;

	while (b < NBOUNDS && seconds > bounds[b])
		b++;
	atomic_fetch_add_explicit(&buckets[b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&sum_us, (uint64_t)(seconds * 1e6), memory_order_relaxed);
	atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
	if (!claimed)
		return;

	int64_t now = now_s();
	int slot = (int)(now % WINDOW_SECONDS);
	uint64_t claims, dups;
	int warn = 0;

	pthread_mutex_lock(&win.lock);
	if (win.second[slot] != now) {
		win.second[slot] = now;
		win.claims[slot] = win.dups[slot] = 0;
	}
	win.claims[slot]++;
	win.dups[slot] += duplicate != 0;
	window_sum(now, &claims, &dups);
	/* DESIGN.md §8: warn above 5 %, at most once a minute. */
	if (claims >= WARN_MIN_CLAIMS && (double)dups / (double)claims > WARN_RATIO &&
	    now - win.last_warn >= 60) {
		win.last_warn = now;
		warn = 1;
	}
	pthread_mutex_unlock(&win.lock);
	if (warn)
		log_msg("warn",
		        "duplicate ratio %.1f%% over the last %ds (%llu of %llu claims) is above "
		        "%.0f%%: check clients' retry behaviour",
		        100.0 * (double)dups / (double)claims, WINDOW_SECONDS,
		        (unsigned long long)dups, (unsigned long long)claims, WARN_RATIO * 100);
}

double metrics_duplicate_ratio(uint64_t *claims_out)
{
	uint64_t claims, dups;

	pthread_mutex_lock(&win.lock);
	window_sum(now_s(), &claims, &dups);
	pthread_mutex_unlock(&win.lock);
	if (claims_out)
		*claims_out = claims;
	return claims ? (double)dups / (double)claims : 0.0;
}

/* A growing text buffer with a hard cap. */
typedef struct {
	char *p;
	size_t len, cap;
	int failed;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->failed)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->failed = 1;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap * 2;
		char *p = cap <= (1u << 24) ? realloc(b->p, cap) : NULL;

		if (!p) {
			b->failed = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

static void put_type(void *ctx, const char *type, const uint64_t c[IDEM_OUTCOME_COUNT + 1])
{
	buf *b = ctx;

	for (int o = IDEM_FIRST; o <= IDEM_OUTCOME_COUNT; o++)
		put(b, "idem_requests_total{business_type=\"%s\",outcome=\"%s\"} %llu\n", type,
		    idem_outcome_name((idem_outcome)o), (unsigned long long)c[o]);
	put(b, "idem_requests_total{business_type=\"%s\",outcome=\"error\"} %llu\n", type,
	    (unsigned long long)c[IDEM_COUNT_ERROR]);
}

int metrics_render(char **out, size_t *len, idem_store *store)
{
	buf b = {malloc(8192), 0, 8192, 0};
	uint64_t claims = 0, cum = 0;
	double ratio = metrics_duplicate_ratio(&claims);

	*out = NULL;
	*len = 0;
	if (!b.p)
		return -1;
	put(&b, "# HELP idem_requests_total Claims by business type and outcome.\n"
	        "# TYPE idem_requests_total counter\n");
	idem_metrics_each(store, put_type, &b);
	put(&b,
	    "# HELP idem_duplicate_ratio Share of claims in the last %d s that were "
	    "duplicates (replay, in progress, mismatch).\n"
	    "# TYPE idem_duplicate_ratio gauge\nidem_duplicate_ratio %.6f\n",
	    WINDOW_SECONDS, ratio);
	put(&b,
	    "# HELP idem_duplicate_window_claims Claims in the duplicate-ratio window.\n"
	    "# TYPE idem_duplicate_window_claims gauge\nidem_duplicate_window_claims %llu\n",
	    (unsigned long long)claims);
	put(&b, "# HELP idem_request_duration_seconds HTTP request latency.\n"
	        "# TYPE idem_request_duration_seconds histogram\n");
	for (size_t i = 0; i <= NBOUNDS; i++) {
		cum += atomic_load_explicit(&buckets[i], memory_order_relaxed);
		if (i < NBOUNDS)
			put(&b, "idem_request_duration_seconds_bucket{le=\"%g\"} %llu\n", bounds[i],
			    (unsigned long long)cum);
		else
			put(&b, "idem_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
			    (unsigned long long)cum);
	}
	put(&b,
	    "idem_request_duration_seconds_sum %.6f\nidem_request_duration_seconds_count %llu\n",
	    (double)atomic_load(&sum_us) / 1e6, (unsigned long long)atomic_load(&count));
	put(&b, "# HELP idem_store_errors_total Store errors by class.\n"
	        "# TYPE idem_store_errors_total counter\n");
	for (int c = IDEM_ECLASS_RETRYABLE; c <= IDEM_ECLASS_OTHER; c++)
		put(&b, "idem_store_errors_total{class=\"%s\"} %llu\n",
		    idem_error_class_name((idem_error_class)c),
		    (unsigned long long)idem_metrics_store_errors(store, (idem_error_class)c));
	{
		idem_cache_stats cs;

		idem_metrics_cache(store, &cs);
		put(&b,
		    "# HELP idem_cache_hits_total Duplicates answered from the front cache.\n"
		    "# TYPE idem_cache_hits_total counter\nidem_cache_hits_total %llu\n"
		    "# HELP idem_cache_misses_total Front cache lookups that found nothing.\n"
		    "# TYPE idem_cache_misses_total counter\nidem_cache_misses_total %llu\n"
		    "# HELP idem_cache_evictions_total Entries evicted to keep the caps.\n"
		    "# TYPE idem_cache_evictions_total counter\nidem_cache_evictions_total %llu\n"
		    "# HELP idem_cache_entries Entries in the front cache.\n"
		    "# TYPE idem_cache_entries gauge\nidem_cache_entries %llu\n"
		    "# HELP idem_cache_bytes Bytes held by the front cache.\n"
		    "# TYPE idem_cache_bytes gauge\nidem_cache_bytes %llu\n",
		    (unsigned long long)cs.hits, (unsigned long long)cs.misses,
		    (unsigned long long)cs.evictions, (unsigned long long)cs.entries,
		    (unsigned long long)cs.bytes);
	}
	put(&b,
	    "# HELP idem_records_purged_total Expired idempotency records deleted.\n"
	    "# TYPE idem_records_purged_total counter\nidem_records_purged_total %llu\n",
	    (unsigned long long)idem_metrics_purged(store));
	if (b.failed) {
		free(b.p);
		return -1;
	}
	*out = b.p;
	*len = b.len;
	return 0;
}
