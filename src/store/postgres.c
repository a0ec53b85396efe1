/*
 * store/postgres.c: the PostgreSQL dialect driver, on libpq, behind the
 * shared server-backend core (netdb.c: pools, deadlines, stale-connection
 * retries, transaction framing, savepoints, schema version, purge). Here:
 * connecting, talking to the server, the claim INSERT, migrations under an
 * advisory lock; error classification, statement text, parameters and
 * result conversion are in postgres_sql.c (postgres_int.h between them).
 *
 * Statements are prepared once per connection, keyed by their SQL text; the
 * generic `?` placeholders are rewritten to $1..$n on the way. Every session
 * runs READ COMMITTED with lock_timeout = busy_timeout_ms. No call waits for
 * the server longer than busy_timeout_ms + 10 s, nor past its connection's
 * deadline (netdb.h): libpq runs non-blocking here (PQconnectPoll, PQsend*
 * + poll), so a server that stops answering (SIGSTOP, a dead link) makes the
 * call fail as unavailable and the core drops its connection, instead of
 * hanging the caller.
 *
 * Error classification is exact. The claim is INSERT ... ON CONFLICT
 * (scope, business_type, idem_key) DO NOTHING RETURNING id: a row back means
 * the INSERT won, no row means the key exists (the INSERT waited for a
 * concurrent claimer to finish first), and every other failure raises.
 * 40001, 40P01 and 55P03 mean "retry"; 23505 in business SQL a business
 * conflict; other class 23 states constraint violations; class 08 and
 * 57P01..57P03 "store unavailable". Nothing else is ever a duplicate.
 *
 * Write transactions run in libpq's pipeline mode (from BEGIN to COMMIT or
 * ROLLBACK): statements whose answer nobody waits for (BEGIN, SAVEPOINT,
 * RELEASE, the completion UPDATE of a record the transaction claimed) are
 * only queued, and go to the server with the next statement that waits,
 * in one write and one round trip, each wait ending in a Sync. An error in
 * a queued statement makes the server skip the rest up to that Sync, so
 * the statement that waits reports it (classified as the queued one's)
 * and COMMIT is never run after it: it fails, and nothing is acknowledged.
 *
 * A failed statement aborts a whole PostgreSQL transaction, but idem's
 * contract is that a failed business statement leaves the unit's
 * transaction usable, so each business statement runs inside its own
 * savepoint. This file must never print or read the environment: libpq's
 * notices are swallowed, and the URL (it may hold a password) is never put
 * into an error message.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/netdb.h"
#include "store/postgres_int.h"
#include "store/schema.h"
#include "util/clock.h"
#include "util/error.h"

/* ---- talking to the server ------------------------------------------ */

/*
 * Collect the result of what was just sent on c, waiting at most the
 * connection's I/O bound. libpq's blocking calls would wait forever for a
 * stopped server. Returns the first error result, else the last result, or
 * NULL when nothing usable came back (c->base.broken is then set). sent is the
 * return value of the PQsend* call.
 */
/* The bound of a wait starting now: the I/O bound, or the connection's deadline. */
static int64_t io_deadline(const conn *c)
{
	int64_t deadline = idem__clock_monotonic_us() + (int64_t)c->io_timeout_ms * 1000;

	if (c->base.deadline_us > 0 && c->base.deadline_us < deadline)
		deadline = c->base.deadline_us;
	return deadline;
}

/* Wait until PQgetResult will not block: 0, or -1 with c broken (timed out). */
static int wait_ready(conn *c, int64_t deadline)
{
	while (PQisBusy(c->pg)) {
		struct pollfd pfd = {PQsocket(c->pg), POLLIN, 0};
		int64_t left = deadline - idem__clock_monotonic_us();
		int n;

		if (left <= 0) {
			c->base.broken = c->base.timed_out = 1;
			return -1;
		}
		n = poll(&pfd, 1, (int)((left + 999) / 1000));
		if (n < 0 && errno != EINTR) {
			c->base.broken = 1;
			return -1;
		}
		if (n > 0 && !PQconsumeInput(c->pg)) {
			c->base.broken = 1;
			return -1;
		}
	}
	return 0;
}

/*
 * In pipeline mode: send a Sync and read every answer up to it, those of the
 * queued statements first, then (current) that of the statement just sent.
 * Returns the first error (c->failed_kind says when a queued statement's),
 * else the current statement's result; NULL when nothing usable came back
 * (c broken) or, without current, when every queued statement succeeded.
 */
static PGresult *await_pipeline(conn *c, int64_t deadline, int current)
{
	int nq = c->ndeferred + (current ? 1 : 0), idx = 0;
	PGresult *res = NULL, *r;

	if (!PQpipelineSync(c->pg)) {
		c->base.broken = 1;
		return NULL;
	}
	for (;;) {
		ExecStatusType st;

		if (wait_ready(c, deadline) < 0)
			break;
		if (!(r = PQgetResult(c->pg))) {
			/* The end of one statement's answers; the Sync's has no NULL. */
			if (++idx > nq || PQstatus(c->pg) == CONNECTION_BAD) {
				c->base.broken = 1;
				break;
			}
			continue;
		}
		if ((st = PQresultStatus(r)) == PGRES_PIPELINE_SYNC) {
			PQclear(r);
			c->ndeferred = 0;
			return res;
		}
		if (res && PQresultStatus(res) == PGRES_FATAL_ERROR) {
			PQclear(r); /* skipped after the error (PIPELINE_ABORTED) */
		} else if (st == PGRES_FATAL_ERROR || (current && idx >= c->ndeferred)) {
			if (st == PGRES_FATAL_ERROR && idx < c->ndeferred) {
				c->failed_kind = c->deferred[idx].kind;
				c->failed_what = c->deferred[idx].what;
			}
			PQclear(res);
			res = r;
		} else {
			PQclear(r); /* a queued statement's success */
		}
	}
	c->ndeferred = 0;
	PQclear(res);
	return NULL;
}

/*
 * Collect the result of what was just sent on c, waiting at most the
 * connection's I/O bound. libpq's blocking calls would wait forever for a
 * stopped server. Returns the first error result, else the last result, or
 * NULL when nothing usable came back (c->base.broken is then set). sent is the
 * return value of the PQsend* call.
 */
static PGresult *await(conn *c, int sent)
{
	int64_t deadline = io_deadline(c);
	PGresult *res = NULL, *r;

	c->failed_kind = 0;
	if (!sent) {
		c->base.broken = 1;
		return NULL;
	}
	if (c->piped)
		return await_pipeline(c, deadline, 1);
	for (;;) {
		if (wait_ready(c, deadline) < 0) {
			PQclear(res);
			return NULL;
		}
		if (!(r = PQgetResult(c->pg)))
			break;
		if (res && PQresultStatus(res) == PGRES_FATAL_ERROR) {
			PQclear(r);
		} else {
			PQclear(res);
			res = r;
		}
	}
	return res;
}

/*
 * A statement without parameters (outside pipeline mode also a few,
 * ';'-separated), bounded in time.
 */
static PGresult *exec_text(conn *c, const char *sql)
{
	if (c->piped)
		return await(c, PQsendQueryParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0));
	return await(c, PQsendQuery(c->pg, sql));
}

/* ---- statements ------------------------------------------------------ */

/*
 * Find or prepare sql on c. *slot is the cache index, or -1 when the cache
 * is full: then *oneoff holds the rewritten SQL to run unprepared.
 */
static int prepare(conn *c, const char *sql, int n, int *slot, char **oneoff)
{
	char *text = NULL, name[16];
	PGresult *res = NULL;
	int nparams = 0, rc;

	*slot = -1;
	*oneoff = NULL;
	for (int i = 0; i < c->ncache; i++)
		if (strcmp(c->cache[i].sql, sql) == 0) {
			if (c->cache[i].nparams != n)
				return idem__error(IDEM_EINVAL,
				                   "statement takes %d parameters, %d given",
				                   c->cache[i].nparams, n);
			*slot = i;
			return 0;
		}
	if ((rc = idem__pg_rewrite(sql, &text, &nparams)) < 0)
		return rc;
	if (nparams != n) {
		rc =
		    idem__error(IDEM_EINVAL, "statement takes %d parameters, %d given", nparams, n);
		goto done;
	}
	if (c->ncache == STMT_CACHE) {
		*oneoff = text;
		text = NULL;
		rc = 0;
		goto done;
	}
	snprintf(name, sizeof(name), "idem_%d", c->ncache);
	res = await(c, PQsendPrepare(c->pg, name, text, 0, NULL));
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = idem__pg_fail(c, res, CTX_BUSINESS, "prepare");
		goto done;
	}
	if (!(c->cache[c->ncache].sql = strdup(sql))) {
		/* The server keeps "idem_<n>"; drop the connection to stay in step. */
		c->base.broken = 1;
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto done;
	}
	c->cache[c->ncache].nparams = n;
	*slot = c->ncache++;
	rc = 0;
done:
	PQclear(res);
	free(text);
	return rc;
}

/*
 * Run sql on c with params; call fn per row; report changes. The one place
 * a statement with parameters is executed, so every path gets the same
 * classification.
 */
static int run(conn *c, const char *sql, const idem_value *params, int n, idem_row_fn fn, void *ctx,
               int64_t *changes, err_ctx ectx)
{
	PGresult *res = NULL;
	char *oneoff = NULL, name[16];
	bound b = {0};
	int slot = -1, rc;
	ExecStatusType st;

	if (!c->pg || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "postgresql: connection lost");
	if ((rc = idem__pg_bind_params(&b, params, n)) < 0)
		return rc;
	if ((rc = prepare(c, sql, n, &slot, &oneoff)) < 0)
		goto done;
	if (slot >= 0) {
		snprintf(name, sizeof(name), "idem_%d", slot);
		res = await(c,
		            PQsendQueryPrepared(c->pg, name, n, b.values, b.lengths, b.formats, 0));
	} else {
		res = await(c, PQsendQueryParams(c->pg, oneoff, n, NULL, b.values, b.lengths,
		                                 b.formats, 0));
	}
	st = PQresultStatus(res);
	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
		rc = idem__pg_fail(c, res, ectx, "statement");
		goto done;
	}
	if ((rc = idem__pg_deliver_rows(res, fn, ctx)) < 0)
		goto done;
	if (changes) {
		const char *t = PQcmdTuples(res);
		int64_t v = 0;

		*changes = idem__parse_int64(t, strlen(t), &v) == 0 ? v : 0;
	}
done:
	PQclear(res);
	free(oneoff);
	idem__pg_bound_free(&b);
	return rc;
}

/* A statement without parameters or rows (BEGIN, SAVEPOINT, DDL scripts). */
static int simple(conn *c, const char *sql, const char *what)
{
	PGresult *res;
	int rc = 0;

	if (!c->pg || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "postgresql: connection lost");
	res = exec_text(c, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = idem__pg_fail(c, res, CTX_PLAIN, what);
	PQclear(res);
	return rc;
}

/* ---- pipelining ------------------------------------------------------ */

/*
 * Read the answers of every queued statement now (a Sync, one round trip):
 * 0, or the first one's error, classified. Before the queue overflows.
 */
static int drain(conn *c)
{
	PGresult *res;
	int rc = 0;

	if (!c->piped || c->ndeferred == 0)
		return 0;
	c->failed_kind = 0;
	res = await_pipeline(c, io_deadline(c), 0);
	if (res || c->base.broken)
		rc = idem__pg_fail(c, res, CTX_PLAIN, "statement");
	PQclear(res);
	return rc;
}

/* Note a statement just queued (sent is its PQsend* call's answer). */
static int queued(conn *c, int sent, def_kind kind, const char *what)
{
	if (!sent) {
		c->base.broken = 1;
		return idem__pg_fail(c, NULL, CTX_PLAIN, what);
	}
	c->deferred[c->ndeferred].kind = kind;
	c->deferred[c->ndeferred].what = what;
	c->ndeferred++;
	return 0;
}

/* A statement without parameters or rows, queued in pipeline mode. */
static int defer_text(conn *c, const char *sql, const char *what)
{
	int rc;

	if (!c->pg || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "postgresql: connection lost");
	if (!c->piped)
		return simple(c, sql, what);
	if (c->ndeferred == MAX_DEFERRED && (rc = drain(c)) < 0)
		return rc;
	return queued(c, PQsendQueryParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0), DEF_PLAIN,
	              what);
}

/* A prepared statement with parameters, queued: its rows are never read. */
static int defer_run(conn *c, const char *sql, const idem_value *params, int n, def_kind kind,
                     const char *what)
{
	char *oneoff = NULL, name[16];
	bound b = {0};
	int slot = -1, rc;

	if (!c->pg || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "postgresql: connection lost");
	if (c->ndeferred == MAX_DEFERRED && (rc = drain(c)) < 0)
		return rc;
	if ((rc = idem__pg_bind_params(&b, params, n)) < 0)
		return rc;
	if ((rc = prepare(c, sql, n, &slot, &oneoff)) < 0)
		goto done;
	if (slot >= 0) {
		snprintf(name, sizeof(name), "idem_%d", slot);
		rc = queued(c,
		            PQsendQueryPrepared(c->pg, name, n, b.values, b.lengths, b.formats, 0),
		            kind, what);
	} else {
		rc = queued(
		    c, PQsendQueryParams(c->pg, oneoff, n, NULL, b.values, b.lengths, b.formats, 0),
		    kind, what);
	}
done:
	free(oneoff);
	idem__pg_bound_free(&b);
	return rc;
}

/* Leave pipeline mode once a transaction ended (every answer read). */
static void pipe_leave(conn *c)
{
	if (!c->piped || c->base.broken)
		return;
	if (c->ndeferred == 0 && PQexitPipelineMode(c->pg))
		c->piped = 0;
	else
		c->base.broken = 1;
}

/*
 * Something to read on a pooled connection nobody asked anything: the
 * server ended the session (a restart's FATAL message, or EOF).
 */
static int closed_by_server(conn *c)
{
	struct pollfd pfd = {PQsocket(c->pg), POLLIN, 0};

	return pfd.fd < 0 || poll(&pfd, 1, 0) != 0 || PQstatus(c->pg) != CONNECTION_OK;
}

/* ---- connections ----------------------------------------------------- */

static void quiet(void *arg, const char *message)
{
	/* The library never prints: NOTICEs are dropped. */
	(void)arg;
	(void)message;
}

static void conn_close(conn *c)
{
	for (int i = 0; i < c->ncache; i++)
		free(c->cache[i].sql);
	c->ncache = 0;
	if (c->pg)
		PQfinish(c->pg);
	c->pg = NULL;
	c->piped = c->ndeferred = 0;
	c->failed_kind = 0;
	c->base.broken = 0;
	c->base.timed_out = 0;
}

/*
 * Drive a non-blocking connect to the end, waiting at most until deadline_us
 * in all: libpq's PQconnectdb would wait for a stopped server's handshake
 * for its whole connect_timeout, per address.
 */
static int connect_poll(conn *c, int64_t deadline_us)
{
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;

	if (PQstatus(c->pg) == CONNECTION_BAD)
		return -1;
	while (st != PGRES_POLLING_OK) {
		struct pollfd pfd = {PQsocket(c->pg),
		                     st == PGRES_POLLING_READING ? POLLIN : POLLOUT, 0};
		int left = idem__net_wait_ms(deadline_us, 0), n;

		if (st == PGRES_POLLING_FAILED || pfd.fd < 0)
			return -1;
		if (left == 0)
			return 1;
		n = poll(&pfd, 1, left);
		if (n < 0 && errno != EINTR)
			return -1;
		if (n > 0)
			st = PQconnectPoll(c->pg);
	}
	return 0;
}

static int conn_open(idem__backend *be, conn *c)
{
	/* Keywords before dbname are defaults the URL may override. Keepalives
	 * and tcp_user_timeout end a connection whose peer vanished (a dead
	 * link) even when idem is not waiting on it. */
	const char *keys[] = {"connect_timeout",
	                      "fallback_application_name",
	                      "keepalives",
	                      "keepalives_idle",
	                      "keepalives_interval",
	                      "keepalives_count",
	                      "tcp_user_timeout",
	                      "dbname",
	                      NULL};
	const char *vals[] = {"10", "idem", "1", "30", "10", "3", "30000", (const char *)be->state,
	                      NULL};
	int64_t deadline = idem__clock_monotonic_us() + CONNECT_TIMEOUT_MS * 1000LL;
	char setup[256];
	int rc;

	conn_close(c);
	if (c->base.deadline_us > 0 && c->base.deadline_us < deadline)
		deadline = c->base.deadline_us;
	c->pg = PQconnectStartParams(keys, vals, 1);
	if (!c->pg)
		return idem__error(IDEM_ENOMEM, "postgresql: out of memory connecting");
	if ((rc = connect_poll(c, deadline)) > 0) {
		conn_close(c);
		return idem__error(
		    IDEM_EUNAVAIL,
		    "postgresql: connect: no answer from the server before the deadline");
	}
	if (PQstatus(c->pg) != CONNECTION_OK) {
		const char *msg = PQerrorMessage(c->pg);
		int len = (int)strlen(msg);

		while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
			len--;
		rc = idem__error_driver(IDEM_EUNAVAIL, 0, NULL, "postgresql: connect: %.*s", len,
		                        msg);
		conn_close(c);
		return rc;
	}
	/*
	 * idle_in_transaction_session_timeout: a session whose client vanished
	 * mid-transaction (a reset only the client saw; its socket lingers for
	 * keepalive's hours) would hold the merchant's row lock, and every write
	 * of that merchant would wait and fail. idemd never leaves a transaction
	 * idle (no transaction is open across a channel call), so the server may
	 * end any that idles 30 s (tests/fault/test_netfault.py found them).
	 */
	PQsetNoticeProcessor(c->pg, quiet, NULL);
	c->io_timeout_ms = be->opts.busy_timeout_ms + IO_MARGIN_MS;
	snprintf(setup, sizeof(setup),
	         "SET default_transaction_isolation = 'read committed';"
	         " SET lock_timeout = %d; SET client_min_messages = warning;"
	         " SET idle_in_transaction_session_timeout = " IDLE_TXN_TIMEOUT_MS_STR,
	         be->opts.busy_timeout_ms > 0 ? be->opts.busy_timeout_ms : 1);
	if ((rc = simple(c, setup, "session setup")) < 0) {
		conn_close(c);
		return rc;
	}
	return 0;
}

/* ---- the driver (netdb.h) -------------------------------------------- */

static int drv_connect(idem__backend *be, idem__netconn *c)
{
	return conn_open(be, (conn *)(void *)c);
}

static void drv_disconnect(idem__netconn *c)
{
	conn_close((conn *)(void *)c);
}

static int drv_in_transaction(idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;

	return c->piped || PQtransactionStatus(c->pg) != PQTRANS_IDLE;
}

/* BEGIN queued, in pipeline mode until COMMIT or ROLLBACK. */
static int drv_begin(idem__netconn *nc, int fresh)
{
	conn *c = (conn *)(void *)nc;

	if (!c->pg || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "postgresql: connection lost");
	/* A BEGIN that waited would find out here; a queued one must look. */
	if (!fresh && closed_by_server(c)) {
		c->base.broken = 1;
		return idem__error(IDEM_EUNAVAIL, "postgresql: the server closed the connection");
	}
	if (c->piped || !PQenterPipelineMode(c->pg)) {
		c->base.broken = 1;
		return idem__error(IDEM_EUNAVAIL, "postgresql: cannot enter pipeline mode");
	}
	c->piped = 1;
	c->ndeferred = 0;
	return defer_text(c, "BEGIN", "begin");
}

static int drv_defer(idem__netconn *c, const char *sql, const char *what)
{
	return defer_text((conn *)(void *)c, sql, what);
}

static int drv_simple(idem__netconn *c, const char *sql, const char *what)
{
	return simple((conn *)(void *)c, sql, what);
}

static int drv_run(idem__netconn *c, const char *sql, const idem_value *params, int n,
                   idem_row_fn fn, void *ctx, int64_t *changes)
{
	return run((conn *)(void *)c, sql, params, n, fn, ctx, changes, CTX_BUSINESS);
}

static int drv_commit(idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;
	PGresult *res = exec_text(c, "COMMIT"); /* with whatever is queued */
	int rc = 0;

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		/* Lost during COMMIT: its fate is unknown: unavailable. A queued
		 * statement's error: COMMIT was not run (the core rolls back). */
		rc = idem__pg_fail(c, res, CTX_PLAIN, "commit");
	else if (strcmp(PQcmdStatus(res), "COMMIT") != 0)
		/* COMMIT of a failed transaction answers ROLLBACK, not an error. */
		rc = idem__error(IDEM_ESTORE, "postgresql: transaction was aborted; rolled back");
	PQclear(res);
	if (rc == 0)
		pipe_leave(c);
	return rc;
}

static int drv_rollback(idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;
	PGresult *res;
	int bad;

	/* A ROLLBACK behind a failed queued statement would be skipped: read
	 * the queue first (its errors are of no interest now). */
	if (c->piped && c->ndeferred > 0)
		PQclear(await_pipeline(c, io_deadline(c), 0));
	if (c->base.broken)
		return 1;
	res = exec_text(c, "ROLLBACK");
	bad = PQresultStatus(res) != PGRES_COMMAND_OK;
	PQclear(res);
	pipe_leave(c);
	return bad || c->piped;
}

static void url_free(void *state)
{
	free(state);
}

static const idem__netdb_driver pg_driver = {
    .ops = &idem__postgres_ops,
    .conn_size = sizeof(conn),
    .connect = drv_connect,
    .disconnect = drv_disconnect,
    .in_transaction = drv_in_transaction,
    .simple = drv_simple,
    .run = drv_run,
    .commit = drv_commit,
    .rollback = drv_rollback,
    .state_free = url_free,
    .begin_sql = "BEGIN",
    .begin = drv_begin,
    .defer = drv_defer,
    .version_sql = "SELECT to_regclass('idem_schema_version') IS NOT NULL",
    .purge_sql = idem__purge_sql,
};

/* ---- schema ---------------------------------------------------------- */

static int pg_migrate(idem__backend *be, int *version_out)
{
	idem__netconn *nc = NULL;
	conn *c;
	int cur = 0, fresh = 0, rc;

	/* No request deadline: a migration may rewrite a large table. */
	if ((rc = idem__net_take(be, IDEM__NET_WRITER, idem__backend_deadline(), &nc, &fresh)) < 0)
		return rc;
	c = (conn *)(void *)nc;
	if ((rc = simple(c, "BEGIN", "begin")) < 0)
		goto out;
	if ((rc = simple(c, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK_KEY ")", "lock")) < 0 ||
	    (rc = simple(c,
	                 "CREATE TABLE IF NOT EXISTS idem_schema_version ("
	                 " version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
	                 "schema table")) < 0 ||
	    (rc = idem__net_version_in(be, nc, &cur)) < 0)
		goto rollback;
	if (cur > IDEM__PG_SCHEMA_LATEST) {
		rc = idem__error(IDEM_ESCHEMA,
		                 "database schema version %d is newer than this library's %d", cur,
		                 IDEM__PG_SCHEMA_LATEST);
		goto rollback;
	}
	for (int v = cur + 1; v <= IDEM__PG_SCHEMA_LATEST; v++) {
		idem_value p[2] = {IDEM_V_INT(v), IDEM_V_INT(be->opts.clock(be->opts.clock_ctx))};

		if ((rc = simple(c, idem__pg_migrations[v - 1], "migration")) < 0 ||
		    (rc = run(c,
		              "INSERT INTO idem_schema_version (version, applied_at) VALUES (?, ?)",
		              p, 2, NULL, NULL, NULL, CTX_PLAIN)) < 0)
			goto rollback;
		cur = v;
	}
	if ((rc = simple(c, "COMMIT", "commit")) < 0)
		goto rollback;
	if (version_out)
		*version_out = cur;
	goto out;
rollback:
	if (!c->base.broken)
		PQclear(exec_text(c, "ROLLBACK"));
out:
	idem__net_give(be, nc);
	return rc;
}

/* ---- open ---------------------------------------------------------- */

static int pg_open(idem__backend **out, idem_store *store, const char *target,
                   const idem_store_opts *opts)
{
	PQconninfoOption *info = NULL;
	char *err = NULL, *url;
	size_t len;

	*out = NULL;
	if (!target || strncmp(target, "//", 2) != 0)
		return idem__error(IDEM_EINVAL,
		                   "postgresql URL must look like postgresql://user@host:port/db");
	len = strlen(target) + sizeof("postgresql:");
	if (!(url = malloc(len)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	snprintf(url, len, "postgresql:%s", target);
	/* Reject a malformed URL now, as bad input, not as "unreachable". */
	if (!(info = PQconninfoParse(url, &err))) {
		int n = err ? (int)strlen(err) : 0, rc;

		while (n > 0 && err[n - 1] == '\n')
			n--;
		rc = idem__error(IDEM_EINVAL, "postgresql URL invalid: %.*s", n,
		                 err ? err : "out of memory");
		PQfreemem(err);
		free(url);
		return rc;
	}
	PQconninfoFree(info);
	return idem__net_open(out, store, opts, &pg_driver, url);
}

/*
 * SELECT 1 on the ping's own connection, all of it (waiting for that
 * connection, reconnecting, the answer) within IDEM__NET_PING_MS: /healthz
 * says 503 promptly while every other connection hangs on a frozen server.
 */

/* ---- records --------------------------------------------------------- */

/*
 * ON CONFLICT on exactly the idempotency key: a conflict there (after
 * waiting for a concurrent claimer's transaction) returns no row; any other
 * failure, including another unique index, raises and is classified.
 */
static int pg_rec_insert(idem_txn *txn, const idem__key *k, idem__record *rec)
{
	static const char sql[] =
	    "INSERT INTO idem_records (scope, business_type, idem_key, version, status,"
	    " fingerprint, owner, lease_until, created_at, expires_at)"
	    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
	    " ON CONFLICT (scope, business_type, idem_key) DO NOTHING RETURNING id";
	idem_value p[10] = {IDEM_V_TEXTN(k->scope, k->scope_len),
	                    IDEM_V_TEXTN(k->type, k->type_len),
	                    IDEM_V_TEXTN(k->key, k->key_len),
	                    IDEM_V_INT(rec->version),
	                    IDEM_V_TEXT(idem__status_name(rec->status)),
	                    IDEM_V_TEXT(rec->fingerprint),
	                    IDEM_V_TEXT(rec->owner),
	                    IDEM_V_INT(rec->lease_until),
	                    IDEM_V_INT(rec->created_at),
	                    IDEM_V_INT(rec->expires_at)};
	int64_t id = 0;
	int rc = run(conn_of(txn), sql, p, 10, idem_row_int, &id, NULL, CTX_CLAIM);

	if (rc != 0)
		return rc;
	if (id == 0)
		return IDEM__DUPLICATE;
	rec->id = id;
	return 0;
}

/* One batch through the expires_at index; a live lease is never purged. */

/* ---- generic SQL ----------------------------------------------------- */

/*
 * A business statement inside its own savepoint, so that its failure rolls
 * back only itself and the unit's transaction stays usable (the contract of
 * idem_txn_try_exec), as it does on SQLite and MariaDB. Two extra round
 * trips, so only statements whose failure the unit handles pay for it.
 */
static int business(idem_txn *txn, const char *sql, const idem_value *params, int n, idem_row_fn fn,
                    void *ctx, int64_t *changes)
{
	conn *c = conn_of(txn);
	int rc;

	if ((rc = defer_text(c, "SAVEPOINT idem_stmt", "savepoint")) < 0)
		return rc;
	rc = run(c, sql, params, n, fn, ctx, changes, CTX_BUSINESS);
	if (c->base.broken)
		return rc;
	if (rc < 0) {
		/* Keep the statement's error as the one reported. In pipeline mode
		 * one statement per message: RELEASE queued behind ROLLBACK TO. */
		PGresult *res;

		if (c->piped &&
		    defer_text(c, "ROLLBACK TO SAVEPOINT idem_stmt", "rollback to") < 0) {
			c->base.broken = 1;
			return rc;
		}
		res = exec_text(c, c->piped ? "RELEASE SAVEPOINT idem_stmt"
		                            : "ROLLBACK TO SAVEPOINT idem_stmt;"
		                              " RELEASE SAVEPOINT idem_stmt");
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			c->base.broken = 1;
		PQclear(res);
		return rc;
	}
	{
		int rrc = defer_text(c, "RELEASE SAVEPOINT idem_stmt", "release");

		return rrc < 0 ? rrc : rc;
	}
}

static int pg_txn_try_exec(idem_txn *txn, const char *sql, const idem_value *params, int n,
                           int64_t *changes)
{
	return business(txn, sql, params, n, NULL, NULL, changes);
}

/*
 * The completion of a record this transaction claimed, queued: it cannot
 * miss (the claim holds the row), and should it all the same, "1 / count(*)"
 * of no row raises division_by_zero, which the next answer read reports as
 * IDEM_ELEASE and which keeps COMMIT from running.
 */
static int pg_rec_complete_held(idem_txn *txn, int64_t id, const char *owner, idem__status st,
                                int http_status, const unsigned char *body, size_t len, int64_t now)
{
	static const char sql[] =
	    "WITH done AS (UPDATE idem_records SET version = version + 1, status = ?,"
	    " http_status = ?, response = ?, owner = NULL, lease_until = NULL,"
	    " completed_at = ? WHERE id = ? AND owner = ? AND status = 'PROCESSING'"
	    " RETURNING 1) SELECT 1 / count(*) FROM done";
	idem_value p[6] = {IDEM_V_TEXT(idem__status_name(st)),
	                   IDEM_V_INT(http_status),
	                   IDEM_V_BLOB(body, len),
	                   IDEM_V_INT(now),
	                   IDEM_V_INT(id),
	                   IDEM_V_TEXT(owner)};
	conn *c = conn_of(txn);

	if (!c->piped) {
		int changed = 0, rc = idem__rec_complete(txn, id, owner, st, http_status, body, len,
		                                         now, &changed);

		return rc == 0 && !changed
		           ? idem__error(IDEM_ELEASE, "the claim's lease was taken over")
		           : rc;
	}
	return defer_run(c, sql, p, 6, DEF_COMPLETE, "completion");
}

const idem__backend_ops idem__postgres_ops = {
    .version = IDEM__BACKEND_OPS_VERSION,
    .name = "postgresql",
    .open = pg_open,
    .close = idem__net_close,
    .migrate = pg_migrate,
    .schema_version = idem__net_schema_version,
    .schema_latest = IDEM__PG_SCHEMA_LATEST,
    .ping = idem__net_ping,
    .txn_begin = idem__net_txn_begin,
    .txn_commit = idem__net_txn_commit,
    .txn_rollback = idem__net_txn_rollback,
    .savepoint = idem__net_savepoint,
    .release = idem__net_release,
    .rollback_to = idem__net_rollback_to,
    .rec_insert = pg_rec_insert,
    .rec_takeover = idem__rec_takeover,
    .rec_complete = idem__rec_complete,
    .rec_extend = idem__rec_extend,
    .rec_delete_owned = idem__rec_delete_owned,
    .purge_batch = idem__net_purge_batch,
    .txn_exec = idem__net_txn_exec,
    .txn_try_exec = pg_txn_try_exec,
    .txn_query = idem__net_txn_query,
    .read_query = idem__net_read_query,
    .rec_complete_held = pg_rec_complete_held,
};
