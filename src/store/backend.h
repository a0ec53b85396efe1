/*
 * store/backend.h: the contract between src/core and a database backend.
 * A backend is a versioned table of functions, one file per driver
 * (sqlite.c; postgres.c and mariadb.c come next). Core decides outcomes and
 * never sees SQL; a backend runs its own dialect and classifies its driver's
 * errors precisely: IDEM__DUPLICATE only for a conflict on the idempotency
 * index of the claim INSERT, IDEM_ERETRY only for transient lock failures,
 * never "something went wrong" as "duplicate".
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
	int64_t version;          /* bumped on every change: optimistic takeover */
	idem__status status;
	char fingerprint[IDEM_FINGERPRINT_LEN + 1];
	char owner[33];           /* lease owner token while PROCESSING, "" otherwise */
	int http_status;
	unsigned char *body;
	size_t body_len;
	int64_t lease_until;      /* ms; 0 when not PROCESSING */
	int64_t created_at;
	int64_t expires_at;
} idem__record;

void idem__record_clear(idem__record *rec);

typedef struct idem__backend idem__backend;

/* Every backend's transaction begins with this header. */
struct idem_txn {
	idem_store *store;
};

#define IDEM__BACKEND_OPS_VERSION 1

typedef struct {
	int version; /* IDEM__BACKEND_OPS_VERSION */
	const char *name;

	/* target: the URL with its scheme removed. */
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
	/* Complete PROCESSING record id held by owner. *changed 0: lease lost. */
	int (*rec_complete)(idem_txn *txn, int64_t id, const char *owner, idem__status st,
			    int http_status, const unsigned char *body, size_t len, int *changed);
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
} idem__backend_ops;

extern const idem__backend_ops idem__sqlite_ops;

/*
 * Reading a record, the same SQL everywhere (records.c), on top of the
 * backend's txn_query / read_query: 0 and *out filled, or IDEM_ENOTFOUND.
 * idem__rec_get reads inside txn (the latest committed or its own state);
 * idem__rec_read on a read connection, outside any write transaction.
 */
int idem__rec_get(idem_txn *txn, const idem__key *k, idem__record *out);
int idem__rec_read(idem_store *store, const idem__key *k, idem__record *out);

/*
 * The record writes every backend shares (records.c): plain conditional SQL
 * on top of the backend's txn_exec. Backends point their ops at these.
 */
int idem__rec_takeover(idem_txn *txn, int64_t id, int64_t version, const idem__record *rec,
		       int *changed);
int idem__rec_complete(idem_txn *txn, int64_t id, const char *owner, idem__status st,
		       int http_status, const unsigned char *body, size_t len, int *changed);
int idem__rec_extend(idem_txn *txn, int64_t id, const char *owner, int64_t lease_until,
		     int *changed);
int idem__rec_delete_owned(idem_txn *txn, int64_t id, const char *owner, int *changed);

/* Note a store error of code in the store's metrics (called by core on failures). */
void idem__store_count_error(idem_store *store, int code);

#endif
