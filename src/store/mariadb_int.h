/*
 * store/mariadb_int.h: what the files of the MariaDB driver share, and only
 * they include: the connection, the error contexts, the parsed URL, and the
 * calls each file offers the others.
 *   mariadb.c       the driver table for netdb.c, connecting, migrations,
 *                   open, records
 *   mariadb_stmt.c  prepared statements and their results, checks that a
 *                   unit's transaction is still there
 *   mariadb_io.c    error classification, bounded non-blocking calls
 *   mariadb_url.c   mysql:// URLs
 * Each file calls only those below it in this list (the URL file stands
 * alone); the I/O layer asks its one question of the statements above it
 * through conn.lost_statement.
 */
#ifndef IDEM_STORE_MARIADB_INT_H
#define IDEM_STORE_MARIADB_INT_H

#include <mysql.h>
#include <stdint.h>

#include "store/netdb.h"

#define STMT_CACHE 64
#define MAX_COLS   32
/* A statement of a unit unanswered this long: ask the server whether it is
 * working on it at all (idem__my_lost_statement), then again every as long. */
#define PROBE_MS 1000

typedef struct conn conn;

/* A connection: the core's header first (netdb.h), then Connector/C's. */
struct conn {
	idem__netconn base;
	MYSQL *my;
	int io_timeout_ms;     /* one call's bound without a deadline */
	int64_t call_start_us; /* when the call in progress started */
	int64_t call_until_us; /* the bound of the call in progress */
	int in_unit;           /* a START TRANSACTION of the core's is open */
	int read_write;        /* READ WRITE outside transactions: drop after the unit */
	int lost;              /* the server dropped the call in progress */
	/* Asked by idem__my_wait_io while a unit's statement waits: has the
	 * server dropped it? Set to idem__my_lost_statement by the connect. A
	 * pointer because the question is itself a statement, on a ping
	 * connection, and the I/O layer sits below statements; that connection
	 * is never in a unit, so its own waits never ask again. */
	int (*lost_statement)(conn *c, int64_t waited_ms);
	int ncache;
	struct {
		char *sql;
		MYSQL_STMT *st;
	} cache[STMT_CACHE];
};

static inline conn *conn_of(idem_txn *txn)
{
	return (conn *)(void *)idem__net_conn_of(txn);
}

/* The parts of a mysql:// URL, percent-decoded. */
typedef struct {
	char *user, *password, *host, *db, *socket;
	unsigned int port;
} my_url;

typedef enum { CTX_PLAIN, CTX_CLAIM, CTX_BUSINESS } err_ctx;

/* ---- mariadb_io.c ---- */

/* The error of c's last call / of st's, classified (DESIGN.md §1). */
int idem__my_fail_conn(conn *c, err_ctx ctx, const char *what);
int idem__my_fail_stmt(conn *c, MYSQL_STMT *st, err_ctx ctx, const char *what);
/* Start bounding one call on c: its I/O bound, cut to the deadline. */
void idem__my_arm(conn *c, int bound_ms);
/* Wait for what a non-blocking call asked for (MYSQL_WAIT_* in status); 0
 * when the call's bound passed first (c is then broken). */
int idem__my_wait_io(conn *c, int status);
/* Run a _start/_cont pair to its end or the call's bound (ret keeps its
 * failure value then). */
#define NB_RUN(c, ret, start, cont, obj)                                                           \
	do {                                                                                       \
		int st_ = (start);                                                                 \
		while (st_) {                                                                      \
			int ev_ = idem__my_wait_io((c), st_);                                      \
			if (!ev_)                                                                  \
				break;                                                             \
			st_ = cont(&(ret), (obj), ev_);                                            \
		}                                                                                  \
	} while (0)
/* The blocking calls of Connector/C, bounded: nonzero / NULL on failure. */
int idem__my_nb_query(conn *c, const char *sql, unsigned long len);
MYSQL_RES *idem__my_nb_store_result(conn *c);
int idem__my_nb_stmt_prepare(conn *c, MYSQL_STMT *st, const char *sql, unsigned long len);
int idem__my_nb_stmt_execute(conn *c, MYSQL_STMT *st);
int idem__my_nb_stmt_store_result(conn *c, MYSQL_STMT *st);

/* ---- mariadb_stmt.c ---- */

/*
 * Run sql on c with params; call fn per row; report changes and the insert
 * id. The one place a statement is executed, so every path gets the same
 * classification and cleanup.
 */
int idem__my_run(conn *c, const char *sql, const idem_value *params, int n, idem_row_fn fn,
                 void *ctx, int64_t *changes, int64_t *insert_id, err_ctx ectx);
/* A statement without parameters or rows, over the text protocol. */
int idem__my_simple(conn *c, const char *sql, const char *what);
/* The server's status flags say a transaction is open on c. */
int idem__my_in_transaction(conn *c);
/* IDEM_ERETRY (c dropped) when a unit's transaction vanished under it. */
int idem__my_unit_gone(conn *c, const char *what);
/* 1 when the server dropped c's statement, unanswered for waited_ms (what
 * a connection's lost_statement points at). */
int idem__my_lost_statement(conn *c, int64_t waited_ms);

/* ---- mariadb_url.c ---- */

/* Parse a mysql:// URL (after the scheme's colon) into u; clear it. */
int idem__my_url_parse(my_url *u, const char *t);
void idem__my_url_clear(my_url *u);

#endif
