/*
 * store/mariadb_stmt.c: statements on a MariaDB connection: prepared once
 * per connection and kept by their SQL text, parameters bound, results
 * converted to idem values (SUM() of integers is DECIMAL here, an integer
 * elsewhere), and the checks that a unit's transaction is still open after
 * each of its statements (on Galera a brute-force abort can take it between
 * two statements without telling the next one).
 */
#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "store/mariadb_int.h"
#include "util/clock.h"
#include "util/error.h"

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
		return idem__my_fail_conn(c, CTX_PLAIN, "stmt_init");
	if (idem__my_nb_stmt_prepare(c, st, sql, (unsigned long)strlen(sql)) != 0) {
		rc = idem__my_fail_stmt(c, st, CTX_BUSINESS, "prepare");
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

/* A buffer in r for each column of meta, text and blobs as long as their
 * longest value; r->ncols counts those to free, also on failure. */
static int bind_columns(results *r, MYSQL_RES *meta)
{
	MYSQL_FIELD *fields = mysql_fetch_fields(meta);

	if ((int)mysql_num_fields(meta) > MAX_COLS)
		return idem__error(IDEM_EINVAL, "query returns more than %d columns", MAX_COLS);
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
				return idem__error(IDEM_ENOMEM, "out of memory");
			}
			b->buffer_type = r->kind[i] == K_BLOB ? MYSQL_TYPE_BLOB : MYSQL_TYPE_STRING;
			b->buffer = r->bufs[i];
			b->buffer_length = (unsigned long)size;
		}
	}
	return 0;
}

/* The row just fetched into r, as idem values pointing into r's buffers. */
static void row_values(const results *r, idem_value *cols)
{
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
}

static int fetch_rows(conn *c, MYSQL_STMT *st, results *r, idem_row_fn fn, void *ctx)
{
	MYSQL_RES *meta = NULL;
	my_bool one = 1;
	int rc = 0, f;

	/* max_length tells how big each text/blob buffer must be. */
	mysql_stmt_attr_set(st, STMT_ATTR_UPDATE_MAX_LENGTH, &one);
	if (idem__my_nb_stmt_store_result(c, st) != 0)
		return idem__my_fail_stmt(c, st, CTX_BUSINESS, "store_result");
	if (!fn)
		return 0;
	if (!(meta = mysql_stmt_result_metadata(st)))
		return idem__my_fail_stmt(c, st, CTX_PLAIN, "result_metadata");
	if ((rc = bind_columns(r, meta)) < 0)
		goto done;
	if (mysql_stmt_bind_result(st, r->bind) != 0) {
		rc = idem__my_fail_stmt(c, st, CTX_PLAIN, "bind_result");
		goto done;
	}
	while ((f = mysql_stmt_fetch(st)) == 0) {
		idem_value cols[MAX_COLS];

		row_values(r, cols);
		if ((rc = fn(ctx, cols, r->ncols)) != 0) {
			rc = rc > 0 ? 0 : rc;
			goto done;
		}
	}
	if (f == MYSQL_DATA_TRUNCATED)
		rc = idem__error(IDEM_ESTORE, "mariadb: a column was truncated on fetch");
	else if (f != MYSQL_NO_DATA)
		rc = idem__my_fail_stmt(c, st, CTX_BUSINESS, "fetch");
done:
	if (meta)
		mysql_free_result(meta);
	return rc;
}

/* Point b at v; the driver reads an integer from *num and a length from
 * *len, which must live until the statement has run. */
static void bind_param(MYSQL_BIND *b, int64_t *num, unsigned long *len, const idem_value *v)
{
	switch (v->type) {
	case IDEM_VAL_INT:
		*num = v->i;
		b->buffer_type = MYSQL_TYPE_LONGLONG;
		b->buffer = num;
		break;
	case IDEM_VAL_TEXT:
	case IDEM_VAL_BLOB:
		b->buffer_type = v->type == IDEM_VAL_TEXT ? MYSQL_TYPE_STRING : MYSQL_TYPE_BLOB;
		/* The driver only reads the buffer; never NULL (that is SQL NULL). */
		b->buffer = (void *)(v->p ? v->p : "");
		*len = (unsigned long)v->len;
		b->buffer_length = *len;
		b->length = len;
		break;
	default: b->buffer_type = MYSQL_TYPE_NULL; break;
	}
}

/*
 * Run sql on c with params; call fn per row; report changes and the insert
 * id. The one place a statement is executed, so every path gets the same
 * classification and cleanup.
 */
int idem__my_run(conn *c, const char *sql, const idem_value *params, int n, idem_row_fn fn,
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
		for (int i = 0; i < n; i++)
			bind_param(&pb[i], &ints[i], &lens[i], &params[i]);
		if (mysql_stmt_bind_param(st, pb) != 0) {
			rc = idem__my_fail_stmt(c, st, CTX_PLAIN, "bind");
			goto done;
		}
	}
	if (idem__my_nb_stmt_execute(c, st) != 0) {
		rc = idem__my_fail_stmt(c, st, ectx, "statement");
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
int idem__my_simple(conn *c, const char *sql, const char *what)
{
	MYSQL_RES *res;

	if (!c->my || c->base.broken)
		return idem__error(IDEM_EUNAVAIL, "mariadb: connection lost");
	if (idem__my_nb_query(c, sql, (unsigned long)strlen(sql)) != 0)
		return idem__my_fail_conn(c, CTX_PLAIN, what);
	/* Drain a result set if there is one (SELECT GET_LOCK ...). */
	if ((res = idem__my_nb_store_result(c)))
		mysql_free_result(res);
	else if (c->base.timed_out || c->lost || mysql_field_count(c->my) != 0)
		return idem__my_fail_conn(c, CTX_PLAIN, what);
	return 0;
}

/* The server's status flags say a transaction is open on c. */
int idem__my_in_transaction(conn *c)
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
int idem__my_unit_gone(conn *c, const char *what)
{
	if (!c->in_unit || idem__my_in_transaction(c))
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
int idem__my_lost_statement(conn *c, int64_t waited_ms)
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

		if (idem__my_run((conn *)(void *)pc, sql, p, 2, row_int, &idle, NULL, NULL,
		                 CTX_PLAIN) < 0)
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
