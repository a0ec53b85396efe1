/*
 * store/netdb.h: the shared core of the two server backends (postgres.c,
 * mariadb.c) and the driver table each fills in; also the slot pool and
 * integer parsing of driver text. Holds no SQL of a
 * dialect and no driver types, so neither backend depends on the other's
 * library.
 */
#ifndef IDEM_STORE_NETDB_H
#define IDEM_STORE_NETDB_H

#include <pthread.h>

#include "store/backend.h"

/* Writer connections per server store: units of work run on K writers. */
#define IDEM__NET_WRITERS 8

/* How long /healthz's ping may take in all (pool wait, connect, SELECT 1). */
#define IDEM__NET_PING_MS 500

/*
 * A pool of n slots handed out by index. take waits until a slot is free or
 * the deadline passes: connections are few and held for one transaction or
 * one read at a time.
 */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int *free_slots; /* stack of free indexes */
	int nfree;
	int n;
} idem__pool;

int idem__pool_init(idem__pool *p, int n);
void idem__pool_destroy(idem__pool *p);
/* A free slot, or IDEM_EUNAVAIL once deadline_us (monotonic µs; 0: none) passed. */
int idem__pool_take(idem__pool *p, int64_t deadline_us);
void idem__pool_give(idem__pool *p, int slot);

/* ---- the shared SQL-network backend core -------------------------------- */

typedef struct idem__netconn idem__netconn;
typedef struct idem__netdb_driver idem__netdb_driver;

/* A write transaction: the header core sees, on the connection holding it. */
typedef struct {
	struct idem_txn base;
	idem__backend *be;
	idem__netconn *c;
} idem__nettxn;

/*
 * What the core keeps of every connection. A driver's connection type begins
 * with one of these (so core and driver cast between them).
 */
struct idem__netconn {
	int open;            /* the driver holds a live session (connect succeeded) */
	int broken;          /* lost or in an unknown state: drop it when given back */
	int timed_out;       /* a call passed its bound mid-way (broken too) */
	int64_t deadline_us; /* of the transaction or read it serves; 0: none */
	idem__pool *pool;    /* the pool it belongs to, and its slot there */
	int slot;
	idem__nettxn txn;
};

/*
 * The server backend: the same for PostgreSQL and MariaDB. IDEM__NET_WRITERS
 * writer connections, each holding one write transaction at a time,
 * opts.read_connections readers (the writers stand in when there are none),
 * one connection for the ping; each opened lazily and dropped when it broke.
 */
struct idem__backend {
	const idem__netdb_driver *drv;
	idem_store *store;
	idem_store_opts opts;
	void *state;                               /* the driver's (its parsed URL) */
	unsigned char *writers, *readers, *pinger; /* connections of drv->conn_size */
	int nreaders;
	idem__pool wpool, rpool, ppool;
};

/*
 * A dialect: connection handling, error classification, statement text and
 * result conversion stay in the driver; pools, deadlines, retries of a
 * stale connection, transaction framing, savepoints, schema version and
 * purge are here. Every function gets the driver's own connection as its
 * idem__netconn header.
 */
struct idem__netdb_driver {
	const idem__backend_ops *ops;
	size_t conn_size; /* sizeof the driver's connection type */
	/* Open c (closed now), bounded by c->deadline_us; sets up the session. */
	int (*connect)(idem__backend *be, idem__netconn *c);
	/* Close c whatever its state; clears open, broken and timed_out. */
	void (*disconnect)(idem__netconn *c);
	/* The session says a transaction is open (or cannot tell). */
	int (*in_transaction)(idem__netconn *c);
	/* A statement without parameters or rows; failures classified. */
	int (*simple)(idem__netconn *c, const char *sql, const char *what);
	/* A statement with parameters, rows to fn; business classification. */
	int (*run)(idem__netconn *c, const char *sql, const idem_value *params, int n,
	           idem_row_fn fn, void *ctx, int64_t *changes);
	/* COMMIT; 0 only when it committed. */
	int (*commit)(idem__netconn *c);
	/* ROLLBACK without touching the thread's error; nonzero when it failed. */
	int (*rollback)(idem__netconn *c);
	/* NULL, or a savepoint statement's failure remapped (rc is its error). */
	int (*savepoint_failed)(idem__netconn *c, const char *verb, int rc);
	void (*state_free)(void *state);
	const char *begin_sql;   /* "BEGIN", "START TRANSACTION" */
	const char *version_sql; /* 1 when idem_schema_version exists */
	const char *purge_sql;   /* the dialect's purge batch: ?now ?now ?batch */
	/*
	 * NULL (then simple(begin_sql)), or the driver's own BEGIN on c, which
	 * may be sent without waiting for its answer. fresh: c was opened just
	 * now; when it was not, a connection the server closed while it was
	 * pooled must fail here as IDEM_EUNAVAIL (broken), so that the BEGIN is
	 * retried on a new one.
	 */
	int (*begin)(idem__netconn *c, int fresh);
	/*
	 * NULL (then simple), or send a statement without parameters or rows
	 * (SAVEPOINT, RELEASE) inside a transaction without waiting for its
	 * answer: its failure is reported by the next statement that waits (at
	 * the latest COMMIT, which then fails).
	 */
	int (*defer)(idem__netconn *c, const char *sql, const char *what);
};

typedef enum { IDEM__NET_WRITER, IDEM__NET_READER, IDEM__NET_PING } idem__net_pool;

/* Open: state (owned from here, also on failure) is the driver's parsed URL. */
int idem__net_open(idem__backend **out, idem_store *store, const idem_store_opts *opts,
                   const idem__netdb_driver *drv, void *state);
void idem__net_close(idem__backend *be);
/* A connection from a pool, opened if needed; *fresh: opened now. */
int idem__net_take(idem__backend *be, idem__net_pool kind, int64_t deadline_us, idem__netconn **out,
                   int *fresh);
void idem__net_give(idem__backend *be, idem__netconn *c);
idem__netconn *idem__net_conn_of(idem_txn *txn);
/* The schema version read on c (0: no version table yet). */
int idem__net_version_in(idem__backend *be, idem__netconn *c, int *out);

/* The ops every server driver shares. */
int idem__net_schema_version(idem__backend *be, int *out);
int idem__net_ping(idem__backend *be);
int idem__net_txn_begin(idem__backend *be, idem_txn **out);
int idem__net_txn_commit(idem_txn *txn);
void idem__net_txn_rollback(idem_txn *txn);
int idem__net_savepoint(idem_txn *txn, const char *name);
int idem__net_release(idem_txn *txn, const char *name);
int idem__net_rollback_to(idem_txn *txn, const char *name);
int idem__net_purge_batch(idem__backend *be, int64_t now, int batch, int64_t *deleted);
int idem__net_txn_exec(idem_txn *txn, const char *sql, const idem_value *params, int n,
                       int64_t *changes);
int idem__net_txn_query(idem_txn *txn, const char *sql, const idem_value *params, int n,
                        idem_row_fn fn, void *ctx);
int idem__net_read_query(idem__backend *be, const char *sql, const idem_value *params, int n,
                         idem_row_fn fn, void *ctx);

/*
 * The deadline a call starting now works to, monotonic µs: the calling
 * thread's (idem__backend_deadline_set) or now + timeout_ms, the earlier of
 * the two; 0 when neither is set (timeout_ms <= 0 and no thread deadline).
 */
int64_t idem__net_deadline(int timeout_ms);

/*
 * Milliseconds to wait now for a call bounded by deadline_us and by cap_ms
 * from now (either may be 0: unbounded; both 0 gives -1, poll's "forever").
 * 0 when the bound has passed.
 */
int idem__net_wait_ms(int64_t deadline_us, int cap_ms);

/*
 * Parse the whole of s[0..len) as a decimal int64 (optional sign). 0 when it
 * is one, -1 otherwise (empty, junk, a fraction, out of range).
 */
int idem__parse_int64(const char *s, size_t len, int64_t *out);

#endif
