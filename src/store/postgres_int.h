/*
 * store/postgres_int.h: what the files of the PostgreSQL driver share, and
 * only they include: the connection and the calls each file offers the
 * other.
 *   postgres.c      talking to the server (non-blocking, bounded,
 *                   pipelined), connections, the driver table for netdb.c,
 *                   migrations, open, records
 *   postgres_sql.c  the dialect's translations, no I/O: errors to idem
 *                   codes, `?` placeholders to $n, idem values to
 *                   parameters and result rows to idem values
 */
#ifndef IDEM_STORE_POSTGRES_INT_H
#define IDEM_STORE_POSTGRES_INT_H

#include <libpq-fe.h>

#include "store/netdb.h"

/* See the session setup: the server ends a transaction idle this long. */
#define IDLE_TXN_TIMEOUT_MS_STR "30000"
#define STMT_CACHE              64
#define MAX_COLS                32
#define SQL_MAX                 (1 << 20)
/* How much longer than a lock wait any call may wait for the server. */
#define IO_MARGIN_MS 10000
/* The longest a connect may take, deadline or not (libpq's connect_timeout). */
#define CONNECT_TIMEOUT_MS 10000

/* Key of the advisory lock that serialises migrations (per database). */
#define MIGRATE_LOCK_KEY "7589122023311"

#define OID_BOOL    16
#define OID_BYTEA   17
#define OID_INT8    20
#define OID_INT2    21
#define OID_INT4    23
#define OID_OID     26
#define OID_NUMERIC 1700

/* Statements queued without waiting between two statements that wait. */
#define MAX_DEFERRED 16

typedef struct conn conn;

/* What a queued statement was: how its failure reads. */
typedef enum { DEF_PLAIN = 1, DEF_COMPLETE = 2 } def_kind;

/* A connection: the core's header first (netdb.h), then libpq's. */
struct conn {
	idem__netconn base;
	PGconn *pg;
	int io_timeout_ms;
	int piped;     /* in pipeline mode: inside a write transaction */
	int ndeferred; /* statements sent whose answers are not read yet */
	struct {
		def_kind kind;
		const char *what; /* a literal */
	} deferred[MAX_DEFERRED];
	/* The last answer's error came from queued statement of this kind (0: none). */
	def_kind failed_kind;
	const char *failed_what;
	int ncache;
	struct {
		char *sql; /* the caller's SQL text, before rewriting */
		int nparams;
	} cache[STMT_CACHE]; /* statement i is prepared as "idem_<i>" */
};

static inline conn *conn_of(idem_txn *txn)
{
	return (conn *)(void *)idem__net_conn_of(txn);
}

typedef enum { CTX_PLAIN, CTX_CLAIM, CTX_BUSINESS } err_ctx;

/*
 * Parameters as libpq wants them. Integers and text go in text format (so
 * the server converts them to whatever type it inferred for the placeholder);
 * blobs in binary format, which for bytea is the bytes themselves.
 */
typedef struct {
	const char **values;
	int *lengths;
	int *formats;
	char *mem;
} bound;

/*
 * Map a failed statement to an idem code and record the detail (SQLSTATE
 * kept in idem_error). res may be NULL when libpq produced no result at all.
 */
int idem__pg_fail(conn *c, const PGresult *res, err_ctx ctx, const char *what);
/*
 * Rewrite the generic `?` placeholders to $1..$n, leaving alone anything in
 * a string literal ('..', E'..'), a quoted identifier, a comment or a
 * dollar-quoted string. *out is malloc'd; *nparams the number of `?`.
 */
int idem__pg_rewrite(const char *sql, char **out, int *nparams);
/* Bind params into b, as bound says; free what it holds. */
int idem__pg_bind_params(bound *b, const idem_value *params, int n);
void idem__pg_bound_free(bound *b);
/* Call fn for each row of res as idem values (stops when fn returns != 0). */
int idem__pg_deliver_rows(PGresult *res, idem_row_fn fn, void *ctx);

#endif
