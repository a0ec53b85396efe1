/*
 * core/batch.c: group commit (DESIGN.md §5). Request threads queue units;
 * a writer thread takes what is queued (up to batch_max, optionally
 * waiting batch_wait_us for more), runs each unit under its own savepoint
 * in one transaction, commits once, and only then hands every unit its
 * answer. One fsync then acknowledges many requests, and no answer leaves
 * before the COMMIT that makes it durable has returned.
 *
 * Why a batch is as safe as a transaction per unit:
 *  - A unit that fails rolls back to its own savepoint; the others keep
 *    their effects. Only errors that belong to the unit's own SQL
 *    (constraint, conflict, invalid) are handled that way; any other error
 *    may have ended the transaction, so the whole batch is rolled back and
 *    every unit is run again in a transaction of its own.
 *  - Two units of one batch with the same key: the second one's INSERT sees
 *    the first one's row in the same transaction, reads it, and answers
 *    REPLAY with the first one's body, delivered after the same COMMIT.
 *  - A failed COMMIT acknowledges nothing: every unit gets the error.
 *    ERETRY (deadlock, serialization, busy) at any point reruns the units
 *    one by one, each with its own retries.
 * Units are routed to writers by a hash of their scope, so all duplicates
 * of a key, and all of one merchant's rows, meet in one writer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/claim_internal.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/rand.h"

/*
 * Which writer a scope's units go to. While any unit of a scope is queued
 * or running, every new one of that scope goes to the same writer: one
 * merchant's rows and every duplicate of a key are then written by one
 * writer, in order, and cannot deadlock across writers (DESIGN.md §5).
 * Once none is, the scope is free to go anywhere. So a scope is bound to a
 * writer from its first unit in flight to its last one's answer: to the
 * writer with the fewest scopes bound when it comes, which spreads busy
 * merchants over the writers, where a hash put two of them on one writer
 * as often as not (one in four for two merchants on four writers: half
 * the throughput on MariaDB, docs/benchmarks.md). One writer: no table.
 */
typedef struct bound {
	struct bound *next; /* in its bucket */
	unsigned hash;
	int writer, units; /* units of the scope queued or running */
	char scope[];
} bound;

#define BOUND_BUCKETS 1024

typedef struct unit {
	struct unit *next;
	idem_request req; /* strings borrowed until done */
	idem__key key;
	char owner[33];
	idem_work_fn work;
	void *ctx;
	idem_done_fn done;
	void *done_ctx;
	idem_result res;
	int rc;
	idem_error err;      /* the detail of rc, taken on the writer thread */
	int64_t queued_us;   /* monotonic time it was queued */
	int64_t deadline_us; /* its request's deadline (monotonic), 0: none */
	int unread;          /* queued without the read before the write */
	struct idem__batch *batch;
	bound *bound; /* its scope's binding to a writer; NULL with one writer */
} unit;

typedef struct {
	idem__batch *b;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unit *head, *tail;
	int queued;
	int stop;
	int started;
	int scopes; /* scopes bound to it: under the batch's block */
} writer;

struct idem__batch {
	idem_store *store;
	int nwriters;
	/* The reaper (reaper_main), when units have a deadline or a queue timeout. */
	pthread_mutex_t rlock;
	pthread_cond_t rcond;
	pthread_t reaper;
	int rinit, rstarted, rstop;
	/* The scopes in flight and their writers (bound), when nwriters > 1. */
	pthread_mutex_t block;
	int binit;
	bound *buckets[BOUND_BUCKETS];
	writer w[];
};

static unsigned scope_hash(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/* Under block: the binding of scope (hash h), or NULL. */
static bound *find_bound(idem__batch *b, const char *scope, unsigned h)
{
	bound *e = b->buckets[h % BOUND_BUCKETS];

	while (e && (e->hash != h || strcmp(e->scope, scope) != 0))
		e = e->next;
	return e;
}

/* u's scope bound to a writer (u->bound, counted); 0, or IDEM_ENOMEM. */
static int bind_scope(idem__batch *b, unit *u)
{
	unsigned h = scope_hash(u->req.scope);
	bound *e;
	size_t n;
	int best = 0;

	pthread_mutex_lock(&b->block);
	if (!(e = find_bound(b, u->req.scope, h))) {
		n = strlen(u->req.scope) + 1;
		if (!(e = malloc(sizeof(*e) + n))) {
			pthread_mutex_unlock(&b->block);
			return idem__error(IDEM_ENOMEM, "out of memory");
		}
		for (int i = 1; i < b->nwriters; i++)
			if (b->w[i].scopes < b->w[best].scopes)
				best = i;
		memcpy(e->scope, u->req.scope, n);
		e->hash = h;
		e->writer = best;
		e->units = 0;
		e->next = b->buckets[h % BOUND_BUCKETS];
		b->buckets[h % BOUND_BUCKETS] = e;
		b->w[best].scopes++;
	}
	e->units++;
	u->bound = e;
	pthread_mutex_unlock(&b->block);
	return 0;
}

/* u is answered: its scope is free to move once it was the last in flight. */
static void unbind_scope(idem__batch *b, unit *u)
{
	bound *e = u->bound, **at;

	pthread_mutex_lock(&b->block);
	if (--e->units == 0) {
		for (at = &b->buckets[e->hash % BOUND_BUCKETS]; *at != e; at = &(*at)->next)
			;
		*at = e->next;
		b->w[e->writer].scopes--;
		free(e);
	}
	pthread_mutex_unlock(&b->block);
	u->bound = NULL;
}

static void deliver(idem_store *s, unit *u)
{
	if (u->rc > 0)
		u->rc = 0;
	if (u->unread && u->rc == 0)
		idem__miss_note(s, u->res.outcome != IDEM_FIRST);
	if (u->bound) /* before done, which may queue this scope's next unit */
		unbind_scope(u->batch, u);
	/* done may read idem_error_last(): give it this unit's, not the batch's last. */
	if (u->rc < 0)
		idem__error_restore(&u->err);
	idem__count(s, u->req.business_type, u->rc, &u->res);
	u->done(u->done_ctx, u->rc, &u->res);
	free(u);
}

/* Errors a unit's own SQL can raise that leave the transaction usable. */
static int unit_local(int rc)
{
	return rc == IDEM_ECONSTRAINT || rc == IDEM_ECONFLICT || rc == IDEM_EINVAL ||
	       rc == IDEM_ENOTFOUND;
}

/* Past its deadline a unit is answered unrun: nothing of it was written. */
static int past_deadline(idem_store *s, unit *u, int64_t now)
{
	if (!u->deadline_us || now < u->deadline_us)
		return 0;
	u->rc = idem__error(IDEM_EUNAVAIL, "request deadline (%d ms) passed before it could run",
	                    s->opts.request_timeout_ms);
	u->err = *idem_error_last();
	idem__store_count_error(s, u->rc);
	return 1;
}

static void run_alone(idem_store *s, unit *u)
{
	idem_result_clear(&u->res);
	if (past_deadline(s, u, idem__clock_monotonic_us()))
		return;
	idem__backend_deadline_set(u->deadline_us);
	u->rc = idem__execute_direct(s, &u->key, &u->req, u->work, u->ctx, &u->res);
	u->err = *idem_error_last();
	idem__backend_deadline_set(0);
}

/*
 * The order units rerun alone in: earliest deadline first (none last),
 * queue order among equals. Each runs until its own deadline at the most,
 * so a unit never waits for one whose deadline is later: in queue order, a
 * request that arrived late but queued early (no reads to wait for) ran
 * first and held the others until its deadline, answering them up to 5 s
 * late after a black hole. Units of one batch were all queued before any
 * ran: any order among them is one the requests could have arrived in.
 */
static void by_deadline(unit **units, int n)
{
	for (int i = 1; i < n; i++) {
		unit *u = units[i];
		int64_t d = u->deadline_us ? u->deadline_us : INT64_MAX;
		int j = i;

		for (; j > 0; j--) {
			int64_t e =
			    units[j - 1]->deadline_us ? units[j - 1]->deadline_us : INT64_MAX;

			if (e <= d)
				break;
			units[j] = units[j - 1];
		}
		units[j] = u;
	}
}

static void run_batch(idem_store *s, unit **units, int n)
{
	idem_txn *txn = NULL;
	int rc, i, alone = 0;

	int64_t deadline = 0;

	if (n == 1) {
		run_alone(s, units[0]);
		deliver(s, units[0]);
		return;
	}
	/* The batch's statements and COMMIT end by its earliest unit's deadline. */
	for (i = 0; i < n; i++)
		if (units[i]->deadline_us && (!deadline || units[i]->deadline_us < deadline))
			deadline = units[i]->deadline_us;
	idem__backend_deadline_set(deadline);
	rc = s->ops->txn_begin(s->be, &txn);
	if (rc < 0) {
		alone = 1;
		goto finish;
	}
	for (i = 0; i < n; i++) {
		unit *u = units[i];

		u->rc = idem__run_unit(txn, &u->key, &u->req, u->owner, u->work, u->ctx, &u->res);
		u->err = *idem_error_last();
		if (u->rc < 0 && !unit_local(u->rc)) {
			s->ops->txn_rollback(txn);
			alone = 1;
			goto finish;
		}
		if (u->rc < 0)
			idem_result_clear(&u->res);
	}
	if ((rc = s->ops->txn_commit(txn)) == IDEM_ERETRY) {
		alone = 1;
	} else if (rc < 0) {
		/* Not committed: nothing of this batch may be acknowledged. */
		idem__store_count_error(s, rc);
		for (i = 0; i < n; i++) {
			idem_result_clear(&units[i]->res);
			units[i]->rc = rc;
			units[i]->err = *idem_error_last();
		}
	} else {
		for (i = 0; i < n; i++)
			if (units[i]->rc == 0)
				idem__cache_after_commit(s, &units[i]->key, &units[i]->req,
				                         &units[i]->res);
	}
finish:
	idem__backend_deadline_set(0);
	if (alone)
		by_deadline(units, n);
	for (i = 0; i < n; i++) {
		if (alone)
			run_alone(s, units[i]);
		deliver(s, units[i]);
	}
}

/*
 * Units that waited in the queue longer than opts.queue_timeout_ms are
 * answered IDEM_EUNAVAIL without running (nothing of them is written, so a
 * retry runs afresh). When the store hangs, each batch waits out its
 * timeout; without this, everything queued behind it would then wait for
 * its own batch in turn, and answers would come minutes late instead of as
 * a prompt 503. Returns how many units are left to run, compacted.
 */
static int stale(idem_store *s, unit *u, int64_t now)
{
	int64_t limit = (int64_t)s->opts.queue_timeout_ms * 1000;

	if (past_deadline(s, u, now))
		return 1;
	if (limit <= 0 || now - u->queued_us <= limit)
		return 0;
	u->rc = idem__error(IDEM_EUNAVAIL,
	                    "waited %lld ms for the store's writer (queue timeout %d ms)",
	                    (long long)((now - u->queued_us) / 1000), s->opts.queue_timeout_ms);
	u->err = *idem_error_last();
	idem__store_count_error(s, u->rc);
	return 1;
}

static int shed_stale(idem_store *s, unit **units, int n)
{
	int64_t now = idem__clock_monotonic_us();
	int kept = 0;

	for (int i = 0; i < n; i++) {
		if (stale(s, units[i], now))
			deliver(s, units[i]);
		else
			units[kept++] = units[i];
	}
	return kept;
}

/*
 * The reaper. A writer sheds what it takes, but while it waits on a batch
 * (up to its earliest unit's deadline: a server that stopped answering)
 * the units queued behind it would learn their fate only when it returns,
 * after their own deadlines: a request whose reads took most of its time
 * and queued behind a batch of later arrivals was answered up to that much
 * late. So every REAP_US this thread takes every queued unit whose deadline
 * or queue timeout passed out of its queue and answers it, unrun: a queued
 * unit has not started (the writer takes units out under the same lock
 * before running any), so nothing of it is written, and each unit is
 * answered exactly once by whoever unlinked it.
 */
#define REAP_US 100000

static void reap(idem__batch *b)
{
	idem_store *s = b->store;

	for (int i = 0; i < b->nwriters; i++) {
		writer *w = &b->w[i];
		unit *gone = NULL, **at, *u;
		int64_t now = idem__clock_monotonic_us();

		pthread_mutex_lock(&w->lock);
		w->tail = NULL;
		for (at = &w->head; (u = *at) != NULL;) {
			if (stale(s, u, now)) {
				*at = u->next;
				w->queued--;
				u->next = gone;
				gone = u;
			} else {
				w->tail = u;
				at = &u->next;
			}
		}
		pthread_mutex_unlock(&w->lock);
		while ((u = gone) != NULL) { /* answered outside the lock: done may queue */
			gone = u->next;
			deliver(s, u);
		}
	}
}

static void *reaper_main(void *arg)
{
	idem__batch *b = arg;

	pthread_mutex_lock(&b->rlock);
	while (!b->rstop) {
		struct timespec until;
		int64_t t;

		pthread_mutex_unlock(&b->rlock);
		reap(b);
		t = idem__clock_monotonic_us() + REAP_US;
		until.tv_sec = (time_t)(t / 1000000);
		until.tv_nsec = (long)(t % 1000000) * 1000;
		pthread_mutex_lock(&b->rlock);
		if (!b->rstop)
			pthread_cond_timedwait(&b->rcond, &b->rlock, &until);
	}
	pthread_mutex_unlock(&b->rlock);
	return NULL;
}

static int reaper_start(idem__batch *b)
{
	pthread_condattr_t ca;

	if (b->store->opts.request_timeout_ms <= 0 && b->store->opts.queue_timeout_ms <= 0)
		return 0; /* nothing ever goes stale in a queue */
	if (pthread_mutex_init(&b->rlock, NULL) != 0)
		return idem__error(IDEM_ENOMEM, "cannot create the group commit reaper's lock");
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* as the deadlines */
	if (pthread_cond_init(&b->rcond, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		pthread_mutex_destroy(&b->rlock);
		return idem__error(IDEM_ENOMEM, "cannot create the group commit reaper's lock");
	}
	pthread_condattr_destroy(&ca);
	b->rinit = 1;
	if (pthread_create(&b->reaper, NULL, reaper_main, b) != 0)
		return idem__error(IDEM_ENOMEM, "cannot start the group commit reaper");
	b->rstarted = 1;
	return 0;
}

static void reaper_stop(idem__batch *b)
{
	if (b->rstarted) {
		pthread_mutex_lock(&b->rlock);
		b->rstop = 1;
		pthread_cond_signal(&b->rcond);
		pthread_mutex_unlock(&b->rlock);
		pthread_join(b->reaper, NULL);
	}
	if (b->rinit) {
		pthread_cond_destroy(&b->rcond);
		pthread_mutex_destroy(&b->rlock);
	}
}

static void *writer_main(void *arg)
{
	writer *w = arg;
	idem_store *s = w->b->store;
	int max = s->opts.batch_max, wait_us = s->opts.batch_wait_us;
	unit **units = calloc((size_t)max, sizeof(unit *)), *one[1];

	if (!units) { /* no memory for a batch: one unit at a time still works */
		units = one;
		max = 1;
	}

	for (;;) {
		unit *u;
		int n = 0;

		pthread_mutex_lock(&w->lock);
		while (!w->head && !w->stop)
			pthread_cond_wait(&w->cond, &w->lock);
		if (!w->head) {
			pthread_mutex_unlock(&w->lock);
			break;
		}
		if (wait_us > 0 && w->queued < max && !w->stop) {
			struct timespec until;

			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += (long)wait_us * 1000;
			until.tv_sec += until.tv_nsec / 1000000000;
			until.tv_nsec %= 1000000000;
			while (w->queued < max && !w->stop &&
			       pthread_cond_timedwait(&w->cond, &w->lock, &until) != ETIMEDOUT)
				;
		}
		while ((u = w->head) && n < max) {
			w->head = u->next;
			w->queued--;
			units[n++] = u;
		}
		if (!w->head)
			w->tail = NULL;
		pthread_mutex_unlock(&w->lock);
		n = shed_stale(s, units, n);
		if (n > 0)
			run_batch(s, units, n);
	}
	if (units != one)
		free(units);
	return NULL;
}

int idem__batch_start_n(idem__batch **out, idem_store *store, int n)
{
	idem__batch *b = NULL;
	int rc = 0;

	*out = NULL;
	if (n < 1 || !(b = calloc(1, sizeof(*b) + (size_t)n * sizeof(writer))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	b->store = store;
	if (pthread_mutex_init(&b->block, NULL) != 0) {
		free(b);
		return idem__error(IDEM_ENOMEM, "cannot create a group commit lock");
	}
	b->binit = 1;
	for (int i = 0; i < n; i++) {
		writer *w = &b->w[i];

		w->b = b;
		if (pthread_mutex_init(&w->lock, NULL) != 0) {
			rc = idem__error(IDEM_ENOMEM, "cannot create a group commit lock");
			goto done;
		}
		if (pthread_cond_init(&w->cond, NULL) != 0) {
			pthread_mutex_destroy(&w->lock);
			rc = idem__error(IDEM_ENOMEM, "cannot create a group commit lock");
			goto done;
		}
		/* From here on stop() tears this writer down, and only these. */
		b->nwriters = i + 1;
		if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
			rc = idem__error(IDEM_ENOMEM, "cannot start group commit writer");
			goto done;
		}
		w->started = 1;
	}
	if ((rc = reaper_start(b)) < 0)
		goto done;
	*out = b;
	b = NULL;
done:
	idem__batch_stop(b);
	return rc;
}

int idem__batch_start(idem__batch **out, idem_store *store)
{
	/* One write transaction at a time (SQLite): more threads would only queue. */
	int n = store->ops->caps & IDEM__CAP_ONE_WRITER ? 1 : store->opts.writers;

	return idem__batch_start_n(out, store, n);
}

int idem__batch_writers(const idem__batch *b)
{
	return b ? b->nwriters : 0;
}

int idem__batch_writer_of(idem__batch *b, const char *scope)
{
	bound *e;
	int w;

	if (!b || b->nwriters < 2)
		return b ? 0 : -1;
	pthread_mutex_lock(&b->block);
	e = find_bound(b, scope, scope_hash(scope));
	w = e ? e->writer : -1;
	pthread_mutex_unlock(&b->block);
	return w;
}

void idem__batch_stop(idem__batch *b)
{
	if (!b)
		return;
	reaper_stop(b); /* first: it walks the writers' queues */
	for (int i = 0; i < b->nwriters; i++) {
		writer *w = &b->w[i];

		if (!w->started)
			continue;
		pthread_mutex_lock(&w->lock);
		w->stop = 1;
		pthread_cond_broadcast(&w->cond);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
	}
	/* nwriters counts the writers whose lock and condition were initialised. */
	for (int i = 0; i < b->nwriters; i++) {
		pthread_mutex_destroy(&b->w[i].lock);
		pthread_cond_destroy(&b->w[i].cond);
	}
	/* Every unit was answered, so every scope unbound: the table is empty. */
	if (b->binit)
		pthread_mutex_destroy(&b->block);
	free(b);
}

int idem__batch_submit(idem__batch *b, const idem_request *req, idem_work_fn work, void *ctx,
                       idem_done_fn done, void *done_ctx, int unread)
{
	unit *u = NULL;
	writer *w;
	int rc;

	if (!(u = calloc(1, sizeof(*u))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	u->req = *req;
	u->batch = b;
	if ((rc = idem__request_key(&u->key, &u->req)) < 0 ||
	    (rc = idem__rand_hex(u->owner, 16)) < 0 ||
	    (b->nwriters > 1 && (rc = bind_scope(b, u)) < 0)) {
		free(u);
		return rc;
	}
	u->work = work;
	u->ctx = ctx;
	u->done = done;
	u->done_ctx = done_ctx;
	u->unread = unread;
	u->queued_us = idem__clock_monotonic_us();
	/* The request's deadline, set by idem_execute_async, else from now. */
	u->deadline_us = idem__backend_deadline();
	if (!u->deadline_us && b->store->opts.request_timeout_ms > 0)
		u->deadline_us = u->queued_us + (int64_t)b->store->opts.request_timeout_ms * 1000;
	w = &b->w[u->bound ? u->bound->writer : 0];
	pthread_mutex_lock(&w->lock);
	if (w->tail)
		w->tail->next = u;
	else
		w->head = u;
	w->tail = u;
	w->queued++;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}
