/*
 * store/netdb.c: the core both server backends (postgres.c, mariadb.c)
 * share, behind a small driver table (idem__netdb_driver, netdb.h): the
 * deadline of the calling thread, the pool of connection slots with a
 * deadline, connections opened lazily and dropped when they broke (or were
 * left inside a transaction), the retry of a stale connection for a read
 * and a BEGIN, transaction framing (a failed or unknown COMMIT is never
 * success), savepoints, the schema version and purge batches, the ping on
 * a connection of its own. Holds no driver types; nothing here may block
 * while holding a pool mutex except on its condition variable.
 */
#include "store/netdb.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/error.h"

static _Thread_local int64_t thread_deadline_us;

void idem__backend_deadline_set(int64_t mono_us)
{
	thread_deadline_us = mono_us > 0 ? mono_us : 0;
}

int64_t idem__backend_deadline(void)
{
	return thread_deadline_us;
}

int64_t idem__net_deadline(int timeout_ms)
{
	int64_t d = thread_deadline_us;

	if (timeout_ms > 0) {
		int64_t own = idem__clock_monotonic_us() + (int64_t)timeout_ms * 1000;

		if (d == 0 || own < d)
			d = own;
	}
	return d;
}

int idem__net_wait_ms(int64_t deadline_us, int cap_ms)
{
	int64_t now, left = -1;

	if (deadline_us > 0) {
		now = idem__clock_monotonic_us();
		left = deadline_us > now ? (deadline_us - now + 999) / 1000 : 0;
	}
	if (cap_ms > 0 && (left < 0 || cap_ms < left))
		left = cap_ms;
	return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

int idem__pool_init(idem__pool *p, int n)
{
	pthread_condattr_t ca;

	memset(p, 0, sizeof(*p));
	if (!(p->free_slots = calloc((size_t)(n > 0 ? n : 1), sizeof(int))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	pthread_mutex_init(&p->mu, NULL);
	/* Deadlines are monotonic: so is the clock the pool waits on. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cv, &ca);
	pthread_condattr_destroy(&ca);
	p->n = n;
	/* Pop order 0, 1, 2...: a lightly used store keeps to its first slots. */
	for (int i = n - 1; i >= 0; i--)
		p->free_slots[p->nfree++] = i;
	return 0;
}

void idem__pool_destroy(idem__pool *p)
{
	if (!p->free_slots)
		return;
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->free_slots);
	memset(p, 0, sizeof(*p));
}

int idem__pool_take(idem__pool *p, int64_t deadline_us)
{
	struct timespec until = {(time_t)(deadline_us / 1000000),
	                         (long)(deadline_us % 1000000) * 1000};
	int slot;

	pthread_mutex_lock(&p->mu);
	while (p->nfree == 0) {
		if (deadline_us <= 0) {
			pthread_cond_wait(&p->cv, &p->mu);
		} else if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT &&
		           p->nfree == 0) {
			pthread_mutex_unlock(&p->mu);
			return idem__error(IDEM_EUNAVAIL,
			                   "no database connection free before the deadline");
		}
	}
	slot = p->free_slots[--p->nfree];
	pthread_mutex_unlock(&p->mu);
	return slot;
}

void idem__pool_give(idem__pool *p, int slot)
{
	pthread_mutex_lock(&p->mu);
	p->free_slots[p->nfree++] = slot;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int idem__parse_int64(const char *s, size_t len, int64_t *out)
{
	char buf[32], *end = NULL;
	long long v;

	if (len == 0 || len >= sizeof(buf))
		return -1;
	memcpy(buf, s, len);
	buf[len] = '\0';
	errno = 0;
	v = strtoll(buf, &end, 10);
	if (errno != 0 || end != buf + len)
		return -1;
	*out = (int64_t)v;
	return 0;
}

/* ---- the shared SQL-network backend core -------------------------------- */

static idem__netconn *conn_at(const idem__backend *be, unsigned char *arr, int i)
{
	return (idem__netconn *)(void *)(arr + (size_t)i * be->drv->conn_size);
}

static void conn_drop(idem__backend *be, idem__netconn *c)
{
	be->drv->disconnect(c);
	c->open = c->broken = c->timed_out = 0;
}

int idem__net_take(idem__backend *be, idem__net_pool kind, int64_t deadline_us, idem__netconn **out,
                   int *fresh)
{
	idem__pool *p = kind == IDEM__NET_WRITER   ? &be->wpool
	                : kind == IDEM__NET_READER ? &be->rpool
	                                           : &be->ppool;
	unsigned char *arr = kind == IDEM__NET_WRITER   ? be->writers
	                     : kind == IDEM__NET_READER ? be->readers
	                                                : be->pinger;
	int i = idem__pool_take(p, deadline_us), rc;
	idem__netconn *c;

	*out = NULL;
	*fresh = 0;
	if (i < 0)
		return i;
	c = conn_at(be, arr, i);
	c->pool = p;
	c->slot = i;
	c->deadline_us = deadline_us;
	if (c->broken)
		conn_drop(be, c);
	if (!c->open) {
		if ((rc = be->drv->connect(be, c)) < 0) {
			conn_drop(be, c);
			c->deadline_us = 0;
			idem__pool_give(p, i);
			return rc;
		}
		c->open = 1;
		*fresh = 1;
	}
	*out = c;
	return 0;
}

void idem__net_give(idem__backend *be, idem__netconn *c)
{
	/* A connection left inside a transaction is out of step: drop it. */
	if (c->open && !c->broken && be->drv->in_transaction(c))
		c->broken = 1;
	if (c->broken)
		conn_drop(be, c);
	c->deadline_us = 0;
	idem__pool_give(c->pool, c->slot);
}

idem__netconn *idem__net_conn_of(idem_txn *txn)
{
	return ((idem__nettxn *)(void *)txn)->c;
}

/* Readers: the writer pool stands in when the store has none. */
static int reader_take(idem__backend *be, int64_t deadline_us, idem__netconn **out, int *fresh)
{
	return idem__net_take(be, be->nreaders == 0 ? IDEM__NET_WRITER : IDEM__NET_READER,
	                      deadline_us, out, fresh);
}

/*
 * A read on a reader. A stale connection (the server restarted since it was
 * last used) is replaced once, transparently: a failed read changed nothing,
 * so running it again on a new connection is safe.
 */
int idem__net_read_query(idem__backend *be, const char *sql, const idem_value *params, int n,
                         idem_row_fn fn, void *ctx)
{
	int64_t deadline = idem__net_deadline(be->opts.request_timeout_ms);
	int rc = 0;

	for (int attempt = 0; attempt < 2; attempt++) {
		idem__netconn *c = NULL;
		int fresh = 0;

		if ((rc = reader_take(be, deadline, &c, &fresh)) < 0)
			return rc;
		rc = be->drv->run(c, sql, params, n, fn, ctx, NULL);
		idem__net_give(be, c);
		if (rc >= 0 || rc != IDEM_EUNAVAIL || fresh)
			break;
	}
	return rc;
}

int idem__net_version_in(idem__backend *be, idem__netconn *c, int *out)
{
	int64_t v = 0;
	int rc = be->drv->run(c, be->drv->version_sql, NULL, 0, idem_row_int, &v, NULL);

	if (rc < 0)
		return rc;
	if (v && (rc = be->drv->run(c, "SELECT coalesce(max(version), 0) FROM idem_schema_version",
	                            NULL, 0, idem_row_int, &v, NULL)) < 0)
		return rc;
	*out = (int)v;
	return 0;
}

int idem__net_schema_version(idem__backend *be, int *out)
{
	idem__netconn *c = NULL;
	int fresh = 0, rc;

	if ((rc = reader_take(be, idem__net_deadline(be->opts.request_timeout_ms), &c, &fresh)) < 0)
		return rc;
	rc = idem__net_version_in(be, c, out);
	idem__net_give(be, c);
	return rc;
}

/*
 * SELECT 1 on the ping's own connection, all of it (waiting for that
 * connection, reconnecting, the answer) within IDEM__NET_PING_MS: /healthz
 * says 503 promptly while every other connection hangs on a frozen server.
 * Its own bound only, never the thread's request deadline: one a request
 * left behind (past) must not fail a ping at once.
 */
int idem__net_ping(idem__backend *be)
{
	int64_t deadline = idem__clock_monotonic_us() + (int64_t)IDEM__NET_PING_MS * 1000;
	idem__netconn *c = NULL;
	int fresh = 0, rc;

	if ((rc = idem__net_take(be, IDEM__NET_PING, deadline, &c, &fresh)) < 0)
		return rc;
	rc = be->drv->run(c, "SELECT 1", NULL, 0, NULL, NULL, NULL);
	idem__net_give(be, c);
	return rc;
}

/*
 * BEGIN on a writer. A connection that went stale while pooled fails its
 * BEGIN; nothing ran on it, so one retry on a new connection is safe and
 * spares the caller an error after the server came back.
 */
int idem__net_txn_begin(idem__backend *be, idem_txn **out)
{
	int64_t deadline = idem__net_deadline(be->opts.request_timeout_ms);
	int rc = 0;

	*out = NULL;
	for (int attempt = 0; attempt < 2; attempt++) {
		idem__netconn *c = NULL;
		int fresh = 0;

		if ((rc = idem__net_take(be, IDEM__NET_WRITER, deadline, &c, &fresh)) < 0)
			return rc;
		rc = be->drv->begin ? be->drv->begin(c, fresh)
		                    : be->drv->simple(c, be->drv->begin_sql, "begin");
		if (rc == 0) {
			*out = &c->txn.base;
			return 0;
		}
		idem__net_give(be, c);
		if (rc != IDEM_EUNAVAIL || fresh)
			break;
	}
	return rc;
}

void idem__net_txn_rollback(idem_txn *txn)
{
	idem__netconn *c = idem__net_conn_of(txn);
	idem__backend *be = c->txn.be;

	if (c->open && !c->broken && be->drv->rollback(c) != 0)
		c->broken = 1;
	idem__net_give(be, c);
}

int idem__net_txn_commit(idem_txn *txn)
{
	idem__netconn *c = idem__net_conn_of(txn);
	int rc;

	if (!c->open || c->broken)
		rc = idem__error(IDEM_EUNAVAIL, "%s: connection lost before commit",
		                 c->txn.be->drv->ops->name);
	else
		rc = c->txn.be->drv->commit(c);
	if (rc < 0) {
		/* Not committed, or lost during COMMIT: its fate is unknown, and it is
		 * reported as an error (unavailable), never as success. */
		idem__net_txn_rollback(txn);
		return rc;
	}
	idem__net_give(c->txn.be, c);
	return 0;
}

static int savepoint_sql(idem_txn *txn, const char *verb, const char *name, int may_defer)
{
	idem__netconn *c = idem__net_conn_of(txn);
	const idem__netdb_driver *drv = c->txn.be->drv;
	char sql[96];
	int rc;

	if (strlen(name) > 64)
		return idem__error(IDEM_EINVAL, "bad savepoint name");
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
			return idem__error(IDEM_EINVAL, "bad savepoint name");
	snprintf(sql, sizeof(sql), "%s %s", verb, name);
	/* SAVEPOINT and RELEASE may go without waiting; ROLLBACK TO always waits. */
	rc = may_defer && drv->defer ? drv->defer(c, sql, verb) : drv->simple(c, sql, verb);
	if (rc < 0 && drv->savepoint_failed)
		rc = drv->savepoint_failed(c, verb, rc);
	return rc;
}

int idem__net_savepoint(idem_txn *txn, const char *name)
{
	return savepoint_sql(txn, "SAVEPOINT", name, 1);
}

int idem__net_release(idem_txn *txn, const char *name)
{
	return savepoint_sql(txn, "RELEASE SAVEPOINT", name, 1);
}

int idem__net_rollback_to(idem_txn *txn, const char *name)
{
	return savepoint_sql(txn, "ROLLBACK TO SAVEPOINT", name, 0);
}

/* One batch through the expires_at index; a live lease is never purged. */
int idem__net_purge_batch(idem__backend *be, int64_t now, int batch, int64_t *deleted)
{
	idem_value p[3] = {IDEM_V_INT(now), IDEM_V_INT(now), IDEM_V_INT(batch)};
	idem_txn *txn = NULL;
	int rc;

	*deleted = 0;
	if ((rc = idem__net_txn_begin(be, &txn)) < 0)
		return rc;
	if ((rc = be->drv->run(idem__net_conn_of(txn), be->drv->purge_sql, p, 3, NULL, NULL,
	                       deleted)) < 0) {
		idem__net_txn_rollback(txn);
		return rc;
	}
	return idem__net_txn_commit(txn);
}

int idem__net_txn_exec(idem_txn *txn, const char *sql, const idem_value *params, int n,
                       int64_t *changes)
{
	idem__netconn *c = idem__net_conn_of(txn);

	return c->txn.be->drv->run(c, sql, params, n, NULL, NULL, changes);
}

int idem__net_txn_query(idem_txn *txn, const char *sql, const idem_value *params, int n,
                        idem_row_fn fn, void *ctx)
{
	idem__netconn *c = idem__net_conn_of(txn);

	return c->txn.be->drv->run(c, sql, params, n, fn, ctx, NULL);
}

void idem__net_close(idem__backend *be)
{
	if (!be)
		return;
	for (int i = 0; be->writers && i < IDEM__NET_WRITERS; i++)
		conn_drop(be, conn_at(be, be->writers, i));
	for (int i = 0; be->readers && i < be->nreaders; i++)
		conn_drop(be, conn_at(be, be->readers, i));
	if (be->pinger)
		conn_drop(be, conn_at(be, be->pinger, 0));
	free(be->writers);
	free(be->readers);
	free(be->pinger);
	idem__pool_destroy(&be->wpool);
	idem__pool_destroy(&be->rpool);
	idem__pool_destroy(&be->ppool);
	if (be->state && be->drv->state_free)
		be->drv->state_free(be->state);
	free(be);
}

int idem__net_open(idem__backend **out, idem_store *store, const idem_store_opts *opts,
                   const idem__netdb_driver *drv, void *state)
{
	idem__backend *be = NULL;
	idem__netconn *c = NULL;
	int fresh = 0, rc;

	*out = NULL;
	if (!(be = calloc(1, sizeof(*be)))) {
		if (drv->state_free)
			drv->state_free(state);
		return idem__error(IDEM_ENOMEM, "out of memory");
	}
	be->drv = drv;
	be->store = store;
	be->opts = *opts;
	be->state = state;
	be->nreaders = opts->read_connections;
	if (!(be->writers = calloc(IDEM__NET_WRITERS, drv->conn_size)) ||
	    !(be->pinger = calloc(1, drv->conn_size)) ||
	    (be->nreaders && !(be->readers = calloc((size_t)be->nreaders, drv->conn_size)))) {
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto done;
	}
	for (int i = 0; i < IDEM__NET_WRITERS; i++) {
		c = conn_at(be, be->writers, i);
		c->txn.base.store = store;
		c->txn.base.ops = drv->ops;
		c->txn.be = be;
		c->txn.c = c;
	}
	for (int i = 0; i < be->nreaders; i++)
		conn_at(be, be->readers, i)->txn.be = be;
	conn_at(be, be->pinger, 0)->txn.be = be;
	if ((rc = idem__pool_init(&be->wpool, IDEM__NET_WRITERS)) < 0 ||
	    (rc = idem__pool_init(&be->rpool, be->nreaders)) < 0 ||
	    (rc = idem__pool_init(&be->ppool, 1)) < 0)
		goto done;
	/* One connection now, so a wrong URL or a down server fails the open. */
	if ((rc = idem__net_take(be, IDEM__NET_WRITER, idem__backend_deadline(), &c, &fresh)) < 0)
		goto done;
	idem__net_give(be, c);
	*out = be;
	be = NULL;
	rc = 0;
done:
	idem__net_close(be);
	return rc;
}
