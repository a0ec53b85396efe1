/*
 * store/mariadb.c: the MariaDB dialect driver, on MariaDB Connector/C,
 * behind the shared server-backend core (netdb.c: pools, deadlines,
 * stale-connection retries, transaction framing, savepoints, schema
 * version, purge). Here: URL parsing, connecting (never with the driver's
 * own auto-reconnect, which would silently continue a dead transaction in
 * autocommit), error classification, statements (mysql_stmt_*, prepared
 * once per connection, keyed by their SQL text), result conversion, the
 * claim INSERT, migrations under GET_LOCK. Every session is InnoDB,
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
#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "store/mariadb.h"
#include "store/netdb.h"
#include "store/schema.h"
#include "util/clock.h"
#include "util/error.h"

#define STMT_CACHE 64
#define MAX_COLS 32
/* How much longer than a lock wait any call may wait for the server. */
#define IO_MARGIN_S 10
/* The longest a connect may take, deadline or not. */
#define CONNECT_TIMEOUT_S 10
/* A statement of a unit unanswered this long: ask the server whether it is
 * working on it at all (lost_statement), then again every as long. */
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
	int ncache;
	struct {
		char *sql;
		MYSQL_STMT *st;
	} cache[STMT_CACHE];
};

static conn *conn_of(idem_txn *txn)
{
	return (conn *)(void *)idem__net_conn_of(txn);
}

/* The parts of a mysql:// URL, percent-decoded. */
typedef struct {
	char *user, *password, *host, *db, *socket;
	unsigned int port;
} my_url;

/* ---- errors ---------------------------------------------------------- */

typedef enum { CTX_PLAIN, CTX_CLAIM, CTX_BUSINESS } err_ctx;

/* "Duplicate entry '...' for key 'idem_records_key'": the key name ends it. */
static int on_idem_index(const char *msg)
{
	static const char tail[] = "for key 'idem_records_key'";
	size_t n = strlen(msg), t = sizeof(tail) - 1;

	return n >= t && strcmp(msg + n - t, tail) == 0;
}

/* Map a MariaDB error to an idem code; records errno and SQLSTATE. */
static int classify(conn *c, unsigned int err, const char *state, const char *msg, err_ctx ctx,
		    const char *what)
{
	int code;

	if (c->lost)
		return idem__error_driver(strcmp(what, "commit") == 0 ? IDEM_EUNAVAIL : IDEM_ERETRY,
					  ER_LOCK_DEADLOCK, "40001",
					  "mariadb: %s: the server dropped the statement of a "
					  "transaction it had rolled back (a Galera brute-force "
					  "abort); connection dropped",
					  what);
	if (c->base.timed_out)
		return idem__error_driver(IDEM_EUNAVAIL, CR_SERVER_LOST, "HY000",
					  "mariadb: %s: the server did not answer before the "
					  "deadline; connection dropped",
					  what);
	switch (err) {
	case ER_DUP_ENTRY:             /* 1062 */
	case ER_DUP_ENTRY_WITH_KEY_NAME: /* 1586 */
		if (ctx == CTX_CLAIM && on_idem_index(msg))
			return IDEM__DUPLICATE;
		code = ctx == CTX_BUSINESS ? IDEM_ECONFLICT : IDEM_ESTORE;
		break;
	case ER_LOCK_DEADLOCK:      /* 1213: the transaction was rolled back (also Galera) */
	case ER_LOCK_WAIT_TIMEOUT:  /* 1205 */
		code = IDEM_ERETRY;
		break;
	case ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: /* 1792 */
		/* A pooled session is READ ONLY outside START TRANSACTION READ WRITE
		 * (drv_connect): a write refused so ran after the unit's transaction
		 * was rolled back under it. Nothing was written; retry afresh. */
		c->base.broken = 1;
		code = IDEM_ERETRY;
		break;
	case ER_BAD_NULL_ERROR:           /* 1048 */
	case ER_NO_DEFAULT_FOR_FIELD:     /* 1364 */
	case ER_NO_REFERENCED_ROW_2:      /* 1452 */
	case ER_ROW_IS_REFERENCED_2:      /* 1451 */
	case ER_NO_REFERENCED_ROW:        /* 1216 */
	case ER_ROW_IS_REFERENCED:        /* 1217 */
	case 3819:                        /* MySQL's CHECK violation */
	case 4025:                        /* MariaDB's CHECK violation: ER_CONSTRAINT_FAILED */
		code = IDEM_ECONSTRAINT;
		break;
	case CR_CONNECTION_ERROR:     /* 2002 */
	case CR_CONN_HOST_ERROR:      /* 2003 */
	case CR_SERVER_GONE_ERROR:    /* 2006 */
	case CR_SERVER_LOST:          /* 2013 */
	case CR_SERVER_LOST_EXTENDED: /* 2055 */
	case ER_CONNECTION_KILLED:    /* 1927 */
	case ER_SERVER_SHUTDOWN:      /* 1053 */
	case 4031:                    /* disconnected by the server for inactivity */
		c->base.broken = 1;
		code = IDEM_EUNAVAIL;
		break;
	case 1264: /* ER_WARN_DATA_OUT_OF_RANGE: a value outside its column's range */
	case 1690: /* ER_DATA_OUT_OF_RANGE: an expression's result out of range */
		/* The request's values, not the store: permanent, never "unavailable". */
		code = IDEM_EINVAL;
		break;
	case 1969: /* ER_STATEMENT_TIMEOUT: max_statement_time, the server's own bound */
	case ER_CON_COUNT_ERROR: /* 1040: too many connections */
		code = IDEM_EUNAVAIL;
		break;
	case CR_OUT_OF_MEMORY: /* 2008 */
		c->base.broken = 1;
		code = IDEM_ENOMEM;
		break;
	default:
		/* Any other client-side error leaves the protocol state in doubt. */
		if (err >= 2000 && err < 3000)
			c->base.broken = 1;
		code = IDEM_ESTORE;
		break;
	}
	return idem__error_driver(code, (int)err, state, "mariadb: %s: %s (errno %u)", what, msg,
				  err);
}

static int fail_conn(conn *c, err_ctx ctx, const char *what)
{
	return classify(c, mysql_errno(c->my), mysql_sqlstate(c->my), mysql_error(c->my), ctx,
			what);
}

static int fail_stmt(conn *c, MYSQL_STMT *st, err_ctx ctx, const char *what)
{
	return classify(c, mysql_stmt_errno(st), mysql_stmt_sqlstate(st), mysql_stmt_error(st), ctx,
			what);
}

/* ---- waiting for the server ----------------------------------------- */

static int lost_statement(conn *c, int64_t waited_ms);

/* Start bounding one call on c: its I/O bound, cut to the deadline. */
static void arm(conn *c, int bound_ms)
{
	int64_t now = idem__clock_monotonic_us(), until = now + (int64_t)bound_ms * 1000;

	c->call_start_us = now;
	c->lost = 0;
	c->call_until_us = c->base.deadline_us > 0 && c->base.deadline_us < until ? c->base.deadline_us : until;
}

/*
 * Wait for what a non-blocking call asked for (MYSQL_WAIT_* in status), at
 * most until the call's bound. The events for its _cont call, or 0 when the
 * bound passed first: c is then timed out and broken, the call abandoned.
 */
static int wait_io(conn *c, int status)
{
	struct pollfd pfd = {mysql_get_socket(c->my), 0, 0};
	int64_t lib_until = 0, probe_at = 0;

	if (status & MYSQL_WAIT_READ)
		pfd.events |= POLLIN;
	if (status & MYSQL_WAIT_WRITE)
		pfd.events |= POLLOUT;
	if (status & MYSQL_WAIT_EXCEPT)
		pfd.events |= POLLPRI;
	if (status & MYSQL_WAIT_TIMEOUT)
		lib_until = idem__clock_monotonic_us() +
			    (int64_t)mysql_get_timeout_value_ms(c->my) * 1000;
	/* A unit's statement waiting for its answer is checked on now and then
	 * (lost_statement says why). */
	if (c->in_unit && (status & MYSQL_WAIT_READ) && c->call_start_us > 0)
		probe_at = c->call_start_us + (int64_t)PROBE_MS * 1000;
	for (;;) {
		int left = idem__net_wait_ms(c->call_until_us, 0), lib = -1, n, ev = 0, probe = -1;

		if (left == 0) {
			/* Abandoned mid-call: shut the socket now, so that nothing the
			 * driver still does on this handle (freeing a statement's
			 * result, closing it) waits for the server. */
			c->base.broken = c->base.timed_out = 1;
			if (pfd.fd >= 0)
				shutdown(pfd.fd, SHUT_RDWR);
			return 0;
		}
		if (lib_until)
			lib = idem__net_wait_ms(lib_until, 0);
		if (probe_at && (probe = idem__net_wait_ms(probe_at, 0)) == 0) {
			int64_t now = idem__clock_monotonic_us();

			if (lost_statement(c, (now - c->call_start_us) / 1000)) {
				c->base.broken = c->lost = 1;
				if (pfd.fd >= 0)
					shutdown(pfd.fd, SHUT_RDWR);
				return 0;
			}
			probe_at = now + (int64_t)PROBE_MS * 1000;
			continue;
		}
		if (probe > 0 && probe < left && (lib < 0 || probe < lib))
			left = probe;
		n = poll(&pfd, pfd.fd >= 0 ? 1 : 0, lib >= 0 && lib < left ? lib : left);
		if (n < 0 && errno != EINTR) {
			c->base.broken = 1;
			return MYSQL_WAIT_TIMEOUT; /* let the driver fail the call */
		}
		if (n > 0) {
			if (pfd.revents & (POLLIN | POLLERR | POLLHUP))
				ev |= MYSQL_WAIT_READ;
			if (pfd.revents & (POLLOUT | POLLERR | POLLHUP))
				ev |= MYSQL_WAIT_WRITE;
			if (pfd.revents & POLLPRI)
				ev |= MYSQL_WAIT_EXCEPT;
			return ev ? ev & status : status;
		}
		if (n == 0 && lib_until && lib >= 0 && lib <= left)
			return MYSQL_WAIT_TIMEOUT; /* the driver's own read/connect timeout */
	}
}

/* Run a _start/_cont pair to its end or the call's bound (ret keeps its
 * failure value then). */
#define NB_RUN(c, ret, start, cont, obj)                                   \
	do {                                                               \
		int st_ = (start);                                         \
		while (st_) {                                              \
			int ev_ = wait_io((c), st_);                       \
			if (!ev_)                                          \
				break;                                     \
			st_ = cont(&(ret), (obj), ev_);                    \
		}                                                          \
	} while (0)

static int nb_query(conn *c, const char *sql, unsigned long len)
{
	int ret = 1;

	arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_real_query_start(&ret, c->my, sql, len), mysql_real_query_cont, c->my);
	return c->base.timed_out || c->lost ? 1 : ret;
}

static MYSQL_RES *nb_store_result(conn *c)
{
	MYSQL_RES *ret = NULL;

	arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_store_result_start(&ret, c->my), mysql_store_result_cont, c->my);
	return c->base.timed_out || c->lost ? NULL : ret;
}

static int nb_stmt_prepare(conn *c, MYSQL_STMT *st, const char *sql, unsigned long len)
{
	int ret = 1;

	arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_stmt_prepare_start(&ret, st, sql, len), mysql_stmt_prepare_cont, st);
	return c->base.timed_out || c->lost ? 1 : ret;
}

static int nb_stmt_execute(conn *c, MYSQL_STMT *st)
{
	int ret = 1;

	arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_stmt_execute_start(&ret, st), mysql_stmt_execute_cont, st);
	return c->base.timed_out || c->lost ? 1 : ret;
}

static int nb_stmt_store_result(conn *c, MYSQL_STMT *st)
{
	int ret = 1;

	arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_stmt_store_result_start(&ret, st), mysql_stmt_store_result_cont, st);
	return c->base.timed_out || c->lost ? 1 : ret;
}

/* ---- statements ------------------------------------------------------ */

static int prepare(conn *c, const char *sql, MYSQL_STMT **out, int *cached)
{
	MYSQL_STMT *st;
	int rc;

	*out = NULL;
	*cached = 0;
	for (int i = 0; i < c->ncache; i++)
		if (strcmp(c->cache[i].sql, sql) == 0) {
			*out = c->cache[i].st;
			*cached = 1;
			return 0;
		}
	if (!(st = mysql_stmt_init(c->my)))
		return fail_conn(c, CTX_PLAIN, "stmt_init");
	if (nb_stmt_prepare(c, st, sql, (unsigned long)strlen(sql)) != 0) {
		rc = fail_stmt(c, st, CTX_BUSINESS, "prepare");
		mysql_stmt_close(st);
		return rc;
	}
	if (c->ncache < STMT_CACHE) {
		char *copy = strdup(sql);

		if (copy) {
			c->cache[c->ncache].sql = copy;
			c->cache[c->ncache].st = st;
			c->ncache++;
			*cached = 1;
		}
	}
	*out = st;
	return 0;
}

typedef enum { K_INT, K_DOUBLE, K_DECIMAL, K_TEXT, K_BLOB } col_kind;

static col_kind kind_of(const MYSQL_FIELD *f)
{
	switch (f->type) {
	case MYSQL_TYPE_TINY:
	case MYSQL_TYPE_SHORT:
	case MYSQL_TYPE_LONG:
	case MYSQL_TYPE_LONGLONG:
	case MYSQL_TYPE_INT24:
	case MYSQL_TYPE_YEAR: return K_INT;
	case MYSQL_TYPE_FLOAT:
	case MYSQL_TYPE_DOUBLE: return K_DOUBLE;
	case MYSQL_TYPE_DECIMAL:
	case MYSQL_TYPE_NEWDECIMAL: return K_DECIMAL;
	case MYSQL_TYPE_TINY_BLOB:
	case MYSQL_TYPE_MEDIUM_BLOB:
	case MYSQL_TYPE_LONG_BLOB:
	case MYSQL_TYPE_BLOB:
	case MYSQL_TYPE_STRING:
	case MYSQL_TYPE_VAR_STRING:
	case MYSQL_TYPE_VARCHAR:
		/* Charset 63 is "binary": BLOB and VARBINARY columns. */
		return f->charsetnr == 63 ? K_BLOB : K_TEXT;
	default: return K_TEXT; /* dates, JSON, ... as their text */
	}
}

/* Result buffers for one statement execution. */
typedef struct {
	MYSQL_BIND bind[MAX_COLS];
	col_kind kind[MAX_COLS];
	int64_t ints[MAX_COLS];
	double dbls[MAX_COLS];
	unsigned long lens[MAX_COLS];
	my_bool nulls[MAX_COLS];
	char *bufs[MAX_COLS];
	int ncols;
} results;

static void results_free(results *r)
{
	for (int i = 0; i < r->ncols; i++)
		free(r->bufs[i]);
	r->ncols = 0;
}

static int fetch_rows(conn *c, MYSQL_STMT *st, results *r, idem_row_fn fn, void *ctx)
{
	MYSQL_RES *meta = NULL;
	MYSQL_FIELD *fields;
	my_bool one = 1;
	int rc = 0, f;

	/* max_length tells how big each text/blob buffer must be. */
	mysql_stmt_attr_set(st, STMT_ATTR_UPDATE_MAX_LENGTH, &one);
	if (nb_stmt_store_result(c, st) != 0)
		return fail_stmt(c, st, CTX_BUSINESS, "store_result");
	if (!fn)
		return 0;
	if (!(meta = mysql_stmt_result_metadata(st)))
		return fail_stmt(c, st, CTX_PLAIN, "result_metadata");
	fields = mysql_fetch_fields(meta);
	if ((int)mysql_num_fields(meta) > MAX_COLS) {
		rc = idem__error(IDEM_EINVAL, "query returns more than %d columns", MAX_COLS);
		goto done;
	}
	memset(r->bind, 0, sizeof(r->bind));
	for (r->ncols = 0; r->ncols < (int)mysql_num_fields(meta); r->ncols++) {
		int i = r->ncols;
		MYSQL_BIND *b = &r->bind[i];

		r->bufs[i] = NULL;
		r->kind[i] = kind_of(&fields[i]);
		b->is_null = &r->nulls[i];
		b->length = &r->lens[i];
		if (r->kind[i] == K_INT) {
			b->buffer_type = MYSQL_TYPE_LONGLONG;
			b->buffer = &r->ints[i];
			b->is_unsigned = (fields[i].flags & UNSIGNED_FLAG) != 0;
		} else if (r->kind[i] == K_DOUBLE) {
			b->buffer_type = MYSQL_TYPE_DOUBLE;
			b->buffer = &r->dbls[i];
		} else {
			size_t size = (size_t)fields[i].max_length + 1;

			if (!(r->bufs[i] = malloc(size))) {
				r->ncols++;
				rc = idem__error(IDEM_ENOMEM, "out of memory");
				goto done;
			}
			b->buffer_type = r->kind[i] == K_BLOB ? MYSQL_TYPE_BLOB : MYSQL_TYPE_STRING;
			b->buffer = r->bufs[i];
			b->buffer_length = (unsigned long)size;
		}
	}
	if (mysql_stmt_bind_result(st, r->bind) != 0) {
		rc = fail_stmt(c, st, CTX_PLAIN, "bind_result");
		goto done;
	}
	while ((f = mysql_stmt_fetch(st)) == 0) {
		idem_value cols[MAX_COLS];

		for (int i = 0; i < r->ncols; i++) {
			int64_t n;

			if (r->nulls[i])
				cols[i] = IDEM_V_NULL;
			else if (r->kind[i] == K_INT)
				cols[i] = IDEM_V_INT(r->ints[i]);
			else if (r->kind[i] == K_DOUBLE)
				cols[i] = IDEM_V_INT((int64_t)r->dbls[i]);
			else if (r->kind[i] == K_DECIMAL &&
				 idem__parse_int64(r->bufs[i], r->lens[i], &n) == 0)
				/* SUM() of integers is DECIMAL here, an integer elsewhere. */
				cols[i] = IDEM_V_INT(n);
			else if (r->kind[i] == K_BLOB)
				cols[i] = IDEM_V_BLOB(r->bufs[i], r->lens[i]);
			else
				cols[i] = IDEM_V_TEXTN(r->bufs[i], r->lens[i]);
		}
		if ((rc = fn(ctx, cols, r->ncols)) != 0) {
			rc = rc > 0 ? 0 : rc;
			goto done;
		}
	}
	if (f == MYSQL_DATA_TRUNCATED)
		rc = idem__error(IDEM_ESTORE, "mariadb: a column was truncated on fetch");
	else if (f != MYSQL_NO_DATA)
		rc = fail_stmt(c, st, CTX_BUSINESS, "fetch");
done:
	if (meta)
		mysql_free_result(meta);
	return rc;
}

/*
 * Run sql on c with params; call fn per row; report changes and the insert
 * id. The one place a statement is executed, so every path gets the same
 * classification and cleanup.
 */
static int run(conn *c, const char *sql, const idem_value *params, int n, idem_row_fn fn,
	       void *ctx, int64_t *changes, int64_t *insert_id, err_ctx ectx)
{
	MYSQL_STMT *st = NULL;
	MYSQL_BIND *pb = NULL;
	int64_t *ints = NULL;
	unsigned long *lens = NULL;
	results *r = NULL;
	int cached = 0, rc;

	if (!c->my || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "mariadb: connection lost");
	if ((rc = prepare(c, sql, &st, &cached)) < 0)
		return rc;
	if ((int)mysql_stmt_param_count(st) != n) {
		rc = idem__error(IDEM_EINVAL, "statement takes %lu parameters, %d given",
				 mysql_stmt_param_count(st), n);
		goto done;
	}
	if (n > 0) {
		pb = calloc((size_t)n, sizeof(*pb));
		ints = calloc((size_t)n, sizeof(*ints));
		lens = calloc((size_t)n, sizeof(*lens));
		if (!pb || !ints || !lens) {
			rc = idem__error(IDEM_ENOMEM, "out of memory");
			goto done;
		}
		for (int i = 0; i < n; i++) {
			const idem_value *v = &params[i];

			switch (v->type) {
			case IDEM_VAL_INT:
				ints[i] = v->i;
				pb[i].buffer_type = MYSQL_TYPE_LONGLONG;
				pb[i].buffer = &ints[i];
				break;
			case IDEM_VAL_TEXT:
			case IDEM_VAL_BLOB:
				pb[i].buffer_type = v->type == IDEM_VAL_TEXT ? MYSQL_TYPE_STRING
									     : MYSQL_TYPE_BLOB;
				/* The driver only reads the buffer; never NULL (that is SQL NULL). */
				pb[i].buffer = (void *)(v->p ? v->p : "");
				lens[i] = (unsigned long)v->len;
				pb[i].buffer_length = lens[i];
				pb[i].length = &lens[i];
				break;
			default: pb[i].buffer_type = MYSQL_TYPE_NULL; break;
			}
		}
		if (mysql_stmt_bind_param(st, pb) != 0) {
			rc = fail_stmt(c, st, CTX_PLAIN, "bind");
			goto done;
		}
	}
	if (nb_stmt_execute(c, st) != 0) {
		rc = fail_stmt(c, st, ectx, "statement");
		goto done;
	}
	if (mysql_stmt_field_count(st) > 0) {
		if (!(r = calloc(1, sizeof(*r)))) {
			rc = idem__error(IDEM_ENOMEM, "out of memory");
			goto done;
		}
		if ((rc = fetch_rows(c, st, r, fn, ctx)) < 0)
			goto done;
	} else if (changes) {
		*changes = (int64_t)mysql_stmt_affected_rows(st);
	}
	if (insert_id)
		*insert_id = (int64_t)mysql_stmt_insert_id(st);
done:
	if (r) {
		results_free(r);
		free(r);
	}
	if (st) {
		mysql_stmt_free_result(st);
		if (!cached)
			mysql_stmt_close(st);
	}
	free(pb);
	free(ints);
	free(lens);
	return rc;
}

/* A statement without parameters or rows, over the text protocol. */
static int simple(conn *c, const char *sql, const char *what)
{
	MYSQL_RES *res;

	if (!c->my || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "mariadb: connection lost");
	if (nb_query(c, sql, (unsigned long)strlen(sql)) != 0)
		return fail_conn(c, CTX_PLAIN, what);
	/* Drain a result set if there is one (SELECT GET_LOCK ...). */
	if ((res = nb_store_result(c)))
		mysql_free_result(res);
	else if (c->base.timed_out || c->lost || mysql_field_count(c->my) != 0)
		return fail_conn(c, CTX_PLAIN, what);
	return 0;
}

/* The server's status flags say a transaction is open on c. */
static int in_transaction(conn *c)
{
	unsigned int status = 0;

	if (mariadb_get_infov(c->my, MARIADB_CONNECTION_SERVER_STATUS, &status) != 0)
		return 1; /* cannot tell: treat it as out of step */
	return (status & SERVER_STATUS_IN_TRANS) != 0;
}

/*
 * After a statement of a unit succeeded: is the unit's transaction still
 * open? On Galera a replicated write set that wins certification rolls back
 * a local transaction holding its rows (a brute-force abort) at any moment,
 * also between two statements, and MariaDB 10.11 does not always report
 * that to the next statement as 1213: a prepared statement sent while the
 * abort is under way has been seen to run without the transaction (its
 * reads miss the unit's own rows: "refund ... vanished", "lease taken
 * over"), and a write then is refused by the session's READ ONLY default
 * (1792). The server's status flags, in every OK and EOF packet, tell:
 * the transaction is gone, so is everything the unit did, and it is
 * retried from the start on a new connection.
 */
static int unit_gone(conn *c, const char *what)
{
	if (!c->in_unit || in_transaction(c))
		return 0;
	c->base.broken = 1;
	c->in_unit = 0;
	return idem__error_driver(IDEM_ERETRY, ER_LOCK_DEADLOCK, "40001",
				  "mariadb: %s: the transaction was rolled back under it (a "
				  "Galera brute-force abort); connection dropped",
				  what);
}

static int row_int(void *ctx, const idem_value *cols, int n)
{
	if (n >= 1 && cols[0].type == IDEM_VAL_INT)
		*(int64_t *)ctx = cols[0].i;
	return 1;
}

/*
 * Has the server dropped c's statement, unanswered for waited_ms? On Galera,
 * a prepared statement that arrives while a brute-force abort of its
 * transaction is under way can be consumed without an answer (seen on
 * MariaDB 10.11: the server's session idle, the socket drained, the client
 * waiting for a reply until its deadline, units queued behind it shed).
 * Asked on the ping's own connection: 1 when the server shows c's session
 * idle (Sleep, or Killed by the abort) since before the statement was sent,
 * which no statement at work, waiting on a lock or on the cluster, ever
 * shows; 0 when it is at work or the question cannot be answered now.
 */
static int lost_statement(conn *c, int64_t waited_ms)
{
	static const char sql[] =
		"SELECT CASE WHEN command IN ('Sleep', 'Killed') AND time_ms >= ? THEN 1 ELSE 0 END"
		" FROM information_schema.processlist WHERE id = ?";
	idem__backend *be = c->base.txn.be;
	idem__netconn *pc = NULL;
	int64_t idle = 0;
	int fresh = 0;

	if (!be || c->base.pool == &be->ppool || !c->my)
		return 0;
	if (idem__net_take(be, IDEM__NET_PING,
			   idem__clock_monotonic_us() + (int64_t)IDEM__NET_PING_MS * 1000, &pc,
			   &fresh) < 0)
		return 0;
	{
		idem_value p[2] = {IDEM_V_INT(waited_ms > 200 ? waited_ms - 200 : 0),
				   IDEM_V_INT((int64_t)mysql_thread_id(c->my))};

		if (run((conn *)(void *)pc, sql, p, 2, row_int, &idle, NULL, NULL, CTX_PLAIN) < 0)
			idle = 0;
	}
	idem__net_give(be, pc);
	if (idle == 1) {
		/* An answer that came in meanwhile is still to be read. */
		struct pollfd pfd = {mysql_get_socket(c->my), POLLIN, 0};

		if (poll(&pfd, 1, 0) > 0)
			return 0;
	}
	return idle == 1;
}

/* ---- URLs ------------------------------------------------------------ */

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* Percent-decode s[0..len) into a new string; no NUL bytes allowed. */
static int decode(const char *s, size_t len, char **out)
{
	char *d = malloc(len + 1);
	size_t o = 0;

	*out = NULL;
	if (!d)
		return idem__error(IDEM_ENOMEM, "out of memory");
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '%') {
			int hi = -1, lo = -1;

			if (i + 2 < len) {
				hi = hexval(s[i + 1]);
				lo = hexval(s[i + 2]);
			}
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
				free(d);
				return idem__error(IDEM_EINVAL, "mariadb URL: bad percent escape");
			}
			d[o++] = (char)(hi * 16 + lo);
			i += 2;
		} else {
			d[o++] = s[i];
		}
	}
	d[o] = '\0';
	*out = d;
	return 0;
}

static void wipe_free(char *s)
{
	if (!s)
		return;
	/* volatile: the password must not survive in freed memory. */
	for (volatile char *p = s; *p; p++)
		*p = '\0';
	free(s);
}

static void url_clear(my_url *u)
{
	free(u->user);
	wipe_free(u->password);
	free(u->host);
	free(u->db);
	free(u->socket);
	memset(u, 0, sizeof(*u));
}

/*
 * "//user[:password]@host[:port]/db[?socket=PATH]", each part
 * percent-decoded. host may be an IPv6 literal in brackets.
 */
static int url_parse(my_url *u, const char *t)
{
	const char *auth, *auth_end, *at = NULL, *hp, *colon = NULL, *path_end, *q;
	int rc = 0;

	memset(u, 0, sizeof(*u));
	if (strncmp(t, "//", 2) != 0)
		goto bad;
	auth = t + 2;
	auth_end = auth + strcspn(auth, "/?#");
	if (*auth_end != '/')
		goto bad; /* the database is required */
	for (const char *p = auth; p < auth_end; p++)
		if (*p == '@')
			at = p; /* the last '@': an unescaped one in a password still works */
	if (!at || at == auth)
		goto bad; /* the user is required */
	for (const char *p = auth; p < at; p++)
		if (*p == ':') {
			colon = p;
			break;
		}
	if ((rc = decode(auth, (size_t)((colon ? colon : at) - auth), &u->user)) < 0)
		goto done;
	if (!*u->user)
		goto bad; /* ":password@" alone: the user is still required */
	if (colon && (rc = decode(colon + 1, (size_t)(at - colon - 1), &u->password)) < 0)
		goto done;
	hp = at + 1;
	if (*hp == '[') {
		const char *close = memchr(hp, ']', (size_t)(auth_end - hp));

		if (!close)
			goto bad;
		if ((rc = decode(hp + 1, (size_t)(close - hp - 1), &u->host)) < 0)
			goto done;
		colon = close + 1 < auth_end && close[1] == ':' ? close + 1 : NULL;
		if (close + 1 < auth_end && !colon)
			goto bad;
	} else {
		colon = memchr(hp, ':', (size_t)(auth_end - hp));
		if ((rc = decode(hp, (size_t)((colon ? colon : auth_end) - hp), &u->host)) < 0)
			goto done;
	}
	if (colon) {
		unsigned long port = 0;

		if (colon + 1 == auth_end)
			goto bad;
		for (const char *p = colon + 1; p < auth_end; p++) {
			if (*p < '0' || *p > '9' || port > 65535)
				goto bad;
			port = port * 10 + (unsigned long)(*p - '0');
		}
		if (port == 0 || port > 65535)
			goto bad;
		u->port = (unsigned int)port;
	}
	path_end = auth_end + 1 + strcspn(auth_end + 1, "?#");
	if (path_end == auth_end + 1 || memchr(auth_end + 1, '/', (size_t)(path_end - auth_end - 1)))
		goto bad;
	if ((rc = decode(auth_end + 1, (size_t)(path_end - auth_end - 1), &u->db)) < 0)
		goto done;
	q = path_end;
	while (*q == '?' || *q == '&') {
		const char *key = q + 1, *val, *end = key + strcspn(key, "&#");

		val = memchr(key, '=', (size_t)(end - key));
		if (!val || (size_t)(val - key) != 6 || strncmp(key, "socket", 6) != 0 || u->socket)
			goto bad;
		if ((rc = decode(val + 1, (size_t)(end - val - 1), &u->socket)) < 0)
			goto done;
		q = end;
	}
	if (*q != '\0')
		goto bad;
	if (!*u->host && !u->socket)
		goto bad;
	goto done;
bad:
	rc = idem__error(IDEM_EINVAL, "mariadb URL must look like mysql://user[:password]@host"
				      "[:port]/db[?socket=PATH]");
done:
	if (rc < 0)
		url_clear(u);
	return rc;
}

/* ---- connections ----------------------------------------------------- */

static pthread_once_t library_once = PTHREAD_ONCE_INIT;
static int library_rc;

static void library_init(void)
{
	/* Not thread-safe inside mysql_init, so done once up front. */
	library_rc = mysql_library_init(0, NULL, NULL);
}

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
	arm(c, CONNECT_TIMEOUT_S * 1000);
	NB_RUN(c, ok,
	       mysql_real_connect_start(&ok, c->my, *u->host ? u->host : NULL, u->user,
					u->password, u->db, u->port, u->socket, CLIENT_FOUND_ROWS),
	       mysql_real_connect_cont, c->my);
	if (!ok || c->base.timed_out) {
		if (c->base.timed_out)
			rc = idem__error(IDEM_EUNAVAIL, "mariadb: connect: no answer from the "
							"server before the deadline");
		else
			rc = idem__error_driver(IDEM_EUNAVAIL, (int)mysql_errno(c->my),
						mysql_sqlstate(c->my), "mariadb: connect: %s (errno %u)",
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
	if ((rc = simple(c, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
			 "session setup")) < 0 ||
	    (rc = simple(c, setup, "session setup")) < 0) {
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
	if ((rc = simple(c, "SET SESSION TRANSACTION READ ONLY", "session setup")) < 0)
		conn_close(c);
	return rc;
}

static void drv_disconnect(idem__netconn *c)
{
	conn_close((conn *)(void *)c);
}

static int drv_in_transaction(idem__netconn *c)
{
	return in_transaction((conn *)(void *)c);
}

static int drv_simple(idem__netconn *nc, const char *sql, const char *what)
{
	conn *c = (conn *)(void *)nc;
	int rc = simple(c, sql, what);

	if (rc == 0 && strcmp(what, "begin") == 0)
		c->in_unit = 1;
	else if (rc == 0)
		rc = unit_gone(c, what);
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
		if ((rc = simple(c, "SET SESSION TRANSACTION READ WRITE", "session setup")) < 0)
			return rc;
		c->in_unit = 0;
		c->read_write = 1;
	}
	rc = run(c, sql, params, n, fn, ctx, changes, NULL, CTX_BUSINESS);
	return rc == 0 ? unit_gone(c, "statement") : rc;
}

/* 1213 at COMMIT is a Galera certification conflict: retryable. A lost
 * connection leaves the outcome unknown: unavailable. */
static int drv_commit(idem__netconn *nc)
{
	conn *c = (conn *)(void *)nc;
	int rc;

	/* A COMMIT without the transaction would commit nothing and succeed. */
	if ((rc = unit_gone(c, "commit")) < 0)
		return rc;
	c->in_unit = 0;
	rc = simple(c, "COMMIT", "commit");
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
	return nb_query(c, "ROLLBACK", 8);
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
		return idem__error_driver(IDEM_ERETRY, ER_SP_DOES_NOT_EXIST, mysql_sqlstate(c->my),
					  "mariadb: %s: transaction rolled back under it (errno 1305)",
					  verb);
	return rc;
}

static void url_free(void *state)
{
	url_clear(state);
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
	if ((rc = simple(c, "SET SESSION TRANSACTION READ WRITE", "session setup")) < 0)
		goto out;
	/* GET_LOCK serialises migrating processes; it is released when the
	 * connection ends too, so a crashed migrator never blocks the next. */
	if ((rc = run(c, "SELECT GET_LOCK(" MIGRATE_LOCK ", 60)", NULL, 0, idem_row_int, &got, NULL,
		      NULL, CTX_PLAIN)) < 0)
		goto out;
	if (got != 1) {
		rc = idem__error(IDEM_ERETRY, "mariadb: timed out waiting for the migration lock");
		goto out;
	}
	locked = 1;
	if ((rc = simple(c, "CREATE TABLE IF NOT EXISTS idem_schema_version ("
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
			if ((rc = simple(c, *s, "migration")) < 0)
				goto out;
		if ((rc = run(c, "INSERT INTO idem_schema_version (version, applied_at) VALUES (?, ?)",
			      p, 2, NULL, NULL, NULL, NULL, CTX_PLAIN)) < 0)
			goto out;
		cur = v;
	}
	if (version_out)
		*version_out = cur;
out:
	if (locked && !c->base.broken &&
	    simple(c, "DO RELEASE_LOCK(" MIGRATE_LOCK ")", "unlock") < 0 && rc == 0)
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
	if ((rc = url_parse(u, target ? target : "")) < 0) {
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
	if (url_parse(&u, colon + 1) == 0 && conn_open(&be, &c) == 0) {
		my = c.my; /* no statements cached yet: the handle is all there is */
		c.my = NULL;
	}
	url_clear(&u);
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
	int rc = run(conn_of(txn), sql, p, 10, NULL, NULL, NULL, &id, CTX_CLAIM);

	if (rc == 0)
		rc = unit_gone(conn_of(txn), "claim");
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
