/*
 * store/backend.h: the contract between src/core and a database backend.
 * A backend is a versioned table of functions with capability bits, one
 * file per driver (sqlite.c, postgres.c, mariadb.c; the two server drivers
 * share netdb.c). The engine (core/engine.c) refuses a table whose version
 * is not IDEM__BACKEND_OPS_VERSION and asks capabilities, never names.
 * Core decides outcomes and never sees SQL; a backend runs its own dialect
 * and classifies its driver's errors precisely: IDEM__DUPLICATE only for a
 * conflict on the idempotency index of the claim INSERT, IDEM_ERETRY only
 * for transient lock failures, never "something went wrong" as "duplicate".
 * A backend never looks inside idem_store (an opaque pointer here) and never
 * calls back into the engine: the options it is opened with carry the clock.
 */
#ifndef IDEM_STORE_BACKEND_H
#define IDEM_STORE_BACKEND_H

#include "idem/claim.h"
#include "idem/store.h"

/* rec_insert's answer when the unique index already holds the key. Positive: not an error. */
#define IDEM__DUPLICATE 1

typedef enum {
	IDEM__ST_PROCESSING = 1,
	IDEM__ST_SUCCEEDED = 2,
	IDEM__ST_FAILED = 3,
} idem__status;

const char *idem__status_name(idem__status st);
int idem__status_parse(const char *s, size_t len, idem__status *out);

/* The key of a record; strings borrowed. */
typedef struct {
	const char *scope;
	size_t scope_len;
	const char *type;
	size_t type_len;
	const char *key;
	size_t key_len;
} idem__key;

/* A record as stored. body is owned (malloc) when read from the store. */
typedef struct {
	int64_t id;
	int64_t version; /* bumped on every change: optimistic takeover */
	idem__status status;
	char fingerprint[IDEM_FINGERPRINT_LEN + 1];
	char owner[33]; /* lease owner token while PROCESSING, "" otherwise */
	int http_status;
	unsigned char *body;
	size_t body_len;
	int64_t lease_until; /* ms; 0 when not PROCESSING */
	int64_t created_at;
	int64_t expires_at;
} idem__record;

void idem__record_clear(idem__record *rec);

typedef struct idem__backend idem__backend;

typedef struct idem__backend_ops idem__backend_ops;

/* Every backend's transaction begins with this header. */
struct idem_txn {
	const idem__backend_ops *ops; /* the backend running it */
	idem_store *store;            /* the engine it belongs to: opaque, for idem_txn_store */
};

/* Bump when the shape or the meaning of idem__backend_ops changes. */
#define IDEM__BACKEND_OPS_VERSION 3

/* Capabilities (idem__backend_ops.caps). */
#define IDEM__CAP_ONE_WRITER 0x1u /* one write transaction at a time: one group-commit writer */

struct idem__backend_ops {
	int version; /* IDEM__BACKEND_OPS_VERSION */
	const char *name;
	unsigned caps; /* IDEM__CAP_* */

	/* target: the URL with its scheme removed. store: the engine, opaque,
	 * to put in each transaction's header. opts.clock is never NULL. */
	int (*open)(idem__backend **out, idem_store *store, const char *target,
	            const idem_store_opts *opts);
	void (*close)(idem__backend *be);
	int (*migrate)(idem__backend *be, int *version_out);
	int (*schema_version)(idem__backend *be, int *out);
	int schema_latest;
	int (*ping)(idem__backend *be);

	/* Write transactions. commit and rollback always end txn (and free it). */
	int (*txn_begin)(idem__backend *be, idem_txn **out);
	int (*txn_commit)(idem_txn *txn);
	void (*txn_rollback)(idem_txn *txn);
	/* Savepoints nest units inside a shared transaction; name is [a-z0-9_]. */
	int (*savepoint)(idem_txn *txn, const char *name);
	int (*release)(idem_txn *txn, const char *name);
	int (*rollback_to)(idem_txn *txn, const char *name);

	/* Record operations inside a write transaction. */
	/* 0 with rec->id set; IDEM__DUPLICATE; or an error. */
	int (*rec_insert)(idem_txn *txn, const idem__key *k, idem__record *rec);
	/* Replace record id at version with rec (new owner, fingerprint, times).
	 * *changed is 1 when it still was at that version, else 0. */
	int (*rec_takeover)(idem_txn *txn, int64_t id, int64_t version, const idem__record *rec,
	                    int *changed);
	/* Complete PROCESSING record id held by owner at now. *changed 0: lease lost. */
	int (*rec_complete)(idem_txn *txn, int64_t id, const char *owner, idem__status st,
	                    int http_status, const unsigned char *body, size_t len, int64_t now,
	                    int *changed);
	/* Set lease_until of PROCESSING record id held by owner. */
	int (*rec_extend)(idem_txn *txn, int64_t id, const char *owner, int64_t lease_until,
	                  int *changed);
	/* Delete PROCESSING record id held by owner. */
	int (*rec_delete_owned)(idem_txn *txn, int64_t id, const char *owner, int *changed);

	/* Delete up to batch expired records (not live leases) in one transaction. */
	int (*purge_batch)(idem__backend *be, int64_t now, int batch, int64_t *deleted);

	/* Generic SQL (see idem_txn_exec / idem_store_query). */
	int (*txn_exec)(idem_txn *txn, const char *sql, const idem_value *params, int n,
	                int64_t *changes);
	/* A statement whose failure leaves the transaction usable; NULL: txn_exec
	 * already does (SQLite, MariaDB roll back only the failed statement). */
	int (*txn_try_exec)(idem_txn *txn, const char *sql, const idem_value *params, int n,
	                    int64_t *changes);
	int (*txn_query)(idem_txn *txn, const char *sql, const idem_value *params, int n,
	                 idem_row_fn fn, void *ctx);
	int (*read_query)(idem__backend *be, const char *sql, const idem_value *params, int n,
	                  idem_row_fn fn, void *ctx);

	/* Since version 3. */
	/*
	 * NULL, or rec_complete for a record that this very transaction inserted
	 * or took over (so it has held the row's lock since, and the UPDATE
	 * cannot miss): the backend may send it without waiting for its answer
	 * (PostgreSQL pipelines it with the next statement). Should it match no
	 * row after all, the transaction fails, IDEM_ELEASE, at the latest at
	 * its COMMIT.
	 */
	int (*rec_complete_held)(idem_txn *txn, int64_t id, const char *owner, idem__status st,
	                         int http_status, const unsigned char *body, size_t len,
	                         int64_t now);
};

/*
 * The deadline of the work the calling thread does now, monotonic µs (0:
 * none); core sets it around a request (execute.c) and a group-commit batch
 * (batch.c: its earliest unit's). The server drivers bound every wait of
 * the calls made meanwhile by it: pool checkout, connect, each statement
 * and COMMIT; a call past it fails IDEM_EUNAVAIL and its connection is
 * dropped, never reused. Without one they use now + opts.request_timeout_ms.
 * Thread-local; SQLite ignores it (its waits are the busy timeout).
 */
void idem__backend_deadline_set(int64_t mono_us);
int64_t idem__backend_deadline(void);

/* The drivers (sqlite.c, postgres.c, mariadb.c). */
extern const idem__backend_ops idem__sqlite_ops;
extern const idem__backend_ops idem__postgres_ops;
extern const idem__backend_ops idem__mariadb_ops;

/*
 * The backend for url's scheme (store/backends.c), *target pointed past the
 * scheme; NULL for an unknown scheme.
 */
const idem__backend_ops *idem__backend_find(const char *url, const char **target);

/*
 * Reading a record, the same SQL everywhere (records.c), on top of the
 * backend's txn_query / read_query: 0 and *out filled, or IDEM_ENOTFOUND.
 * idem__rec_get reads inside txn (the latest committed or its own state);
 * idem__rec_read on a read connection, outside any write transaction.
 */
int idem__rec_get(idem_txn *txn, const idem__key *k, idem__record *out);
int idem__rec_read(const idem__backend_ops *ops, idem__backend *be, const idem__key *k,
                   idem__record *out);

/*
 * The record writes every backend shares (records.c): plain conditional SQL
 * on top of the backend's txn_exec. Backends point their ops at these.
 */
int idem__rec_takeover(idem_txn *txn, int64_t id, int64_t version, const idem__record *rec,
                       int *changed);
int idem__rec_complete(idem_txn *txn, int64_t id, const char *owner, idem__status st,
                       int http_status, const unsigned char *body, size_t len, int64_t now,
                       int *changed);
int idem__rec_extend(idem_txn *txn, int64_t id, const char *owner, int64_t lease_until,
                     int *changed);
int idem__rec_delete_owned(idem_txn *txn, int64_t id, const char *owner, int *changed);

#endif
