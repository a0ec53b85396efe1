/*
 * pay/stats.c: idemd's outcome counters, shared through the store so that
 * `idemctl stats` sees every instance. A flusher thread wakes every few
 * seconds, takes the difference between the store's in-memory counters and
 * what it flushed last, and writes it in one transaction: one row per
 * (instance, interval, business type, outcome) with a non-zero count. It
 * must never become a write per request, and a failed flush must not lose
 * counts: the baseline only moves forward after a commit, so the next
 * interval (which starts where the last committed one ended) carries them.
 *
 * Reading sums rows in C rather than with SQL sum(), whose result type
 * differs between the backends (numeric on PostgreSQL).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idem/admin.h"
#include "idem/metrics.h"
#include "pay/internal.h"
#include "util/error.h"
#include "util/rand.h"

/* The counters track at most this many types (core/metrics.c's bound). */
#define MAX_TYPES 64

typedef struct {
	char name[IDEM_TYPE_MAX + 1];
	uint64_t counts[IDEM_OUTCOME_COUNT + 1];
} type_snap;

typedef struct {
	type_snap t[MAX_TYPES];
	int n;
} snapshot;

struct idem_stats_flusher {
	idem_store *store;
	int interval_ms;
	char instance[24];
	pthread_t thread;
	int started;
	pthread_mutex_t lock; /* flushes, stop */
	pthread_cond_t cond;
	int stop;
	snapshot base;   /* what the committed flushes covered */
	int64_t base_at; /* when the last committed interval ended */
};

static const char *outcome_label(int o)
{
	return o == IDEM_COUNT_ERROR ? "error" : idem_outcome_name((idem_outcome)o);
}

static void snap_fn(void *ctx, const char *type, const uint64_t counts[IDEM_OUTCOME_COUNT + 1])
{
	snapshot *s = ctx;

	if (s->n >= MAX_TYPES)
		return;
	snprintf(s->t[s->n].name, sizeof(s->t[s->n].name), "%s", type);
	memcpy(s->t[s->n].counts, counts, sizeof(s->t[s->n].counts));
	s->n++;
}

static const type_snap *snap_find(const snapshot *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (strcmp(s->t[i].name, name) == 0)
			return &s->t[i];
	return NULL;
}

typedef struct {
	idem_stats_flusher *f;
	const snapshot *now;
	int64_t start, end;
} flush_ctx;

static int write_rows(idem_txn *txn, void *arg)
{
	flush_ctx *c = arg;
	int rc = 0;

	for (int i = 0; i < c->now->n && rc == 0; i++) {
		const type_snap *cur = &c->now->t[i], *old = snap_find(&c->f->base, cur->name);

		for (int o = 0; o <= IDEM_OUTCOME_COUNT && rc == 0; o++) {
			uint64_t d = cur->counts[o] - (old ? old->counts[o] : 0);
			idem_value p[6];

			if (d == 0)
				continue;
			p[0] = IDEM_V_TEXT(c->f->instance);
			p[1] = IDEM_V_INT(c->start);
			p[2] = IDEM_V_INT(c->end);
			p[3] = IDEM_V_TEXT(cur->name);
			p[4] = IDEM_V_TEXT(outcome_label(o));
			p[5] = IDEM_V_INT((int64_t)d);
			rc = idem_txn_exec(txn,
			                   "INSERT INTO idem_stats (instance_id, interval_start,"
			                   " interval_end, business_type, outcome, n)"
			                   " VALUES (?, ?, ?, ?, ?, ?)",
			                   p, 6, NULL);
		}
	}
	return rc;
}

/* Call with f->lock held. */
static int flush_locked(idem_stats_flusher *f)
{
	snapshot *now = calloc(1, sizeof(*now));
	flush_ctx c;
	int rc = 0, changed = 0;

	if (!now)
		return idem__error(IDEM_ENOMEM, "out of memory");
	idem_metrics_each(f->store, snap_fn, now);
	for (int i = 0; i < now->n && !changed; i++) {
		const type_snap *old = snap_find(&f->base, now->t[i].name);

		changed = !old || memcmp(old->counts, now->t[i].counts, sizeof(old->counts)) != 0;
	}
	c.f = f;
	c.now = now;
	c.start = f->base_at;
	c.end = idem_store_now(f->store);
	if (c.end <= c.start)
		c.end = c.start + 1; /* keys (instance, start) stay unique */
	if (changed && (rc = idem_store_transact(f->store, write_rows, &c)) == 0) {
		f->base = *now;
		f->base_at = c.end;
	} else if (!changed) {
		f->base_at = c.end; /* an idle interval needs no row */
	}
	free(now);
	return rc;
}

int idem_stats_flusher_flush(idem_stats_flusher *f)
{
	int rc;

	IDEM__ASSERT_ARG(f);
	pthread_mutex_lock(&f->lock);
	rc = flush_locked(f);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

static void *flusher_main(void *arg)
{
	idem_stats_flusher *f = arg;

	pthread_mutex_lock(&f->lock);
	while (!f->stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += f->interval_ms / 1000;
		ts.tv_nsec += (long)(f->interval_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		while (!f->stop && pthread_cond_timedwait(&f->cond, &f->lock, &ts) != ETIMEDOUT)
			;
		if (!f->stop)
			(void)flush_locked(f); /* on failure the counts wait for the next one */
	}
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

int idem_stats_flusher_start(idem_stats_flusher **out, idem_store *store,
                             const idem_stats_flusher_opts *opts)
{
	idem_stats_flusher_opts defaults = IDEM_STATS_FLUSHER_OPTS_INIT;
	idem_stats_flusher *f = NULL;
	char hex[17];
	int rc;

	IDEM__ASSERT_ARG(out);
	*out = NULL;
	IDEM__ASSERT_ARG(store);
	if (!opts)
		opts = &defaults;
	if (opts->version != IDEM_STATS_FLUSHER_OPTS_VERSION || opts->interval_ms < 50 ||
	    opts->interval_ms > 3600000)
		return idem__error(IDEM_EINVAL, "idem_stats_flusher_opts out of range");
	if ((rc = idem__rand_hex(hex, 8)) < 0)
		return rc;
	if (!(f = calloc(1, sizeof(*f))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	f->store = store;
	f->interval_ms = opts->interval_ms;
	snprintf(f->instance, sizeof(f->instance), "i_%s", hex);
	f->base_at = idem_store_now(store);
	/* Counts from before the flusher started are this instance's too. */
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	if (pthread_create(&f->thread, NULL, flusher_main, f) != 0) {
		pthread_cond_destroy(&f->cond);
		pthread_mutex_destroy(&f->lock);
		free(f);
		return idem__error(IDEM_ESTORE, "cannot start the stats flusher thread");
	}
	f->started = 1;
	*out = f;
	return 0;
}

const char *idem_stats_flusher_instance(const idem_stats_flusher *f)
{
	IDEM__ASSERT_ARG_WITH_RETVAL(f, "");
	return f->instance;
}

void idem_stats_flusher_stop(idem_stats_flusher *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->lock);
	f->stop = 1;
	pthread_cond_signal(&f->cond);
	pthread_mutex_unlock(&f->lock);
	if (f->started)
		pthread_join(f->thread, NULL);
	(void)idem_stats_flusher_flush(f);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

/* ---- reading ------------------------------------------------------------ */

typedef struct {
	idem_stats_report *r;
	char (*inst)[64]; /* distinct instances seen, bounded */
	int ninst, cap;
} read_ctx;

static idem_stats_type *type_of(idem_stats_report *r, const char *name)
{
	idem_stats_type *t;
	size_t i = 0;

	while (i < r->ntypes && strcmp(r->types[i].business_type, name) < 0)
		i++;
	if (i < r->ntypes && strcmp(r->types[i].business_type, name) == 0)
		return &r->types[i];
	if (r->ntypes >= 1024)
		return NULL;
	t = realloc(r->types, (r->ntypes + 1) * sizeof(*t));
	if (!t)
		return NULL;
	r->types = t;
	memmove(&t[i + 1], &t[i], (r->ntypes - i) * sizeof(*t));
	memset(&t[i], 0, sizeof(*t));
	snprintf(t[i].business_type, sizeof(t[i].business_type), "%s", name);
	r->ntypes++;
	return &t[i];
}

static int counter_row(void *arg, const idem_value *cols, int n)
{
	read_ctx *c = arg;
	char inst[64], type[IDEM_TYPE_MAX + 1], outcome[24];
	idem_stats_type *t;
	int o;

	if (n != 4)
		return idem__error(IDEM_ESTORE, "stats row has %d columns", n);
	pay__col_text(inst, sizeof(inst), &cols[0]);
	pay__col_text(type, sizeof(type), &cols[1]);
	pay__col_text(outcome, sizeof(outcome), &cols[2]);
	if (!(t = type_of(c->r, type)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	for (o = 0; o <= IDEM_OUTCOME_COUNT; o++)
		if (strcmp(outcome, outcome_label(o)) == 0)
			break;
	if (o <= IDEM_OUTCOME_COUNT)
		t->outcomes[o] += cols[3].i;
	for (int i = 0; i < c->ninst; i++)
		if (strcmp(c->inst[i], inst) == 0)
			return 0;
	if (c->ninst < c->cap)
		snprintf(c->inst[c->ninst++], 64, "%s", inst);
	return 0;
}

static int status_row(void *arg, const idem_value *cols, int n)
{
	read_ctx *c = arg;
	char type[IDEM_TYPE_MAX + 1], status[24];
	idem_stats_type *t;

	if (n != 3)
		return idem__error(IDEM_ESTORE, "record count row has %d columns", n);
	pay__col_text(type, sizeof(type), &cols[0]);
	pay__col_text(status, sizeof(status), &cols[1]);
	if (!(t = type_of(c->r, type)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	if (strcmp(status, "PROCESSING") == 0)
		t->processing += cols[2].i;
	else if (strcmp(status, "SUCCEEDED") == 0)
		t->succeeded += cols[2].i;
	else if (strcmp(status, "FAILED") == 0)
		t->failed += cols[2].i;
	return 0;
}

int idem_stats_read(idem_stats_report *out, idem_store *store, int64_t window_ms)
{
	read_ctx c = {out, NULL, 0, 4096};
	idem_value p[1];
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(store);
	if (window_ms <= 0)
		return idem__error(IDEM_EINVAL, "stats window must be positive");
	out->window_ms = window_ms;
	if (!(c.inst = calloc((size_t)c.cap, sizeof(*c.inst))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	p[0] = IDEM_V_INT(idem_store_now(store) - window_ms);
	rc = idem_store_query(store,
	                      "SELECT instance_id, business_type, outcome, n FROM idem_stats"
	                      " WHERE interval_end > ?",
	                      p, 1, counter_row, &c);
	if (rc == 0)
		rc = idem_store_query(store,
		                      "SELECT business_type, status, count(*) FROM idem_records"
		                      " GROUP BY business_type, status",
		                      NULL, 0, status_row, &c);
	if (rc == 0) {
		for (size_t i = 0; i < out->ntypes; i++) {
			const int64_t *o = out->types[i].outcomes;
			int64_t dups = o[IDEM_REPLAY] + o[IDEM_IN_PROGRESS] + o[IDEM_MISMATCH];

			out->requests += o[IDEM_FIRST] + dups;
			out->duplicates += dups;
			out->errors += o[IDEM_COUNT_ERROR];
		}
		out->instances = c.ninst;
	}
	free(c.inst);
	return rc;
}

void idem_stats_report_clear(idem_stats_report *r)
{
	if (!r)
		return;
	free(r->types);
	memset(r, 0, sizeof(*r));
}

typedef struct {
	int64_t before;
	int64_t deleted;
} prune_ctx;

static int prune(idem_txn *txn, void *arg)
{
	prune_ctx *c = arg;
	idem_value p[1] = {IDEM_V_INT(c->before)};

	return idem_txn_exec(txn, "DELETE FROM idem_stats WHERE interval_end < ?", p, 1,
	                     &c->deleted);
}

int idem_stats_prune(idem_store *store, int64_t keep_ms, int64_t *deleted_out)
{
	prune_ctx c = {0, 0};
	int rc;

	if (deleted_out)
		*deleted_out = 0;
	IDEM__ASSERT_ARG(store);
	if (keep_ms <= 0)
		return idem__error(IDEM_EINVAL, "stats retention must be positive");
	c.before = idem_store_now(store) - keep_ms;
	if ((rc = idem_store_transact(store, prune, &c)) == 0 && deleted_out)
		*deleted_out = c.deleted;
	return rc;
}
