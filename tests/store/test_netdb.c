/*
 * tests/store/test_netdb.c: the behaviour both server backends (PostgreSQL,
 * MariaDB) must share, written once and run on each: ctest runs it as
 * test_netdb_postgres and test_netdb_mariadb (argv[1] names the backend).
 * The shared core (store/netdb.c): connections killed under the store
 * (never a duplicate; it recovers by itself), a server that stops
 * answering, deadlines (a request's, a silent server's connect, the ping's
 * own connection), a newer schema refused, migrations racing from several
 * processes, error classes. And what each dialect driver promises alike,
 * in the SQL subset src/pay is written in: both URL schemes, value types and
 * `?` placeholders, keys compared byte for byte, constraint failures that
 * are errors and never duplicates, a failed statement that leaves the
 * transaction usable, an UPDATE seeing old values. Only the few lines that
 * reach the server itself (killing a session, a statement beside the store)
 * and the driver's detail of an error (PostgreSQL's SQLSTATE, MariaDB's
 * errno: assert_detail) differ per backend. What only one dialect has stays in
 * test_postgres.c / test_mariadb.c.
 * Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <arpa/inet.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/backend.h"
#include "store/mariadb.h"
#include "support.h"

static const char *backend; /* "postgres" or "mariadb" */

static int is_pg(void)
{
	return strcmp(backend, "postgres") == 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the server itself, beside the store under test ---------------------- */

/* A statement on the test's database (PostgreSQL: on the server's admin URL
 * when admin is set), outside the store under test. */
static void direct(const test_net_fixture *f, const char *sql, int admin)
{
	if (is_pg()) {
		PGconn *pg = PQconnectdb(admin ? test_server_admin_url("postgres") : f->url);
		PGresult *res;

		if (PQstatus(pg) != CONNECTION_OK)
			fail_msg("connect: %s", PQerrorMessage(pg));
		res = PQexec(pg, sql);
		if (PQresultStatus(res) != PGRES_TUPLES_OK &&
		    PQresultStatus(res) != PGRES_COMMAND_OK)
			fail_msg("%s: %s", sql, PQresultErrorMessage(res));
		PQclear(res);
		PQfinish(pg);
	} else {
		MYSQL *my = idem__mariadb_connect(f->url);

		if (!my)
			fail_msg("connect: %s", idem_error_last()->message);
		if (mysql_query(my, sql) != 0)
			fail_msg("%s: %s", sql, mysql_error(my));
		mysql_close(my);
	}
}

/* Kill session id (pg_backend_pid() / CONNECTION_ID()) from outside. */
static void kill_session(const test_net_fixture *f, int64_t id)
{
	char sql[128];

	if (is_pg())
		snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%lld)", (long long)id);
	else
		snprintf(sql, sizeof(sql), "KILL %lld", (long long)id);
	direct(f, sql, 1);
}

/* Kill every session on the test's database (but the killer's). */
static void kill_all_sessions(const test_net_fixture *f)
{
	if (is_pg()) {
		char sql[256];

		snprintf(sql, sizeof(sql),
		         "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
		         " WHERE datname = '%s' AND pid <> pg_backend_pid()",
		         strrchr(f->url, '/') + 1);
		direct(f, sql, 1);
	} else {
		MYSQL *my = idem__mariadb_connect(f->url);
		MYSQL_RES *res;
		MYSQL_ROW row;
		char sql[64];
		unsigned long ids[64];
		int n = 0;

		assert_non_null(my);
		assert_int_equal(mysql_query(my,
		                             "SELECT id FROM information_schema.processlist"
		                             " WHERE db = DATABASE() AND id <> CONNECTION_ID()"),
		                 0);
		assert_non_null(res = mysql_store_result(my));
		while ((row = mysql_fetch_row(res)) && n < 64)
			ids[n++] = strtoul(row[0], NULL, 10);
		mysql_free_result(res);
		assert_true(n > 0);
		for (int i = 0; i < n; i++) {
			snprintf(sql, sizeof(sql), "KILL %lu", ids[i]);
			mysql_query(my, sql); /* one may have ended by itself meanwhile */
		}
		mysql_close(my);
	}
}

static const char *session_sql(void)
{
	return is_pg() ? "SELECT pg_backend_pid()" : "SELECT CONNECTION_ID()";
}

static const char *sleep_sql(void)
{
	return is_pg() ? "SELECT pg_sleep(?)" : "SELECT SLEEP(?)";
}

/* The driver's detail beside the idem code of the last error: PostgreSQL's
 * SQLSTATE, MariaDB's errno. */
static void assert_detail(const char *sqlstate, unsigned my_errno)
{
	if (is_pg())
		assert_string_equal(idem_error_last()->sqlstate, sqlstate);
	else
		assert_int_equal(idem_error_last()->driver_code, my_errno);
}

/* ---- units ------------------------------------------------------------------ */

typedef struct {
	const char *sql; /* instead of the work_log insert */
	const char *scope, *key;
	int calls;
	const test_net_fixture *kill_self; /* kill our own session half way through */
} unit;

static int unit_fn(idem_txn *txn, void *ctx, idem_response *resp)
{
	unit *u = ctx;
	idem_value p[3] = {IDEM_V_TEXT(u->scope), IDEM_V_TEXT(u->key), IDEM_V_INT(1)};
	const char *ins = "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)";
	int rc;

	u->calls++;
	if ((rc = idem_txn_exec(txn, u->sql ? u->sql : ins, p, u->sql ? 0 : 3, NULL)) < 0)
		return rc;
	if (u->kill_self) {
		int64_t id = -1;

		assert_int_equal(idem_txn_query(txn, session_sql(), NULL, 0, test_first_int, &id),
		                 0);
		kill_session(u->kill_self, id);
		u->kill_self = NULL;
		/* The next statement finds the session gone. */
		if ((rc = idem_txn_exec(txn, ins, p, 3, NULL)) < 0)
			return rc;
	}
	return idem_response_set(resp, 201, "made", 4);
}

static int run_unit(test_net_fixture *f, const char *key, unit *u, idem_result *res)
{
	idem_request r = IDEM_REQUEST_INIT;
	char fp[65];

	test_fp(fp, "{}");
	r.scope = f->scope;
	r.business_type = "payment";
	r.key = key;
	r.key_len = strlen(key);
	r.fingerprint = fp;
	u->scope = f->scope;
	u->key = key;
	return idem_execute(res, f->store, &r, unit_fn, u);
}

/*
 * A value out of its column's range (PostgreSQL 22003, MariaDB 1264 and
 * 1690) is the request's fault and permanent: never "store unavailable",
 * which would make every client retry a request that can never succeed
 * (issue 16). It is IDEM_EINVAL, nothing is committed, the store still works.
 */
static void numeric_range_is_invalid(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	unit u = {.sql = "INSERT INTO work_log (scope, k, worker) VALUES ('s', 'x', 3000000000)"};
	idem_result res = {0};
	idem_record_info info;
	int64_t n = 0;
	int rc;

	rc = run_unit(f, "K", &u, &res);
	assert_int_equal(rc, IDEM_EINVAL);
	assert_int_not_equal(idem_error_classify(rc), IDEM_ECLASS_UNAVAILABLE);
	assert_detail("22003", 1264);
	assert_int_equal(res.outcome, 0);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	/* In an expression, on a read connection. */
	rc = idem_store_query(f->store, "SELECT 9223372036854775807 + 1", NULL, 0, test_first_int,
	                      &n);
	assert_int_equal(rc, IDEM_EINVAL);
	assert_detail("22003", 1690);
	assert_int_equal(idem_store_ping(f->store), 0);
	assert_int_equal(run_unit(f, "K2",
	                          &(unit){.sql = "INSERT INTO work_log (scope, k, worker)"
	                                         " VALUES ('s', 'x', 1)"},
	                          &res),
	                 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
}

/*
 * A connection given back to the pool while still inside a transaction is
 * out of step (a later unit would run inside that old transaction): it must
 * be dropped, never handed out again. A read that opens a transaction
 * leaves its connection so; the next read must be outside any transaction.
 */
static void connection_left_in_transaction_is_dropped(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	const char *session = session_sql();
	int64_t before = -1, after = -1, again = -1;

	/* One thread's reads reuse one pooled connection (the last given back). */
	assert_int_equal(idem_store_query(f->store, session, NULL, 0, test_first_int, &before), 0);
	assert_int_equal(idem_store_query(f->store, session, NULL, 0, test_first_int, &again), 0);
	assert_true(before > 0);
	assert_int_equal(again, before);
	assert_int_equal(idem_store_query(f->store, "START TRANSACTION", NULL, 0, NULL, NULL), 0);
	assert_int_equal(idem_store_query(f->store, session, NULL, 0, test_first_int, &after), 0);
	assert_true(after > 0);
	assert_int_not_equal(after, before); /* that session was closed, a new one opened */
	if (strcmp(backend, "mariadb") == 0) {
		int64_t in = -1;

		assert_int_equal(idem_store_query(f->store, "SELECT @@in_transaction", NULL, 0,
		                                  test_first_int, &in),
		                 0);
		assert_int_equal(in, 0);
	}
}

/*
 * Every session of the store is killed while idle: the next call reconnects
 * by itself (or says unavailable), never answers a duplicate, and the one
 * after certainly works.
 */
static void killed_idle_connections_recover(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	unit u = {0};
	idem_result res = {0};
	int rc;

	assert_int_equal(run_unit(f, "before", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	kill_all_sessions(f);

	rc = run_unit(f, "before", &u, &res);
	assert_true(rc == 0 || rc == IDEM_EUNAVAIL);
	if (rc == 0)
		assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
	rc = run_unit(f, "after", &u, &res);
	assert_true(rc == 0 || rc == IDEM_EUNAVAIL);
	idem_result_clear(&res);
	assert_int_equal(run_unit(f, "after2", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(idem_store_ping(f->store), 0);
	assert_int_equal(test_work_count(f->store, f->scope, "before"), 1);
}

/*
 * The session dies in the middle of a unit: the unit fails as unavailable
 * (never a duplicate, never retried as if it were a lock conflict), nothing
 * of it is committed, and the key is free for the retry.
 */
static void killed_mid_unit_is_unavailable(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	unit u = {.kill_self = f};
	idem_result res = {0};
	idem_record_info info;

	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_EUNAVAIL);
	assert_int_equal(res.outcome, 0);
	assert_int_equal(u.calls, 1);
	assert_int_equal(idem_error_last()->code, IDEM_EUNAVAIL);
	assert_true(idem_metrics_store_errors(f->store, IDEM_ECLASS_UNAVAILABLE) >= 1);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 0);
	assert_int_equal(run_unit(f, "K", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 1);
}

static int sleep_for(idem_txn *txn, void *ctx)
{
	return idem_txn_query(txn, sleep_sql(), &IDEM_V_INT(*(int *)ctx), 1, NULL, NULL);
}

/*
 * A server that stops answering (here: a statement that outlives the
 * store's bound of busy_timeout_ms + 10 s, as a SIGSTOPped server would)
 * fails the call as unavailable instead of hanging it, and the store goes
 * on with a new connection.
 */
static void unanswered_call_is_unavailable(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *s = NULL;
	unit u = {0};
	idem_result res = {0};
	int secs = is_pg() ? 13 : 14;

	opts.busy_timeout_ms = 100;
	assert_int_equal(idem_store_open(&s, f->url, &opts), 0);
	assert_int_equal(idem_store_transact(s, sleep_for, &secs), IDEM_EUNAVAIL);
	if (is_pg())
		assert_non_null(strstr(idem_error_last()->message, "did not answer"));
	else
		assert_int_equal(idem_error_last()->driver_code, 2013);
	assert_int_equal(idem_store_ping(s), 0);
	idem_store_close(s);
	assert_int_equal(run_unit(f, "after", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
}

/*
 * opts.request_timeout_ms bounds a write transaction and a read however
 * long the lock wait bound is: a statement still running at the deadline
 * fails unavailable within it (its connection dropped), nothing of it is
 * committed, and the store goes on.
 */
static void request_deadline_bounds_a_statement(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *s = NULL;
	int secs = 5;
	double t0;

	opts.request_timeout_ms = 400;
	assert_int_equal(idem_store_open(&s, f->url, &opts), 0);
	t0 = now_s();
	assert_int_equal(idem_store_transact(s, sleep_for, &secs), IDEM_EUNAVAIL);
	assert_true(now_s() - t0 < 3.0); /* 5 s without the deadline */
	t0 = now_s();
	assert_int_equal(idem_store_query(s, sleep_sql(), &IDEM_V_INT(5), 1, NULL, NULL),
	                 IDEM_EUNAVAIL);
	assert_true(now_s() - t0 < 3.0); /* 5 s without the deadline */
	assert_int_equal(idem_store_ping(s), 0);
	assert_int_equal(idem_store_query(s, "SELECT 1", NULL, 0, NULL, NULL), 0);
	idem_store_close(s);
}

typedef struct {
	idem_store *s;
	int secs;
	int rc;
} hog;

static void *hog_reader(void *arg)
{
	hog *h = arg;

	h->rc = idem_store_query(h->s, sleep_sql(), &IDEM_V_INT(h->secs), 1, NULL, NULL);
	return NULL;
}

/*
 * The ping has a connection of its own: with the only read connection busy
 * (as every connection is on a frozen server), it still answers at once.
 */
static void ping_does_not_queue_behind_readers(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	hog h = {NULL, 4, -1};
	pthread_t t;
	double t0;
	int64_t one = 0;

	opts.read_connections = 1;
	assert_int_equal(idem_store_open(&h.s, f->url, &opts), 0);
	assert_int_equal(idem_store_ping(h.s), 0); /* its connection opened */
	assert_int_equal(pthread_create(&t, NULL, hog_reader, &h), 0);
	nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
	t0 = now_s();
	assert_int_equal(idem_store_ping(h.s), 0);
	assert_true(now_s() - t0 < 1.5); /* the reader is busy for 4 s */
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(h.rc, 0);
	assert_int_equal(idem_store_query(h.s, "SELECT 1", NULL, 0, test_first_int, &one), 0);
	assert_int_equal(one, 1);
	idem_store_close(h.s);
}

/*
 * A server that accepts the TCP connection and never says a word (frozen,
 * or not a database at all): connecting fails unavailable by the calling
 * thread's deadline, not after the 10 s connect bound.
 */
static void silent_server_fails_by_the_deadline(void **state)
{
	struct sockaddr_in sa = {0};
	socklen_t len = sizeof(sa);
	idem_store *s = (idem_store *)1;
	char url[128];
	double t0;
	int fd = socket(AF_INET, SOCK_STREAM, 0), rc;

	(void)state;
	assert_true(fd >= 0);
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 8), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	snprintf(url, sizeof(url), "%s://idem@127.0.0.1:%d/none", is_pg() ? "postgresql" : "mysql",
	         ntohs(sa.sin_port));
	t0 = now_s();
	idem__backend_deadline_set((int64_t)(t0 * 1e6) + 300 * 1000);
	rc = idem_store_open(&s, url, NULL);
	idem__backend_deadline_set(0);
	assert_int_equal(rc, IDEM_EUNAVAIL);
	assert_null(s);
	assert_true(now_s() - t0 < 3.0); /* 10 s (the connect bound) without it */
	assert_non_null(strstr(idem_error_last()->message, "deadline"));
	close(fd);
}

static void newer_schema_is_refused(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	idem_store *s = (idem_store *)1;

	direct(f, "INSERT INTO idem_schema_version (version, applied_at) VALUES (999, 0)", 0);
	assert_int_equal(idem_store_open(&s, f->url, NULL), IDEM_ESCHEMA);
	assert_null(s);
	assert_non_null(strstr(idem_error_last()->message, "999"));
}

/* Several processes open (and so migrate) one new database at once. */
static void migrations_race_across_processes(void **state)
{
	test_net_fixture *f = *state;
	pid_t pids[4];
	int64_t rows = -1;
	int v = -1;

	(void)test_server_admin_url(backend);
	setenv("IDEM_TEST_URL", backend, 1);
	f->url = test_db_url();
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			idem_store *s = NULL;
			int rc = idem_store_open(&s, f->url, NULL);

			idem_store_close(s);
			_exit(rc == 0 ? 0 : 1);
		}
	}
	for (int i = 0; i < 4; i++) {
		int status = 0;

		assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	f->store = test_store_open(f->url, NULL);
	assert_int_equal(idem_store_schema_version(f->store, &v), 0);
	assert_int_equal(v, idem_store_schema_latest(f->store));
	assert_int_equal(idem_store_query(f->store, "SELECT count(*) FROM idem_schema_version",
	                                  NULL, 0, test_first_int, &rows),
	                 0);
	assert_int_equal(rows, idem_store_schema_latest(f->store));
}

/* ---- the shared SQL subset, the same on both drivers ---------------------- */

/*
 * Both schemes of a server open the same store (postgresql:// and
 * postgres://, mysql:// and mariadb://). A URL that is not one, or names a
 * parameter the driver does not know, is bad input; a server that is not
 * there is unavailable; *out is NULL after either.
 */
static void url_schemes_and_refusals(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	const char *scheme = is_pg() ? "postgresql" : "mysql";
	const char *rest = strstr(f->url, "://");
	idem_store *s = NULL;
	char url[512];

	assert_string_equal(idem_store_backend(f->store), is_pg() ? "postgresql" : "mariadb");
	assert_non_null(rest);
	snprintf(url, sizeof(url), "%s%s", is_pg() ? "postgres" : "mariadb", rest);
	assert_int_equal(idem_store_open(&s, url, NULL), 0);
	assert_string_equal(idem_store_backend(s), idem_store_backend(f->store));
	idem_store_close(s);
	s = (idem_store *)1;
	snprintf(url, sizeof(url), "%s://idem@127.0.0.1/x?nosuchparam=1", scheme);
	assert_int_equal(idem_store_open(&s, url, NULL), IDEM_EINVAL);
	assert_null(s);
	s = (idem_store *)1;
	snprintf(url, sizeof(url), "%s:idem@127.0.0.1/x", scheme);
	assert_int_equal(idem_store_open(&s, url, NULL), IDEM_EINVAL);
	assert_null(s);
	s = (idem_store *)1;
	snprintf(url, sizeof(url), "%s://idem@127.0.0.1:1/x", scheme);
	assert_int_equal(idem_store_open(&s, url, NULL), IDEM_EUNAVAIL);
	assert_null(s);
}

static int make_types(idem_txn *txn, void *ctx)
{
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	idem_value p[4] = {IDEM_V_INT(-9007199254740993LL), IDEM_V_TEXT("it's ?"),
	                   IDEM_V_BLOB(bytes, sizeof(bytes)), IDEM_V_NULL};
	char ddl[160];
	int rc;

	(void)ctx;
	snprintf(ddl, sizeof(ddl),
	         "CREATE TABLE typed (i BIGINT, t TEXT, b %s, n INTEGER,"
	         " note TEXT DEFAULT 'what? no')",
	         is_pg() ? "BYTEA" : "BLOB");
	if ((rc = idem_txn_exec(txn, ddl, NULL, 0, NULL)) < 0)
		return rc;
	/* '?' in a literal and a comment is not a placeholder. */
	return idem_txn_exec(txn,
	                     "INSERT INTO typed (i, t, b, n, note) /* why? */"
	                     " VALUES (?, ?, ?, ?, 'really?') -- or?\n",
	                     p, 4, NULL);
}

/*
 * Values come back as they went in: a BIGINT beyond a double's precision,
 * text with a '?', bytes with NUL and 0xff, NULL; the row found by the
 * literal 'really?' (the column's default 'what? no' not taken). An aggregate the server
 * types as a decimal (PostgreSQL's sum(bigint) is numeric, MariaDB's SUM()
 * DECIMAL) and a boolean are still integers to callers. The placeholder
 * count is checked before anything runs.
 */
static void value_types_and_placeholders(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	test_row r = {0};

	assert_int_equal(idem_store_transact(f->store, make_types, NULL), 0);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT i, t, b, n, i + 1, sum(i) OVER (), true, 'x'"
	                                  " FROM typed WHERE t = ? AND note = 'really?'",
	                                  &IDEM_V_TEXT("it's ?"), 1, test_copy_row, &r),
	                 0);
	assert_int_equal(r.n, 8);
	assert_int_equal(r.v[0].type, IDEM_VAL_INT);
	assert_true(r.v[0].i == -9007199254740993LL);
	assert_int_equal(r.v[1].type, IDEM_VAL_TEXT);
	assert_string_equal(r.text[1], "it's ?");
	assert_int_equal(r.v[2].type, IDEM_VAL_BLOB);
	assert_int_equal(r.v[2].len, sizeof(bytes));
	assert_memory_equal(r.blob, bytes, sizeof(bytes));
	assert_int_equal(r.v[3].type, IDEM_VAL_NULL);
	assert_true(r.v[4].i == -9007199254740992LL);
	assert_int_equal(r.v[5].type, IDEM_VAL_INT);
	assert_true(r.v[5].i == -9007199254740993LL);
	assert_int_equal(r.v[6].type, IDEM_VAL_INT);
	assert_int_equal(r.v[6].i, 1);
	assert_int_equal(r.v[7].type, IDEM_VAL_TEXT);
	assert_string_equal(r.text[7], "x");
	assert_int_equal(idem_store_query(f->store, "SELECT ?, ?", &IDEM_V_INT(1), 1, NULL, NULL),
	                 IDEM_EINVAL);
}

static int make_orders(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn, "CREATE TABLE orders (no VARCHAR(32) NOT NULL UNIQUE)", NULL, 0,
	                     NULL);
}

static int insert_o1(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn, "INSERT INTO orders (no) VALUES ('o1')", NULL, 0, NULL);
}

/*
 * After a failed idem_txn_try_exec the unit's transaction goes on, as on
 * SQLite (plain idem_txn_exec saves the round trips and leaves the
 * transaction to the unit's savepoint instead).
 */
static int conflict_then_continue(idem_txn *txn, void *ctx)
{
	int64_t n = 0;
	int rc;

	(void)ctx;
	rc = idem_txn_try_exec(txn, "INSERT INTO orders (no) VALUES ('o1')", NULL, 0, NULL);
	assert_int_equal(rc, IDEM_ECONFLICT);
	assert_detail("23505", 1062);
	rc = idem_txn_try_exec(txn, "INSERT INTO orders (no) VALUES (NULL)", NULL, 0, NULL);
	assert_int_equal(rc, IDEM_ECONSTRAINT);
	assert_detail("23502", 1048);
	assert_int_equal(idem_txn_try_exec(txn, "INSERT INTO nowhere VALUES (1)", NULL, 0, NULL),
	                 IDEM_ESTORE);
	assert_detail("42P01", 1146);
	if ((rc = idem_txn_exec(txn, "INSERT INTO orders (no) VALUES ('o2')", NULL, 0, NULL)) < 0)
		return rc;
	if ((rc = idem_txn_query(txn, "SELECT count(*) FROM orders", NULL, 0, test_first_int, &n)) <
	    0)
		return rc;
	assert_int_equal(n, 2);
	return 0;
}

static void failed_statement_keeps_transaction(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	int64_t n = 0;

	assert_int_equal(idem_store_transact(f->store, make_orders, NULL), 0);
	assert_int_equal(idem_store_transact(f->store, insert_o1, NULL), 0);
	assert_int_equal(idem_store_transact(f->store, conflict_then_continue, NULL), 0);
	assert_int_equal(
	    idem_store_query(f->store, "SELECT count(*) FROM orders", NULL, 0, test_first_int, &n),
	    0);
	assert_int_equal(n, 2);
}

static int insert_keys(idem_txn *txn, void *ctx)
{
	const char *keys[] = {"A1", "a1", "A1 ", "A1\t", " A1"};
	const char *ins = "INSERT INTO idem_records (scope, business_type, idem_key, version,"
	                  " status, fingerprint, created_at, expires_at)"
	                  " VALUES ('s', 'payment', ?, 1, 'SUCCEEDED', 'f', ?, 0)";
	int rc;

	(void)ctx;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		idem_value p[2] = {IDEM_V_TEXT(keys[i]), IDEM_V_INT(i)};

		if ((rc = idem_txn_exec(txn, ins, p, 2, NULL)) < 0)
			return rc;
	}
	/* The same bytes again: the idempotency index refuses it. */
	rc = idem_txn_try_exec(txn, ins, (idem_value[]){IDEM_V_TEXT("A1"), IDEM_V_INT(9)}, 2, NULL);
	assert_int_equal(rc, IDEM_ECONFLICT);
	assert_detail("23505", 1062);
	return 0;
}

/*
 * Keys compare byte for byte in the idempotency index itself: not
 * case-folded (a _ci collation would), not padded (utf8mb4_bin would make
 * 'A1 ' equal 'A1'), not locale-ordered (PostgreSQL's COLLATE "C").
 */
static void keys_are_bytes(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	unit u = {0};
	idem_result res = {0};
	int64_t n = -1;

	assert_int_equal(idem_store_transact(f->store, insert_keys, NULL), 0);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT count(*) FROM idem_records WHERE scope = 's'"
	                                  " AND business_type = 'payment' AND idem_key = ?",
	                                  &IDEM_V_TEXT("A1"), 1, test_first_int, &n),
	                 0);
	assert_int_equal(n, 1);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT count(*) FROM idem_records WHERE scope = 's'",
	                                  NULL, 0, test_first_int, &n),
	                 0);
	assert_int_equal(n, 5);
	/* Through the claim path too. */
	assert_int_equal(run_unit(f, "A1", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(run_unit(f, "a1", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(run_unit(f, "A1", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
	assert_int_equal(u.calls, 2);
}

/*
 * NOT NULL, CHECK and a value too long for its column (MariaDB in
 * STRICT_ALL_TABLES: refused, not truncated) are errors, never duplicates:
 * nothing of the unit is committed and the key stays free.
 */
static void constraint_errors_are_not_duplicates(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	unit u = {0};
	idem_result res = {0};
	idem_record_info info;
	char sql[600];

	u.sql = "INSERT INTO work_log (scope, k, worker) VALUES (NULL, 'x', 1)";
	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_ECONSTRAINT);
	assert_detail("23502", 1048);
	assert_int_equal(res.outcome, 0);
	u.sql = "INSERT INTO work_log (scope, k, worker) VALUES ('s', 'x', -1)";
	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_ECONSTRAINT);
	assert_detail("23514", 4025);
	snprintf(sql, sizeof(sql),
	         "INSERT INTO work_log (scope, k, worker) VALUES ('%0300d', 'x', 1)", 0);
	u.sql = sql;
	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_ESTORE);
	assert_detail("22001", 1406);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	u.sql = NULL;
	assert_int_equal(run_unit(f, "K", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 1);
}

static int update_both(idem_txn *txn, void *ctx)
{
	int rc;

	(void)ctx;
	if ((rc = idem_txn_exec(txn, "CREATE TABLE acc (a BIGINT NOT NULL, b VARCHAR(8) NOT NULL)",
	                        NULL, 0, NULL)) < 0 ||
	    (rc = idem_txn_exec(txn, "INSERT INTO acc (a, b) VALUES (1, 'x')", NULL, 0, NULL)) < 0)
		return rc;
	return idem_txn_exec(txn,
	                     "UPDATE acc SET a = a + ?, b = CASE WHEN a + ? = 3 THEN 'full'"
	                     " ELSE 'part' END",
	                     (idem_value[]){IDEM_V_INT(2), IDEM_V_INT(2)}, 2, NULL);
}

/*
 * The SET list of an UPDATE sees the row's old values, as on SQLite: left
 * to right (MariaDB without the SIMULTANEOUS_ASSIGNMENT mode its driver
 * sets), b would see a = 3 and say 'part'.
 */
static void update_sees_old_values(void **state)
{
	test_net_fixture *f = test_net_open(state, backend, 1);
	test_row r = {0};

	assert_int_equal(idem_store_transact(f->store, update_both, NULL), 0);
	assert_int_equal(
	    idem_store_query(f->store, "SELECT a, b FROM acc", NULL, 0, test_copy_row, &r), 0);
	assert_int_equal(r.v[0].i, 3);
	assert_string_equal(r.text[1], "full");
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, test_net_setup, test_net_teardown)

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
	    T(numeric_range_is_invalid),
	    T(connection_left_in_transaction_is_dropped),
	    T(killed_idle_connections_recover),
	    T(killed_mid_unit_is_unavailable),
	    T(unanswered_call_is_unavailable),
	    T(request_deadline_bounds_a_statement),
	    T(ping_does_not_queue_behind_readers),
	    T(silent_server_fails_by_the_deadline),
	    T(newer_schema_is_refused),
	    T(migrations_race_across_processes),
	    T(url_schemes_and_refusals),
	    T(value_types_and_placeholders),
	    T(failed_statement_keeps_transaction),
	    T(keys_are_bytes),
	    T(constraint_errors_are_not_duplicates),
	    T(update_sees_old_values),
	};

	backend = argc > 1 ? argv[1] : "postgres";
	if (strcmp(backend, "postgres") != 0 && strcmp(backend, "mariadb") != 0) {
		fprintf(stderr, "usage: test_netdb postgres|mariadb\n");
		return 2;
	}
	return cmocka_run_group_tests_name(backend, tests, NULL, NULL);
}
