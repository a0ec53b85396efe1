/*
 * store/mariadb.c: the MariaDB dialect driver, on MariaDB Connector/C,
 * behind the shared server-backend core (netdb.c: pools, deadlines,
 * stale-connection retries, transaction framing, savepoints, schema
 * version, purge). Here: connecting (never with the driver's own
 * auto-reconnect, which would silently continue a dead transaction in
 * autocommit), the driver table, the claim INSERT, migrations under
 * GET_LOCK. Beside it, called from here and never calling back:
 * mariadb_stmt.c (statements, prepared once per connection and keyed by
 * their SQL text, and result conversion) above mariadb_io.c (error
 * classification, the bounded non-blocking calls); mariadb_url.c parses
 * URLs. Every session is InnoDB,
 * utf8mb4, READ COMMITTED, STRICT_ALL_TABLES and SIMULTANEOUS_ASSIGNMENT
 * (UPDATE's SET sees old values, as elsewhere).
 *
 * Keys compare byte for byte: utf8mb4_nopad_bin on the key columns. Plain
 * utf8mb4_bin is a PAD SPACE collation in MariaDB, under which 'A1' and
 * 'A1 ' collide in a unique index.
 *
 * Error classification is exact. The claim is a plain INSERT; only errno
 * 1062 whose message names the idempotency index (idem_records_key) is a
 * duplicate. Never INSERT IGNORE: it turns NOT NULL, truncation and foreign
 * key failures into warnings (DESIGN.md §1). 1213 and 1205 mean "retry",
 * 1062 in business SQL a business conflict, NOT NULL / CHECK / foreign key
 * errors constraint violations, lost connections "store unavailable".
 * Every call that waits for the server runs on Connector/C's non-blocking
 * API (MYSQL_OPT_NONBLOCK, *_start / *_cont, poll here), bounded by the
 * read/write timeouts and by its connection's deadline (netdb.h): a server
 * that stops answering fails the call as unavailable and the connection is
 * shut down and dropped, never reused.
 *
 * This file must never print or read the environment, and never puts the
 * URL (it may hold a password) into an error message.
 */
#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "store/mariadb.h"
#include "store/mariadb_int.h"
#include "store/netdb.h"
#include "store/schema.h"
#include "util/clock.h"
#include "util/error.h"

static pthread_once_t library_once = PTHREAD_ONCE_INIT;
static int library_rc;

static void library_init(void)
{
	/* Not thread-safe inside mysql_init, so done once up front. */
	library_rc = mysql_library_init(0, NULL, NULL);
}

/* ---- connections ----------------------------------------------------- */

/* How much longer than a lock wait any call may wait for the server. */
#define IO_MARGIN_S 10
/* The longest a connect may take, deadline or not. */
#define CONNECT_TIMEOUT_S 10

/* Close c's cached statements and its handle; c may be opened again. */
static void conn_close(conn *c)
{
	/* A broken connection may be mid-call to a server that does not answer:
	 * shut the socket first, so nothing below waits for it. */
	if (c->my && c->base.broken && mysql_get_socket(c->my) >= 0)
		shutdown(mysql_get_socket(c->my), SHUT_RDWR);
	for (int i = 0; i < c->ncache; i++) {
		mysql_stmt_close(c->cache[i].st);
		free(c->cache[i].sql);
	}
	c->ncache = 0;
	if (c->my)
		mysql_close(c->my);
	c->my = NULL;
	c->base.broken = 0;
	c->base.timed_out = 0;
	c->in_unit = c->lost = c->read_write = 0;
}

/* Connect c to be's server with the store's session settings. */
static int conn_open(idem__backend *be, conn *c)
{
	const my_url *u = be->state;
	int wait_s = (be->opts.busy_timeout_ms + 999) / 1000;
	unsigned int connect_timeout = CONNECT_TIMEOUT_S,
	             io_timeout = (unsigned int)wait_s + IO_MARGIN_S;
	my_bool reconnect = 0;
	MYSQL *ok = NULL;
	char setup[320];
	int rc;

	conn_close(c);
	if (!(c->my = mysql_init(NULL)))
		return idem__error(IDEM_ENOMEM, "mariadb: out of memory");
	c->io_timeout_ms = (int)io_timeout * 1000;
	c->lost_statement = idem__my_lost_statement;
	mysql_options(c->my, MYSQL_OPT_NONBLOCK, 0);
	mysql_options(c->my, MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout);
	/* A server that stops answering (SIGSTOP, a dead link) fails the call
	 * (2013: unavailable) after a lock wait plus a margin, instead of
	 * hanging it forever. */
	mysql_options(c->my, MYSQL_OPT_READ_TIMEOUT, &io_timeout);
	mysql_options(c->my, MYSQL_OPT_WRITE_TIMEOUT, &io_timeout);
	mysql_options(c->my, MYSQL_OPT_RECONNECT, &reconnect);
	mysql_options(c->my, MYSQL_SET_CHARSET_NAME, "utf8mb4");
	/* CLIENT_FOUND_ROWS: an UPDATE reports the rows it matched, as SQLite
	 * and PostgreSQL do, even when it set a column to the value it had. */
	idem__my_arm(c, CONNECT_TIMEOUT_S * 1000);
	NB_RUN(c, ok,
	       mysql_real_connect_start(&ok, c->my, *u->host ? u->host : NULL, u->user, u->password,
	                                u->db, u->port, u->socket, CLIENT_FOUND_ROWS),
	       mysql_real_connect_cont, c->my);
	if (!ok || c->base.timed_out) {
		if (c->base.timed_out)
			rc = idem__error(IDEM_EUNAVAIL, "mariadb: connect: no answer from the "
			                                "server before the deadline");
		else
			rc = idem__error_driver(IDEM_EUNAVAIL, (int)mysql_errno(c->my),
			                        mysql_sqlstate(c->my),
			                        "mariadb: connect: %s (errno %u)",
			                        mysql_error(c->my), mysql_errno(c->my));
		conn_close(c);
		return rc;
	}
	/* SIMULTANEOUS_ASSIGNMENT: in UPDATE ... SET a = a + 1, b = f(a), f sees
	 * the old a, as in SQLite, PostgreSQL and standard SQL; MariaDB's default
	 * (left to right) would silently change the meaning of shared SQL.
	 * idle_transaction_timeout (s): the server ends a session left idle
	 * inside a transaction by a client that vanished, so its row locks do
	 * not block that merchant's writes for keepalive's hours (postgres.c
	 * says more). */
	snprintf(setup, sizeof(setup),
	         "SET SESSION sql_mode = 'STRICT_ALL_TABLES,STRICT_TRANS_TABLES,"
	         "ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION,"
	         "SIMULTANEOUS_ASSIGNMENT',"
	         " innodb_lock_wait_timeout = %d, default_storage_engine = InnoDB,"
	         " idle_transaction_timeout = 30",
	         wait_s > 0 ? wait_s : 1);
	if ((rc = idem__my_simple(c, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
	                          "session setup")) < 0 ||
	    (rc = idem__my_simple(c, setup, "session setup")) < 0) {
		conn_close(c);
		return rc;
	}
	return 0;
}

/* ---- the driver (netdb.h) -------------------------------------------- */

/*
 * A pooled session is READ ONLY outside the core's transactions (begin_sql
 * says READ WRITE): should a statement of a unit ever run after its
 * transaction was rolled back under it (unit_gone), a write is refused
 * (1792) instead of being committed alone, outside the unit.
 */
static int drv_connect(idem__backend *be, idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;
	int rc;

	if ((rc = conn_open(be, c)) < 0)
		return rc;
	if ((rc = idem__my_simple(c, "SET SESSION TRANSACTION READ ONLY", "session setup")) < 0)
		conn_close(c);
	return rc;
}

static void drv_disconnect(idem__netconn *c)
{
	conn_close((conn *)(void *)c);
}

static int drv_in_transaction(idem__netconn *c)
{
	return idem__my_in_transaction((conn *)(void *)c);
}

static int drv_simple(idem__netconn *nc, const char *sql, const char *what)
{
	conn *c = (conn *)(void *)nc;
	int rc = idem__my_simple(c, sql, what);

	if (rc == 0 && strcmp(what, "begin") == 0)
		c->in_unit = 1;
	else if (rc == 0)
		rc = idem__my_unit_gone(c, what);
	return rc;
}

/* DDL: MariaDB commits the transaction before and after it. */
static int is_ddl(const char *sql)
{
	static const char *const verbs[] = {"CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"};

	while (*sql == ' ' || *sql == '\t' || *sql == '\n' || *sql == '(')
		sql++;
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
		size_t n = strlen(verbs[i]);

		if (strncasecmp(sql, verbs[i], n) == 0 &&
		    (sql[n] == ' ' || sql[n] == '\t' || sql[n] == '\n'))
			return 1;
	}
	return 0;
}

/* InnoDB rolls back only the failed statement: no savepoint per statement. */
static int drv_run(idem__netconn *nc, const char *sql, const idem_value *params, int n,
                   idem_row_fn fn, void *ctx, int64_t *changes)
{
	conn *c = (conn *)(void *)nc;
	int rc;

	/* DDL inside a unit ends its transaction (implicit commit), and what
	 * follows runs in autocommit, as MariaDB has it: that needs READ WRITE
	 * outside transactions, so this session is dropped after the unit. */
	if (c->in_unit && is_ddl(sql)) {
		if ((rc = idem__my_simple(c, "SET SESSION TRANSACTION READ WRITE",
		                          "session setup")) < 0)
			return rc;
		c->in_unit = 0;
		c->read_write = 1;
	}
	rc = idem__my_run(c, sql, params, n, fn, ctx, changes, NULL, CTX_BUSINESS);
	return rc == 0 ? idem__my_unit_gone(c, "statement") : rc;
}

/* 1213 at COMMIT is a Galera certification conflict: retryable. A lost
 * connection leaves the outcome unknown: unavailable. */
static int drv_commit(idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;
	int rc;

	/* A COMMIT without the transaction would commit nothing and succeed. */
	if ((rc = idem__my_unit_gone(c, "commit")) < 0)
		return rc;
	c->in_unit = 0;
	rc = idem__my_simple(c, "COMMIT", "commit");
	if (c->read_write)
		c->base.broken = 1;
	return rc;
}

static int drv_rollback(idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;

	c->in_unit = 0;
	if (c->read_write)
		c->base.broken = 1;
	return idem__my_nb_query(c, "ROLLBACK", 8);
}

/*
 * 1305: the savepoint is gone because the whole transaction is: rolled back
 * by a deadlock or, on Galera, by a brute-force abort (a replicated write
 * set that won certification). Retry the unit, as for the 1213 the next
 * statement would have reported.
 */
static int drv_savepoint_failed(idem__netconn *nc, const char *verb, int rc)
{
	conn *c = (conn *)(void *)nc;

	if (c->my && !c->base.broken && mysql_errno(c->my) == ER_SP_DOES_NOT_EXIST)
		return idem__error_driver(
		    IDEM_ERETRY, ER_SP_DOES_NOT_EXIST, mysql_sqlstate(c->my),
		    "mariadb: %s: transaction rolled back under it (errno 1305)", verb);
	return rc;
}

static void url_free(void *state)
{
	idem__my_url_clear(state);
	free(state);
}

static const idem__netdb_driver my_driver = {
    .ops = &idem__mariadb_ops,
    .conn_size = sizeof(conn),
    .connect = drv_connect,
    .disconnect = drv_disconnect,
    .in_transaction = drv_in_transaction,
    .simple = drv_simple,
    .run = drv_run,
    .commit = drv_commit,
    .rollback = drv_rollback,
    .savepoint_failed = drv_savepoint_failed,
    .state_free = url_free,
    .begin_sql = "START TRANSACTION READ WRITE",
    .version_sql = "SELECT count(*) FROM information_schema.tables"
                   " WHERE table_schema = DATABASE() AND table_name = 'idem_schema_version'",
    .purge_sql = idem__my_purge_sql,
};

/* ---- schema ---------------------------------------------------------- */

/* The migration lock is server-wide by name: one name per database. */
#define MIGRATE_LOCK "CONCAT('idem_migrate:', MD5(DATABASE()))"

static int my_migrate(idem__backend *be, int *version_out)
{
	idem__netconn *nc = NULL;
	conn *c;
	int64_t got = 0;
	int cur = 0, fresh = 0, locked = 0, rc;

	/* No request deadline: a migration may rewrite a large table. */
	if ((rc = idem__net_take(be, IDEM__NET_WRITER, idem__backend_deadline(), &nc, &fresh)) < 0)
		return rc;
	c = (conn *)(void *)nc;
	/* Migrations write outside a transaction: this session alone is READ
	 * WRITE, and dropped afterwards (below), never pooled so. */
	if ((rc = idem__my_simple(c, "SET SESSION TRANSACTION READ WRITE", "session setup")) < 0)
		goto out;
	/* GET_LOCK serialises migrating processes; it is released when the
	 * connection ends too, so a crashed migrator never blocks the next. */
	if ((rc = idem__my_run(c, "SELECT GET_LOCK(" MIGRATE_LOCK ", 60)", NULL, 0, idem_row_int,
	                       &got, NULL, NULL, CTX_PLAIN)) < 0)
		goto out;
	if (got != 1) {
		rc = idem__error(IDEM_ERETRY, "mariadb: timed out waiting for the migration lock");
		goto out;
	}
	locked = 1;
	if ((rc = idem__my_simple(c,
	                          "CREATE TABLE IF NOT EXISTS idem_schema_version ("
	                          " version INT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)"
	                          " ENGINE=InnoDB",
	                          "schema table")) < 0 ||
	    (rc = idem__net_version_in(be, nc, &cur)) < 0)
		goto out;
	if (cur > IDEM__MY_SCHEMA_LATEST) {
		rc = idem__error(IDEM_ESCHEMA,
		                 "database schema version %d is newer than this library's %d", cur,
		                 IDEM__MY_SCHEMA_LATEST);
		goto out;
	}
	for (int v = cur + 1; v <= IDEM__MY_SCHEMA_LATEST; v++) {
		idem_value p[2] = {IDEM_V_INT(v), IDEM_V_INT(be->opts.clock(be->opts.clock_ctx))};

		for (const char *const *s = idem__my_migrations[v - 1]; *s; s++)
			if ((rc = idem__my_simple(c, *s, "migration")) < 0)
				goto out;
		if ((rc = idem__my_run(
		         c, "INSERT INTO idem_schema_version (version, applied_at) VALUES (?, ?)",
		         p, 2, NULL, NULL, NULL, NULL, CTX_PLAIN)) < 0)
			goto out;
		cur = v;
	}
	if (version_out)
		*version_out = cur;
out:
	if (locked && !c->base.broken &&
	    idem__my_simple(c, "DO RELEASE_LOCK(" MIGRATE_LOCK ")", "unlock") < 0 && rc == 0)
		c->base.broken = 1; /* the lock must not outlive this call: drop the session */
	c->base.broken = 1;         /* and READ WRITE must not be pooled */
	idem__net_give(be, nc);
	return rc;
}

/* ---- open ------------------------------------------------------------ */

static int my_open(idem__backend **out, idem_store *store, const char *target,
                   const idem_store_opts *opts)
{
	my_url *u;
	int rc;

	*out = NULL;
	pthread_once(&library_once, library_init);
	if (library_rc != 0)
		return idem__error(IDEM_EUNAVAIL, "mariadb: client library failed to initialise");
	if (!(u = calloc(1, sizeof(*u))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	if ((rc = idem__my_url_parse(u, target ? target : "")) < 0) {
		free(u);
		return rc;
	}
	return idem__net_open(out, store, opts, &my_driver, u);
}

MYSQL *idem__mariadb_connect(const char *url)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem__backend be;
	my_url u;
	conn c;
	const char *colon = url ? strchr(url, ':') : NULL;
	MYSQL *my = NULL;

	memset(&be, 0, sizeof(be));
	memset(&c, 0, sizeof(c));
	memset(&u, 0, sizeof(u));
	be.opts = opts;
	be.state = &u;
	pthread_once(&library_once, library_init);
	if (!colon || library_rc != 0) {
		idem__error(IDEM_EINVAL, "mariadb: not a mysql:// URL");
		return NULL;
	}
	if (idem__my_url_parse(&u, colon + 1) == 0 && conn_open(&be, &c) == 0) {
		my = c.my; /* no statements cached yet: the handle is all there is */
		c.my = NULL;
	}
	idem__my_url_clear(&u);
	return my;
}

/* ---- records --------------------------------------------------------- */

/*
 * A plain INSERT: InnoDB makes a second claimer wait on the first one's row
 * lock, then fails it with 1062 (rolling back that statement only), and the
 * record it then reads is committed (READ COMMITTED).
 */
static int my_rec_insert(idem_txn *txn, const idem__key *k, idem__record *rec)
{
	static const char sql[] =
	    "INSERT INTO idem_records (scope, business_type, idem_key, version, status,"
	    " fingerprint, owner, lease_until, created_at, expires_at)"
	    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
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
	int rc = idem__my_run(conn_of(txn), sql, p, 10, NULL, NULL, NULL, &id, CTX_CLAIM);

	if (rc == 0)
		rc = idem__my_unit_gone(conn_of(txn), "claim");
	if (rc == 0)
		rec->id = id;
	return rc;
}

const idem__backend_ops idem__mariadb_ops = {
    .version = IDEM__BACKEND_OPS_VERSION,
    .name = "mariadb",
    .open = my_open,
    .close = idem__net_close,
    .migrate = my_migrate,
    .schema_version = idem__net_schema_version,
    .schema_latest = IDEM__MY_SCHEMA_LATEST,
    .ping = idem__net_ping,
    .txn_begin = idem__net_txn_begin,
    .txn_commit = idem__net_txn_commit,
    .txn_rollback = idem__net_txn_rollback,
    .savepoint = idem__net_savepoint,
    .release = idem__net_release,
    .rollback_to = idem__net_rollback_to,
    .rec_insert = my_rec_insert,
    .rec_takeover = idem__rec_takeover,
    .rec_complete = idem__rec_complete,
    .rec_extend = idem__rec_extend,
    .rec_delete_owned = idem__rec_delete_owned,
    .purge_batch = idem__net_purge_batch,
    .txn_exec = idem__net_txn_exec,
    .txn_query = idem__net_txn_query,
    .read_query = idem__net_read_query,
};
