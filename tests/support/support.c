/* tests/support/support.c: see support.h. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <mysql.h>
#include <openssl/rand.h>

#include "store/mariadb.h"

int64_t test_clock_read(void *ctx)
{
	return atomic_load(&((test_clock *)ctx)->now_ms);
}

void test_clock_advance(test_clock *c, int64_t ms)
{
	atomic_fetch_add(&c->now_ms, ms);
}

/* ---- throwaway databases --------------------------------------------- */

typedef enum { SRV_NONE, SRV_PG, SRV_MY } server_kind;

static server_kind kind_of_url(const char *url)
{
	if (strncmp(url, "postgresql://", 13) == 0 || strncmp(url, "postgres://", 11) == 0)
		return SRV_PG;
	if (strncmp(url, "mysql://", 8) == 0 || strncmp(url, "mariadb://", 10) == 0)
		return SRV_MY;
	return SRV_NONE;
}

const char *test_server_admin_url(const char *backend)
{
	int pg = strcmp(backend, "postgres") == 0;
	const char *var = pg ? "IDEM_TEST_PG_URL" : "IDEM_TEST_MARIADB_URL";
	const char *url = getenv(var);

	if (url && *url)
		return url;
	/* Visible in the test output: a missing server must never pass silently. */
	fprintf(stderr,
	        "SKIPPED: %s not set: no %s server (scripts/db-up.sh starts one; "
	        "scripts/deps.sh --all installs it)\n",
	        var, pg ? "PostgreSQL" : "MariaDB");
	skip();
	return NULL;
}

/*
 * The admin URL test_db_url and test_db_drop work under, or NULL for SQLite.
 * IDEM_TEST_URL is a store URL, or the name of a server backend whose admin
 * URL scripts/db-up.sh exported. Without that server the whole program is
 * skipped (exit 77, ctest's SKIP_RETURN_CODE): cmocka cannot skip from a
 * setup function, and the contract suite opens its store there.
 */
static const char *admin_url(void)
{
	const char *env = getenv("IDEM_TEST_URL");
	const char *var = NULL;

	if (!env || !*env)
		return NULL;
	if (strcmp(env, "postgres") == 0)
		var = "IDEM_TEST_PG_URL";
	else if (strcmp(env, "mariadb") == 0)
		var = "IDEM_TEST_MARIADB_URL";
	else
		return kind_of_url(env) == SRV_NONE ? NULL : env;
	if (!getenv(var) || !*getenv(var)) {
		fprintf(stderr,
		        "SKIPPED: IDEM_TEST_URL=%s but %s is not set: no server binary "
		        "(scripts/db-up.sh starts one; scripts/deps.sh --all installs it)\n",
		        env, var);
		fflush(NULL);
		_exit(77);
	}
	return getenv(var);
}

/* url with its path (the database) replaced by db. Caller frees. */
static char *url_with_db(const char *url, const char *db)
{
	const char *auth = strstr(url, "://");
	const char *path, *query;
	size_t size;
	char *out;

	assert_non_null(auth);
	auth += 3;
	path = auth + strcspn(auth, "/?");
	query = path + strcspn(path, "?");
	size = (size_t)(path - url) + strlen(db) + strlen(query) + 2;
	out = malloc(size);
	assert_non_null(out);
	snprintf(out, size, "%.*s/%s%s", (int)(path - url), url, db, query);
	return out;
}

/* The database name of a URL url_with_db made (after the last '/'). */
static void db_of(const char *url, char *out, size_t size)
{
	const char *slash = strrchr(url, '/');
	size_t n = slash ? strcspn(slash + 1, "?") : 0;

	snprintf(out, size, "%.*s", (int)n, slash ? slash + 1 : "");
}

/* Run one admin statement (no parameters: names are ours, [a-z0-9_]). */
static void admin_exec(const char *admin, const char *sql)
{
	if (kind_of_url(admin) == SRV_PG) {
		PGconn *pg = PQconnectdb(admin);
		PGresult *res;

		if (PQstatus(pg) != CONNECTION_OK)
			fail_msg("admin connect: %s", PQerrorMessage(pg));
		res = PQexec(pg, sql);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			fail_msg("%s: %s", sql, PQresultErrorMessage(res));
		PQclear(res);
		PQfinish(pg);
	} else {
		MYSQL *my = idem__mariadb_connect(admin);

		if (!my)
			fail_msg("admin connect: %s", idem_error_last()->message);
		if (mysql_query(my, sql) != 0)
			fail_msg("%s: %s", sql, mysql_error(my));
		mysql_close(my);
	}
}

char *test_db_url(void)
{
	const char *env = getenv("IDEM_TEST_URL");
	const char *admin = admin_url();
	char tmpl[] = "/tmp/idem-test-XXXXXX";
	char *url;

	if (admin) {
		unsigned char r[8];
		char db[40], sql[160];

		assert_int_equal(RAND_bytes(r, sizeof(r)), 1);
		snprintf(db, sizeof(db), "idem_t_%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1],
		         r[2], r[3], r[4], r[5], r[6], r[7]);
		/* Binary collation by default, so business tables compare
		 * byte for byte too, as on the other backends. */
		snprintf(sql, sizeof(sql),
		         kind_of_url(admin) == SRV_PG
		             ? "CREATE DATABASE %s"
		             : "CREATE DATABASE %s CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
		         db);
		admin_exec(admin, sql);
		return url_with_db(admin, db);
	}
	if (env && *env)
		return strdup(env);
	assert_non_null(mkdtemp(tmpl));
	url = malloc(strlen(tmpl) + 32);
	assert_non_null(url);
	snprintf(url, strlen(tmpl) + 32, "sqlite:%s/t.db", tmpl);
	return url;
}

void test_db_drop(const char *url)
{
	char path[512], dir[512];
	const char *suffix[] = {"", "-wal", "-shm", "-journal"};

	if (kind_of_url(url) != SRV_NONE) {
		const char *admin = admin_url();
		char db[64], sql[128];

		db_of(url, db, sizeof(db));
		/* Only what test_db_url made: never an arbitrary database. */
		if (!admin || strncmp(db, "idem_t_", 7) != 0)
			return;
		snprintf(sql, sizeof(sql),
		         kind_of_url(admin) == SRV_PG ? "DROP DATABASE IF EXISTS %s WITH (FORCE)"
		                                      : "DROP DATABASE IF EXISTS %s",
		         db);
		admin_exec(admin, sql);
		return;
	}
	if (strncmp(url, "sqlite:", 7) != 0 || strcmp(url, "sqlite::memory:") == 0)
		return;
	for (size_t i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s%s", url + 7, suffix[i]);
		unlink(path);
	}
	snprintf(dir, sizeof(dir), "%s", url + 7);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		rmdir(dir);
	}
}

idem_store *test_store_open(const char *url, test_clock *clock)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	int rc;

	if (clock) {
		if (atomic_load(&clock->now_ms) == 0)
			atomic_store(&clock->now_ms, 1800000000000LL);
		opts.clock = test_clock_read;
		opts.clock_ctx = clock;
	}
	/* The same suites run again with group commit and the front cache on. */
	if (getenv("IDEM_TEST_BATCH")) {
		opts.batch_max = (int)strtol(getenv("IDEM_TEST_BATCH"), NULL, 10);
		opts.writers = 2;
	}
	if (getenv("IDEM_TEST_CACHE")) {
		opts.cache_bytes = 8u << 20;
		opts.cache_entries = 100000;
	}
	rc = idem_store_open(&store, url, &opts);
	if (rc != 0)
		fail_msg("idem_store_open(%s): %d %s", url, rc, idem_error_last()->message);
	return store;
}

void test_scope(char out[40])
{
	unsigned char r[8];

	assert_int_equal(RAND_bytes(r, sizeof(r)), 1);
	snprintf(out, 40, "t_%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5],
	         r[6], r[7]);
}

static int create_work_log(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn,
	                     "CREATE TABLE IF NOT EXISTS work_log ("
	                     " scope VARCHAR(64) NOT NULL, k VARCHAR(255) NOT NULL,"
	                     " worker INTEGER NOT NULL CHECK (worker >= 0))",
	                     NULL, 0, NULL);
}

void test_create_work_log(idem_store *store)
{
	int rc = idem_store_transact(store, create_work_log, NULL);

	if (rc != 0)
		fail_msg("create work_log: %d %s", rc, idem_error_last()->message);
}

static int first_int(void *ctx, const idem_value *cols, int n)
{
	*(int64_t *)ctx = n > 0 ? cols[0].i : -1;
	return 1;
}

int64_t test_work_count(idem_store *store, const char *scope, const char *key)
{
	idem_value p[2] = {IDEM_V_TEXT(scope), IDEM_V_TEXT(key)};
	int64_t n = -1;
	int rc = idem_store_query(store, "SELECT count(*) FROM work_log WHERE scope = ? AND k = ?",
	                          p, 2, first_int, &n);

	assert_int_equal(rc, 0);
	return n;
}

void test_fp(char out[65], const char *json)
{
	assert_int_equal(idem_fingerprint(out, "POST", "/v1/test", json, strlen(json)), 0);
}

int test_net_setup(void **state)
{
	*state = calloc(1, sizeof(test_net_fixture));
	return *state ? 0 : -1;
}

test_net_fixture *test_net_open(void **state, const char *backend, int with_store)
{
	test_net_fixture *f = *state;

	(void)test_server_admin_url(backend);
	setenv("IDEM_TEST_URL", backend, 1);
	f->url = test_db_url();
	if (with_store) {
		f->store = test_store_open(f->url, NULL);
		test_scope(f->scope);
		test_create_work_log(f->store);
	}
	return f;
}

int test_net_teardown(void **state)
{
	test_net_fixture *f = *state;

	idem_store_close(f->store);
	if (f->url) {
		test_db_drop(f->url);
		free(f->url);
	}
	free(f);
	return 0;
}

int test_first_int(void *ctx, const idem_value *cols, int n)
{
	*(int64_t *)ctx = n > 0 && cols[0].type == IDEM_VAL_INT ? cols[0].i : -1;
	return 1;
}

int test_copy_row(void *ctx, const idem_value *cols, int n)
{
	test_row *r = ctx;

	r->n = n;
	for (int i = 0; i < n && i < 8; i++) {
		r->v[i] = cols[i];
		if (cols[i].type == IDEM_VAL_BLOB) {
			assert_true(cols[i].len <= sizeof(r->blob));
			memcpy(r->blob, cols[i].p, cols[i].len);
		} else if (cols[i].type == IDEM_VAL_TEXT) {
			snprintf(r->text[i], sizeof(r->text[i]), "%.*s", (int)cols[i].len,
			         (const char *)cols[i].p);
		}
	}
	return 1;
}
