/*
 * idem/store.h: opening a store (SQLite today; PostgreSQL and MariaDB plug in
 * behind the same calls), schema migrations, purge, and the generic SQL
 * interface business code uses inside a unit's transaction. The SQL passed
 * here is the subset every backend shares: `?` placeholders, no upserts, no
 * dialect functions. Values are always bound, never pasted into SQL.
 * NULL handle or required pointer: IDEM_EINVAL (idem/common.h).
 */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include <string.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct idem_store idem_store;
typedef struct idem_txn idem_txn;

/* Milliseconds since the Unix epoch, as the library's clock reads them. */
typedef int64_t (*idem_clock_fn)(void *ctx);

#define IDEM_STORE_OPTS_VERSION 1

typedef struct {
	unsigned int version;     /* IDEM_STORE_OPTS_VERSION */
	int migrate;              /* apply pending schema migrations on open (default 1) */
	int synchronous_full;     /* SQLite: synchronous=FULL (default 1); 0 gives NORMAL */
	int busy_timeout_ms;      /* how long to wait for a lock (default 5000) */
	int read_connections;     /* read-only connections for replays (default 4) */
	int max_retries;          /* retries of a unit on IDEM_ERETRY (default 8) */
	int64_t default_ttl_ms;   /* record retention when a request gives none (default 24 h) */
	int64_t default_lease_ms; /* two-phase lease when a request gives none (default 30 s) */
	idem_clock_fn clock;      /* NULL: the real-time clock; tests inject their own */
	void *clock_ctx;
	/* Group commit (DESIGN.md §5): units per transaction; <= 1 turns it off. */
	int batch_max;        /* default 1 (off) */
	int batch_wait_us;    /* extra wait for a fuller batch (default 0: take what is queued) */
	int writers;          /* writer threads (default 1; SQLite always uses 1) */
	int queue_timeout_ms; /* a unit queued longer is answered IDEM_EUNAVAIL unrun
	                         (default 0: no limit) */
	/* Front cache of completed responses; 0 in either turns it off. */
	size_t cache_bytes;   /* default 0 */
	size_t cache_entries; /* default 0 */
	/* Deadline of each request, from its arrival: a write still queued then
	 * is answered IDEM_EUNAVAIL unrun; a server store's pool wait, connect,
	 * statement or COMMIT still waiting then fails IDEM_EUNAVAIL (rolled back,
	 * or for a COMMIT unknown: a retry replays or re-executes) and its
	 * connection is dropped. Also each read's bound. 0: none (default). */
	int request_timeout_ms;
} idem_store_opts;

#define IDEM_STORE_OPTS_INIT                                                                       \
	{                                                                                          \
		IDEM_STORE_OPTS_VERSION, 1, 1, 5000, 4, 8, 24LL * 3600 * 1000, 30LL * 1000, NULL,  \
		    NULL, 1, 0, 1, 0, 0, 0, 0                                                      \
	}

/*
 * Open the store named by url:
 *   sqlite:PATH            a database file (created if missing)
 *   sqlite::memory:        a private in-memory database (one connection)
 *   postgresql://user[:password]@host[:port]/db[?param=value...]
 *   postgres://...         the same; parsed by libpq, so every libpq URL
 *                          parameter (sslmode, connect_timeout, ...) works
 *   mysql://user[:password]@host[:port]/db[?socket=PATH]
 *   mariadb://...          the same (MariaDB or MySQL, InnoDB); user,
 *                          password and db are percent-decoded
 * out:   receives the handle, or NULL on failure.
 * opts:  NULL for the defaults.
 * Returns 0; IDEM_EINVAL for an unknown scheme or bad URL; IDEM_EUNAVAIL when
 * the file cannot be opened or written or the server cannot be reached;
 * IDEM_ECORRUPT when it is not a database; IDEM_ESCHEMA when its schema is
 * newer than this library.
 * Detail in idem_error_last(). The handle is safe to use from many threads.
 */
IDEM_EXTERN int idem_store_open(idem_store **out, const char *url, const idem_store_opts *opts);

/* Close the store and free everything it holds. NULL is accepted. */
IDEM_EXTERN void idem_store_close(idem_store *store);

/*
 * The backend's name: "sqlite", "postgresql", "mariadb". Borrowed, static.
 * NULL store: "" (and IDEM_EINVAL in idem_error_last()).
 */
IDEM_EXTERN const char *idem_store_backend(const idem_store *store);

/*
 * Apply pending schema migrations. Idempotent and safe to run from two
 * processes at once: each version is applied exactly once, inside a
 * transaction, and recorded in the schema-version table.
 * version_out (may be NULL) receives the schema version afterwards.
 */
IDEM_EXTERN int idem_store_migrate(idem_store *store, int *version_out);

/* The schema version the database is at (0 before any migration). */
IDEM_EXTERN int idem_store_schema_version(idem_store *store, int *out);

/* The newest schema version this library knows. NULL store: IDEM_EINVAL. */
IDEM_EXTERN int idem_store_schema_latest(const idem_store *store);

/* Cheap liveness check of the store (for /healthz). 0 when reachable. */
IDEM_EXTERN int idem_store_ping(idem_store *store);

/*
 * One deadline per request, on the calling thread. idem_deadline_begin
 * starts a request: every store call this thread makes until
 * idem_deadline_end (pool waits, connects, reads, statements, COMMIT, and a
 * write it queues for group commit, whose unit carries the deadline to its
 * writer) ends by now + store's request_timeout_ms, the request's arrival
 * plus its timeout, instead of each call getting a fresh bound of its own.
 * Each begin replaces what the thread held, so nothing of an earlier
 * request (a deadline left past) carries into the next. A store without
 * request_timeout_ms, or NULL, leaves the thread without one. The ping
 * (idem_store_ping) keeps its own short bound either way.
 */
IDEM_EXTERN void idem_deadline_begin(const idem_store *store);
IDEM_EXTERN void idem_deadline_end(void);

/*
 * Carrying a request's deadline to another thread (a worker pool):
 * idem_deadline_get returns the calling thread's (monotonic µs, 0: none);
 * idem_deadline_adopt(d) makes d the calling thread's, 0 clearing it.
 */
IDEM_EXTERN int64_t idem_deadline_get(void);
IDEM_EXTERN void idem_deadline_adopt(int64_t deadline);

/*
 * The store's clock, in milliseconds since the epoch. NULL store: IDEM_EINVAL
 * (negative: never a time), the detail in idem_error_last().
 */
IDEM_EXTERN int64_t idem_store_now(const idem_store *store);

/*
 * Delete expired idempotency records, batch rows per transaction, until a
 * batch comes back short or max_batches batches ran (0: no limit). Never
 * deletes a PROCESSING record whose lease is live, nor any business row.
 * deleted_out (may be NULL) receives the number of rows deleted.
 */
IDEM_EXTERN int idem_store_purge(idem_store *store, int batch, int max_batches,
                                 int64_t *deleted_out);

/* A bound SQL parameter or a result column. */
typedef enum { IDEM_VAL_NULL = 0, IDEM_VAL_INT, IDEM_VAL_TEXT, IDEM_VAL_BLOB } idem_val_type;

typedef struct {
	idem_val_type type;
	int64_t i;     /* IDEM_VAL_INT */
	const void *p; /* IDEM_VAL_TEXT / IDEM_VAL_BLOB: bytes, not NUL-terminated */
	size_t len;
} idem_value;

#define IDEM_V_NULL        ((idem_value){IDEM_VAL_NULL, 0, NULL, 0})
#define IDEM_V_INT(v)      ((idem_value){IDEM_VAL_INT, (int64_t)(v), NULL, 0})
#define IDEM_V_TEXT(s)     ((idem_value){IDEM_VAL_TEXT, 0, (s), strlen(s)})
#define IDEM_V_TEXTN(s, n) ((idem_value){IDEM_VAL_TEXT, 0, (s), (n)})
#define IDEM_V_BLOB(b, n)  ((idem_value){IDEM_VAL_BLOB, 0, (b), (n)})

/*
 * Called once per result row. cols is borrowed for the call only (copy what
 * you keep). Return 0 to continue, a positive value to stop early (the query
 * then returns 0), or a negative idem error to stop and return it.
 */
typedef int (*idem_row_fn)(void *ctx, const idem_value *cols, int ncols);

/*
 * A ready-made idem_row_fn for "SELECT count(*) …" and other one-number
 * queries: stores the first column of the first row, as an integer, into
 * *(int64_t *)ctx (0 when it is NULL or not an integer) and stops. ctx keeps
 * its value when there is no row. ctx NULL, or cols NULL with ncols > 0:
 * IDEM_EINVAL (which stops the query with that error).
 */
IDEM_EXTERN int idem_row_int(void *ctx, const idem_value *cols, int ncols);

/*
 * Run one statement inside txn with bound params. changes_out (may be NULL)
 * receives the number of rows it changed.
 * Returns 0; IDEM_ECONFLICT when a UNIQUE index rejected the write;
 * IDEM_ECONSTRAINT for NOT NULL/CHECK/foreign-key violations; IDEM_ERETRY for
 * transient lock failures; IDEM_EUNAVAIL, IDEM_ESTORE otherwise. After a
 * failed statement the unit must return an error (its savepoint is then
 * rolled back): on PostgreSQL the transaction accepts nothing else until
 * then. To handle a failure and go on, use idem_txn_try_exec.
 */
IDEM_EXTERN int idem_txn_exec(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                              int64_t *changes_out);

/*
 * idem_txn_exec for a statement whose failure the unit handles and then
 * continues (an INSERT that may meet a business unique index, the backstop):
 * a failure rolls back this statement only and the transaction stays
 * usable. Costs a savepoint round trip on PostgreSQL, nothing elsewhere.
 */
IDEM_EXTERN int idem_txn_try_exec(idem_txn *txn, const char *sql, const idem_value *params,
                                  int nparams, int64_t *changes_out);

/* Run a query inside txn; row_fn is called for each row (may be NULL). */
IDEM_EXTERN int idem_txn_query(idem_txn *txn, const char *sql, const idem_value *params,
                               int nparams, idem_row_fn row_fn, void *ctx);

/* The store the transaction belongs to. Borrowed. NULL txn: NULL. */
IDEM_EXTERN idem_store *idem_txn_store(idem_txn *txn);

/*
 * Run a read-only query on a read connection, outside any write transaction.
 * Sees only committed data.
 */
IDEM_EXTERN int idem_store_query(idem_store *store, const char *sql, const idem_value *params,
                                 int nparams, idem_row_fn row_fn, void *ctx);

/*
 * Run fn inside one write transaction, committing when it returns 0 and
 * rolling back when it returns an error. IDEM_ERETRY (from fn or the commit)
 * reruns the whole transaction, up to opts.max_retries times with jittered
 * backoff, so fn must be safe to run again. For writes that need no
 * idempotency record (creating merchants, setup); requests use idem_execute.
 */
typedef int (*idem_txn_fn)(idem_txn *txn, void *ctx);
IDEM_EXTERN int idem_store_transact(idem_store *store, idem_txn_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
