/*
 * store/sqlite.c: the embedded SQLite backend.
 *
 * One writer connection, guarded by a mutex held for the whole write
 * transaction (SQLite has one writer per database anyway; BEGIN IMMEDIATE
 * takes the file's write lock up front, so a second process waits on the
 * busy timeout instead of failing half way). A small pool of reader
 * connections answers replays in WAL mode without touching the writer.
 * Statements are prepared once per connection and reused.
 *
 * Error classification is exact: only SQLITE_CONSTRAINT_UNIQUE (2067) and
 * SQLITE_CONSTRAINT_PRIMARYKEY (1555) on the claim INSERT mean "duplicate";
 * BUSY and LOCKED mean "retry"; anything else is an error and never taken for
 * a duplicate. This file must never print or read the environment.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/backend.h"
#include "store/schema.h"
#include "util/error.h"

#define STMT_CACHE 48
#define MAX_COLS   32

typedef struct {
	sqlite3 *db;
	int ncache;
	struct {
		char *sql; /* our own copy: callers may pass stack buffers */
		uint64_t hash;
		sqlite3_stmt *st;
	} cache[STMT_CACHE];
} conn;

typedef struct {
	struct idem_txn base;
	idem__backend *be;
} sqlite_txn;

struct idem__backend {
	idem_store *store;
	char *path;
	int memory;
	idem_store_opts opts;

	pthread_mutex_t wlock; /* held from BEGIN to COMMIT/ROLLBACK */
	int wreentered;        /* reads nested in the holder's transaction (holder only) */
	idem__backend *wprev;  /* the holder's wlock_held before it took this one */
	conn writer;
	sqlite_txn txn;

	pthread_mutex_t rlock;
	pthread_cond_t rcond;
	conn *readers;
	int nreaders;
	int *free_readers; /* stack of indexes into readers */
	int nfree;
};

/* ---- errors ---------------------------------------------------------- */

typedef enum { CTX_PLAIN, CTX_CLAIM, CTX_BUSINESS } err_ctx;

/* Map a failed SQLite call to an idem code; records the driver detail. */
static int fail(sqlite3 *db, int rc, err_ctx ctx, const char *what)
{
	int ext = db ? sqlite3_extended_errcode(db) : rc;
	const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
	int code;

	if ((rc & 0xff) != (ext & 0xff))
		ext = rc; /* the connection's code belongs to another call */
	switch (ext & 0xff) {
	case SQLITE_CONSTRAINT:
		if (ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY) {
			if (ctx == CTX_CLAIM)
				return IDEM__DUPLICATE;
			code = ctx == CTX_BUSINESS ? IDEM_ECONFLICT : IDEM_ESTORE;
		} else {
			code = IDEM_ECONSTRAINT;
		}
		break;
	case SQLITE_BUSY:
	case SQLITE_LOCKED: code = IDEM_ERETRY; break;
	case SQLITE_NOTADB:
	case SQLITE_CORRUPT: code = IDEM_ECORRUPT; break;
	case SQLITE_CANTOPEN:
	case SQLITE_IOERR:
	case SQLITE_READONLY:
	case SQLITE_PERM:
	case SQLITE_AUTH: code = IDEM_EUNAVAIL; break;
	case SQLITE_NOMEM: code = IDEM_ENOMEM; break;
	default: code = IDEM_ESTORE; break;
	}
	return idem__error_driver(code, ext, NULL, "sqlite: %s: %s (extended code %d)", what, msg,
	                          ext);
}

/* ---- statements ------------------------------------------------------ */

static int prepare(conn *c, const char *sql, sqlite3_stmt **out, int *cached)
{
	uint64_t h = 14695981039346656037ULL;
	int rc;

	/* A request runs about ten statements: compare hashes, not SQL texts. */
	for (const unsigned char *p = (const unsigned char *)sql; *p; p++)
		h = (h ^ *p) * 1099511628211ULL;
	for (int i = 0; i < c->ncache; i++)
		if (c->cache[i].hash == h && strcmp(c->cache[i].sql, sql) == 0) {
			*out = c->cache[i].st;
			*cached = 1;
			return 0;
		}
	*cached = c->ncache < STMT_CACHE;
	rc = sqlite3_prepare_v3(c->db, sql, -1, *cached ? SQLITE_PREPARE_PERSISTENT : 0, out, NULL);
	if (rc != SQLITE_OK)
		return fail(c->db, rc, CTX_PLAIN, "prepare");
	if (*cached) {
		char *copy = strdup(sql);

		if (!copy) {
			sqlite3_finalize(*out);
			return idem__error(IDEM_ENOMEM, "out of memory");
		}
		c->cache[c->ncache].sql = copy;
		c->cache[c->ncache].hash = h;
		c->cache[c->ncache].st = *out;
		c->ncache++;
	}
	return 0;
}

static int bind(conn *c, sqlite3_stmt *st, const idem_value *params, int n)
{
	if (n != sqlite3_bind_parameter_count(st))
		return idem__error(IDEM_EINVAL, "statement takes %d parameters, %d given",
		                   sqlite3_bind_parameter_count(st), n);
	for (int i = 0; i < n; i++) {
		const idem_value *v = &params[i];
		int rc;

		switch (v->type) {
		case IDEM_VAL_INT: rc = sqlite3_bind_int64(st, i + 1, v->i); break;
		case IDEM_VAL_TEXT:
			rc = sqlite3_bind_text64(st, i + 1, v->p ? v->p : "", v->len, SQLITE_STATIC,
			                         SQLITE_UTF8);
			break;
		case IDEM_VAL_BLOB:
			rc = v->len ? sqlite3_bind_blob64(st, i + 1, v->p, v->len, SQLITE_STATIC)
			            : sqlite3_bind_zeroblob(st, i + 1, 0);
			break;
		default: rc = sqlite3_bind_null(st, i + 1); break;
		}
		if (rc != SQLITE_OK)
			return fail(c->db, rc, CTX_PLAIN, "bind");
	}
	return 0;
}

/*
 * Run sql on c with params; call fn per row; report changes. The one place
 * SQL is executed, so every path gets the same classification and cleanup.
 */
static int run(conn *c, const char *sql, const idem_value *params, int n, idem_row_fn fn, void *ctx,
               int64_t *changes, err_ctx ectx)
{
	sqlite3_stmt *st = NULL;
	int cached = 0, rc, step;

	if ((rc = prepare(c, sql, &st, &cached)) < 0)
		return rc;
	if ((rc = bind(c, st, params, n)) < 0)
		goto done;
	while ((step = sqlite3_step(st)) == SQLITE_ROW) {
		idem_value cols[MAX_COLS];
		int ncols = sqlite3_column_count(st);

		if (!fn)
			continue;
		if (ncols > MAX_COLS) {
			rc = idem__error(IDEM_EINVAL, "query returns more than %d columns",
			                 MAX_COLS);
			goto done;
		}
		for (int i = 0; i < ncols; i++) {
			switch (sqlite3_column_type(st, i)) {
			case SQLITE_INTEGER:
			case SQLITE_FLOAT: cols[i] = IDEM_V_INT(sqlite3_column_int64(st, i)); break;
			case SQLITE_TEXT:
				cols[i] = IDEM_V_TEXTN((const char *)sqlite3_column_text(st, i),
				                       (size_t)sqlite3_column_bytes(st, i));
				break;
			case SQLITE_BLOB:
				cols[i] = IDEM_V_BLOB(sqlite3_column_blob(st, i),
				                      (size_t)sqlite3_column_bytes(st, i));
				break;
			default: cols[i] = IDEM_V_NULL; break;
			}
		}
		if ((rc = fn(ctx, cols, ncols)) != 0) {
			rc = rc > 0 ? 0 : rc;
			goto done;
		}
	}
	if (step != SQLITE_DONE) {
		rc = fail(c->db, step, ectx, "step");
		goto done;
	}
	if (changes)
		*changes = sqlite3_changes64(c->db);
done:
	if (cached) {
		sqlite3_reset(st);
		sqlite3_clear_bindings(st);
	} else {
		sqlite3_finalize(st);
	}
	return rc;
}

static int exec_plain(conn *c, const char *sql)
{
	return run(c, sql, NULL, 0, NULL, NULL, NULL, CTX_PLAIN);
}

/* ---- connections ----------------------------------------------------- */

static void conn_close(conn *c)
{
	for (int i = 0; i < c->ncache; i++) {
		sqlite3_finalize(c->cache[i].st);
		free(c->cache[i].sql);
	}
	c->ncache = 0;
	if (c->db)
		sqlite3_close_v2(c->db);
	c->db = NULL;
}

static int conn_open(conn *c, idem__backend *be, int reader)
{
	int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
	char pragma[64];
	int rc;

	memset(c, 0, sizeof(*c));
	if (!be->memory && !reader) {
		/* A new database file is the owner's only (it holds channel secrets);
		 * SQLite gives -wal and -shm the main file's mode. An existing file
		 * keeps the mode it has. */
		int fd = open(be->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

		if (fd >= 0)
			close(fd);
	}
	rc = sqlite3_open_v2(be->path, &c->db, flags, NULL);
	if (rc != SQLITE_OK) {
		rc = fail(c->db, rc, CTX_PLAIN, be->path);
		conn_close(c);
		return rc;
	}
	sqlite3_extended_result_codes(c->db, 1);
	sqlite3_busy_timeout(c->db, be->opts.busy_timeout_ms);
	snprintf(pragma, sizeof(pragma), "PRAGMA synchronous=%s",
	         be->opts.synchronous_full ? "FULL" : "NORMAL");
	/* The first statement reads the file header: a non-database fails here. */
	if ((!be->memory && !reader && (rc = exec_plain(c, "PRAGMA journal_mode=WAL")) < 0) ||
	    (rc = exec_plain(c, pragma)) < 0 ||
	    (rc = exec_plain(c, "PRAGMA foreign_keys=ON")) < 0 ||
	    (reader && (rc = exec_plain(c, "PRAGMA query_only=1")) < 0) ||
	    (rc = exec_plain(c, "SELECT count(*) FROM sqlite_schema")) < 0) {
		conn_close(c);
		return rc;
	}
	return 0;
}

/*
 * The backend whose write lock this thread holds (between BEGIN and
 * COMMIT/ROLLBACK, or in a migration), NULL otherwise. Thread-local, so only
 * the owning thread ever reads or writes it.
 */
static _Thread_local idem__backend *wlock_held;

static void wlock_take(idem__backend *be)
{
	pthread_mutex_lock(&be->wlock);
	be->wprev = wlock_held; /* another store's transaction on this thread */
	wlock_held = be;
}

static void wlock_drop(idem__backend *be)
{
	wlock_held = be->wprev;
	pthread_mutex_unlock(&be->wlock);
}

/*
 * A connection for a read. Without reader connections (sqlite::memory:, or
 * read_connections 0) the writer answers reads. A thread that already holds
 * the writer (a read from inside its own transaction: a unit of work calling
 * idem_store_query) uses it as it is: taking the lock again would deadlock
 * on itself. That read then sees the transaction's own uncommitted writes:
 * there is no other connection to see the database through.
 */
static conn *reader_get(idem__backend *be)
{
	conn *c;

	if (be->nreaders == 0) {
		if (wlock_held != be)
			pthread_mutex_lock(&be->wlock);
		else
			be->wreentered++;
		return &be->writer;
	}
	pthread_mutex_lock(&be->rlock);
	while (be->nfree == 0)
		pthread_cond_wait(&be->rcond, &be->rlock);
	c = &be->readers[be->free_readers[--be->nfree]];
	pthread_mutex_unlock(&be->rlock);
	return c;
}

static void reader_put(idem__backend *be, conn *c)
{
	if (c == &be->writer) {
		if (be->wreentered > 0)
			be->wreentered--; /* the transaction still holds the lock */
		else
			pthread_mutex_unlock(&be->wlock);
		return;
	}
	pthread_mutex_lock(&be->rlock);
	be->free_readers[be->nfree++] = (int)(c - be->readers);
	pthread_cond_signal(&be->rcond);
	pthread_mutex_unlock(&be->rlock);
}

/* ---- schema ---------------------------------------------------------- */

static int version_in(conn *c, int *out)
{
	int64_t v = 0;
	int has = 0;
	int rc = run(c, "SELECT count(*) FROM sqlite_schema WHERE name = 'idem_schema_version'",
	             NULL, 0, idem_row_int, &v, NULL, CTX_PLAIN);

	if (rc < 0)
		return rc;
	has = v > 0;
	v = 0;
	if (has && (rc = run(c, "SELECT coalesce(max(version), 0) FROM idem_schema_version", NULL,
	                     0, idem_row_int, &v, NULL, CTX_PLAIN)) < 0)
		return rc;
	*out = (int)v;
	return 0;
}

static int sqlite_schema_version(idem__backend *be, int *out)
{
	conn *c = reader_get(be);
	int rc = version_in(c, out);

	reader_put(be, c);
	return rc;
}

/* 0 when PRAGMA foreign_key_check finds no violation, IDEM_ESCHEMA else. */
static int foreign_keys_intact(conn *c)
{
	sqlite3_stmt *st = NULL;
	int src = sqlite3_prepare_v2(c->db, "PRAGMA foreign_key_check", -1, &st, NULL);

	if (src != SQLITE_OK)
		return fail(c->db, src, CTX_PLAIN, "foreign key check");
	src = sqlite3_step(st);
	sqlite3_finalize(st);
	if (src == SQLITE_ROW)
		return idem__error(IDEM_ESCHEMA, "migration left a foreign key violation");
	if (src != SQLITE_DONE)
		return fail(c->db, src, CTX_PLAIN, "foreign key check");
	return 0;
}

/*
 * After a migration that wrote sqlite_master itself (PRAGMA writable_schema,
 * schema_sqlite.c version 7): one more on the schema cookie, as SQLite's
 * procedure asks, so every connection (this one, the readers, another
 * process) parses the schema again before its next statement.
 */
static int schema_cookie_bump(conn *c)
{
	char sql[64];
	int64_t v = -1;
	int rc = run(c, "PRAGMA schema_version", NULL, 0, idem_row_int, &v, NULL, CTX_PLAIN);

	if (rc < 0)
		return rc;
	if (v < 0)
		return idem__error(IDEM_ESCHEMA, "cannot read the schema cookie");
	snprintf(sql, sizeof(sql), "PRAGMA schema_version=%lld", (long long)v + 1);
	return exec_plain(c, sql);
}

/*
 * Each pending version runs in the same BEGIN IMMEDIATE transaction as the
 * row recording it, so two processes migrating at once serialise on the
 * write lock and the second finds the work done.
 */
static int sqlite_migrate(idem__backend *be, int *version_out)
{
	conn *c = &be->writer;
	int cur = 0, rc;
	char *errmsg = NULL;

	wlock_take(be);
	/* A migration may rebuild a table (schema_sqlite.c, version 4): SQLite's
	 * procedure for that runs with foreign keys off (the pragma is a no-op
	 * inside a transaction) and checks them before COMMIT. */
	if ((rc = exec_plain(c, "PRAGMA foreign_keys=OFF")) < 0)
		goto unlock;
	if ((rc = exec_plain(c, "BEGIN IMMEDIATE")) < 0)
		goto unlock;
	if ((rc = exec_plain(c, "CREATE TABLE IF NOT EXISTS idem_schema_version ("
	                        " version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")) <
	        0 ||
	    (rc = version_in(c, &cur)) < 0)
		goto rollback;
	if (cur > IDEM__SQLITE_SCHEMA_LATEST) {
		rc = idem__error(IDEM_ESCHEMA,
		                 "database schema version %d is newer than this library's %d", cur,
		                 IDEM__SQLITE_SCHEMA_LATEST);
		goto rollback;
	}
	for (int v = cur + 1; v <= IDEM__SQLITE_SCHEMA_LATEST; v++) {
		idem_value p[2] = {IDEM_V_INT(v), IDEM_V_INT(be->opts.clock(be->opts.clock_ctx))};
		int src = sqlite3_exec(c->db, idem__sqlite_migrations[v - 1], NULL, NULL, &errmsg);

		if (src != SQLITE_OK) {
			rc = fail(c->db, src, CTX_PLAIN, "migration");
			sqlite3_free(errmsg);
			goto rollback;
		}
		if (strstr(idem__sqlite_migrations[v - 1], "writable_schema") &&
		    (rc = schema_cookie_bump(c)) < 0)
			goto rollback;
		if ((rc = run(c,
		              "INSERT INTO idem_schema_version (version, applied_at) VALUES (?, ?)",
		              p, 2, NULL, NULL, NULL, CTX_PLAIN)) < 0)
			goto rollback;
		cur = v;
	}
	if ((rc = foreign_keys_intact(c)) < 0 || (rc = exec_plain(c, "COMMIT")) < 0)
		goto rollback;
	if (version_out)
		*version_out = cur;
	goto unlock;
rollback:
	sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
unlock:
	if (exec_plain(c, "PRAGMA foreign_keys=ON") < 0 && rc == 0)
		rc = idem__error(IDEM_ESTORE, "cannot turn foreign keys back on after migrating");
	wlock_drop(be);
	return rc;
}

/* ---- open / close ---------------------------------------------------- */

static void sqlite_close(idem__backend *be)
{
	if (!be)
		return;
	for (int i = 0; i < be->nreaders; i++)
		conn_close(&be->readers[i]);
	conn_close(&be->writer);
	free(be->readers);
	free(be->free_readers);
	pthread_mutex_destroy(&be->wlock);
	pthread_mutex_destroy(&be->rlock);
	pthread_cond_destroy(&be->rcond);
	free(be->path);
	free(be);
}

static int sqlite_open(idem__backend **out, idem_store *store, const char *target,
                       const idem_store_opts *opts)
{
	idem__backend *be = NULL;
	int rc;

	*out = NULL;
	if (!target || !*target)
		return idem__error(IDEM_EINVAL, "sqlite URL needs a path: sqlite:PATH");
	if (strncmp(target, "file:", 5) == 0)
		return idem__error(IDEM_EINVAL, "sqlite URIs are not supported: use sqlite:PATH");
	if (!(be = calloc(1, sizeof(*be))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	pthread_mutex_init(&be->wlock, NULL);
	pthread_mutex_init(&be->rlock, NULL);
	pthread_cond_init(&be->rcond, NULL);
	be->store = store;
	be->opts = *opts;
	be->memory = strcmp(target, ":memory:") == 0;
	be->txn.base.store = store;
	be->txn.base.ops = &idem__sqlite_ops;
	be->txn.be = be;
	if (!(be->path = strdup(target))) {
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto done;
	}
	if ((rc = conn_open(&be->writer, be, 0)) < 0)
		goto done;
	if (!be->memory && opts->read_connections > 0) {
		be->readers = calloc((size_t)opts->read_connections, sizeof(conn));
		be->free_readers = calloc((size_t)opts->read_connections, sizeof(int));
		if (!be->readers || !be->free_readers) {
			rc = idem__error(IDEM_ENOMEM, "out of memory");
			goto done;
		}
		for (; be->nreaders < opts->read_connections; be->nreaders++) {
			if ((rc = conn_open(&be->readers[be->nreaders], be, 1)) < 0)
				goto done;
			be->free_readers[be->nfree++] = be->nreaders;
		}
	}
	*out = be;
	be = NULL;
done:
	sqlite_close(be);
	return rc;
}

static int sqlite_ping(idem__backend *be)
{
	conn *c = reader_get(be);
	int rc = exec_plain(c, "SELECT 1");

	reader_put(be, c);
	return rc;
}

/* ---- transactions ---------------------------------------------------- */

static int sqlite_txn_begin(idem__backend *be, idem_txn **out)
{
	int rc;

	*out = NULL;
	wlock_take(be);
	if ((rc = exec_plain(&be->writer, "BEGIN IMMEDIATE")) < 0) {
		wlock_drop(be);
		return rc;
	}
	*out = &be->txn.base;
	return 0;
}

static idem__backend *be_of(idem_txn *txn)
{
	return ((sqlite_txn *)txn)->be;
}

static void sqlite_txn_rollback(idem_txn *txn)
{
	idem__backend *be = be_of(txn);

	/* Fails harmlessly when SQLite already rolled back after an I/O error. */
	sqlite3_exec(be->writer.db, "ROLLBACK", NULL, NULL, NULL);
	wlock_drop(be);
}

static int sqlite_txn_commit(idem_txn *txn)
{
	idem__backend *be = be_of(txn);
	int rc = exec_plain(&be->writer, "COMMIT");

	if (rc < 0) {
		/* Not committed: roll back so the connection is clean for the retry. */
		sqlite_txn_rollback(txn);
		return rc;
	}
	wlock_drop(be);
	return 0;
}

static int savepoint_sql(idem_txn *txn, const char *verb, const char *name)
{
	char sql[96];

	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
			return idem__error(IDEM_EINVAL, "bad savepoint name");
	snprintf(sql, sizeof(sql), "%s %s", verb, name);
	/* Few distinct names exist, so these statements stay in the cache. */
	return exec_plain(&be_of(txn)->writer, sql);
}

static int sqlite_savepoint(idem_txn *txn, const char *name)
{
	return savepoint_sql(txn, "SAVEPOINT", name);
}

static int sqlite_release(idem_txn *txn, const char *name)
{
	return savepoint_sql(txn, "RELEASE", name);
}

static int sqlite_rollback_to(idem_txn *txn, const char *name)
{
	return savepoint_sql(txn, "ROLLBACK TO", name);
}

/* ---- records --------------------------------------------------------- */

static int sqlite_rec_insert(idem_txn *txn, const idem__key *k, idem__record *rec)
{
	static const char sql[] =
	    "INSERT INTO idem_records (scope, business_type, idem_key, version, status,"
	    " fingerprint, owner, lease_until, created_at, expires_at)"
	    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
	conn *c = &be_of(txn)->writer;
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
	int rc = run(c, sql, p, 10, NULL, NULL, NULL, CTX_CLAIM);

	if (rc == 0)
		rec->id = sqlite3_last_insert_rowid(c->db);
	return rc;
}

/* One batch through the expires_at index; a live lease is never purged. */
static int sqlite_purge_batch(idem__backend *be, int64_t now, int batch, int64_t *deleted)
{
	const char *sql = idem__purge_sql;
	idem_value p[3] = {IDEM_V_INT(now), IDEM_V_INT(now), IDEM_V_INT(batch)};
	idem_txn *txn = NULL;
	int rc;

	*deleted = 0;
	if ((rc = sqlite_txn_begin(be, &txn)) < 0)
		return rc;
	if ((rc = run(&be->writer, sql, p, 3, NULL, NULL, deleted, CTX_PLAIN)) < 0) {
		sqlite_txn_rollback(txn);
		return rc;
	}
	return sqlite_txn_commit(txn);
}

/* ---- generic SQL ----------------------------------------------------- */

static int sqlite_txn_exec(idem_txn *txn, const char *sql, const idem_value *params, int n,
                           int64_t *changes)
{
	return run(&be_of(txn)->writer, sql, params, n, NULL, NULL, changes, CTX_BUSINESS);
}

static int sqlite_txn_query(idem_txn *txn, const char *sql, const idem_value *params, int n,
                            idem_row_fn fn, void *ctx)
{
	return run(&be_of(txn)->writer, sql, params, n, fn, ctx, NULL, CTX_BUSINESS);
}

static int sqlite_read_query(idem__backend *be, const char *sql, const idem_value *params, int n,
                             idem_row_fn fn, void *ctx)
{
	conn *c = reader_get(be);
	int rc = run(c, sql, params, n, fn, ctx, NULL, CTX_BUSINESS);

	reader_put(be, c);
	return rc;
}

const idem__backend_ops idem__sqlite_ops = {
    .version = IDEM__BACKEND_OPS_VERSION,
    .name = "sqlite",
    .caps = IDEM__CAP_ONE_WRITER, /* one write transaction per database file */
    .open = sqlite_open,
    .close = sqlite_close,
    .migrate = sqlite_migrate,
    .schema_version = sqlite_schema_version,
    .schema_latest = IDEM__SQLITE_SCHEMA_LATEST,
    .ping = sqlite_ping,
    .txn_begin = sqlite_txn_begin,
    .txn_commit = sqlite_txn_commit,
    .txn_rollback = sqlite_txn_rollback,
    .savepoint = sqlite_savepoint,
    .release = sqlite_release,
    .rollback_to = sqlite_rollback_to,
    .rec_insert = sqlite_rec_insert,
    .rec_takeover = idem__rec_takeover,
    .rec_complete = idem__rec_complete,
    .rec_extend = idem__rec_extend,
    .rec_delete_owned = idem__rec_delete_owned,
    .purge_batch = sqlite_purge_batch,
    .txn_exec = sqlite_txn_exec,
    .txn_query = sqlite_txn_query,
    .read_query = sqlite_read_query,
};
