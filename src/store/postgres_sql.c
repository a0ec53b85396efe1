/*
 * store/postgres_sql.c: the PostgreSQL dialect's translations, with no I/O:
 * a failed statement's SQLSTATE to an idem code (postgres.c's header says
 * which means what), the generic `?` placeholders to $1..$n, idem values to
 * libpq parameters, and result rows to idem values.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/postgres_int.h"
#include "util/error.h"

/* ---- errors ---------------------------------------------------------- */

static int is_state(const char *s, const char *want)
{
	return s && strcmp(s, want) == 0;
}

static int is_class(const char *s, const char *cls)
{
	return s && strncmp(s, cls, 2) == 0;
}

int idem__pg_fail(conn *c, const PGresult *res, err_ctx ctx, const char *what)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *cons = res ? PQresultErrorField(res, PG_DIAG_CONSTRAINT_NAME) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : "";
	def_kind queued = c->failed_kind;
	int code, len;

	c->failed_kind = 0;
	if (res && queued) {
		/* A queued statement failed: the one that waited did not run. */
		ctx = CTX_PLAIN;
		what = c->failed_what;
		if (queued == DEF_COMPLETE && is_state(state, "22012"))
			/* pg_rec_complete_held's "1 / count(*)": it matched no row. */
			return idem__error(IDEM_ELEASE, "the claim's lease was taken over");
	}

	if (!res && c->base.timed_out)
		msg = "the server did not answer before the deadline; connection dropped";
	if (!msg || !*msg)
		msg = c->pg ? PQerrorMessage(c->pg) : "no connection";
	len = (int)strlen(msg);
	while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
		len--;
	if (!c->pg || PQstatus(c->pg) == CONNECTION_BAD || !state) {
		/* libpq's own failure (no SQLSTATE): the connection is gone or
		 * out of step; never reuse it. */
		c->base.broken = 1;
		code = IDEM_EUNAVAIL;
	} else if (is_state(state, "23505")) {
		if (ctx == CTX_CLAIM && is_state(cons, "idem_records_key"))
			return IDEM__DUPLICATE;
		code = ctx == CTX_BUSINESS ? IDEM_ECONFLICT : IDEM_ESTORE;
	} else if (is_class(state, "23")) {
		code = IDEM_ECONSTRAINT;
	} else if (is_state(state, "40001") || is_state(state, "40P01") ||
	           is_state(state, "55P03")) {
		code = IDEM_ERETRY;
	} else if (is_class(state, "08") || is_state(state, "57P01") || is_state(state, "57P02") ||
	           is_state(state, "57P03")) {
		c->base.broken = 1;
		code = IDEM_EUNAVAIL;
	} else if (is_state(state, "57014")) {
		code = IDEM_EUNAVAIL; /* statement_timeout: the server's own bound */
	} else if (is_state(state, "53300")) {
		code = IDEM_EUNAVAIL; /* too many connections */
	} else if (is_state(state, "22003")) {
		/* numeric_value_out_of_range: the request's values, not the store;
		 * permanent, never "unavailable" (issue 16). */
		code = IDEM_EINVAL;
	} else if (is_state(state, "XX001") || is_state(state, "XX002")) {
		code = IDEM_ECORRUPT;
	} else {
		code = IDEM_ESTORE;
	}
	return idem__error_driver(code, 0, state, "postgresql: %s: %.*s (SQLSTATE %s)", what, len,
	                          msg, state ? state : "none");
}

/* ---- SQL text -------------------------------------------------------- */

/* The end of the '...' or "..." opening at sql[i]: a `?` inside is text.
 * E'...' strings take backslash escapes; doubling escapes in all. */
static size_t quoted_end(const char *sql, size_t len, size_t i)
{
	char ch = sql[i];
	int esc = ch == '\'' && i > 0 && (sql[i - 1] == 'E' || sql[i - 1] == 'e');

	i++;
	while (i < len) {
		if (esc && sql[i] == '\\' && i + 1 < len) {
			i++;
		} else if (sql[i] == ch) {
			if (i + 1 < len && sql[i + 1] == ch) {
				i++;
			} else {
				break;
			}
		}
		i++;
	}
	return i < len ? i + 1 : i;
}

/* The end of the block comment opening at sql[i] (PostgreSQL's nest). */
static size_t comment_end(const char *sql, size_t len, size_t i)
{
	int depth = 0;

	do {
		if (sql[i] == '/' && i + 1 < len && sql[i + 1] == '*') {
			depth++;
			i++;
		} else if (sql[i] == '*' && i + 1 < len && sql[i + 1] == '/') {
			depth--;
			i++;
		}
		i++;
	} while (i < len && depth > 0);
	return i;
}

/* At a '$' that no identifier character precedes: *end is past the
 * $tag$ ... $tag$ opening there (tag may be empty), or past the '$' alone
 * when none does. */
static int dollar_end(const char *sql, size_t len, size_t i, size_t *end)
{
	size_t t = i + 1;
	const char *close;

	while (t < len &&
	       (sql[t] == '_' || (sql[t] >= 'a' && sql[t] <= 'z') ||
	        (sql[t] >= 'A' && sql[t] <= 'Z') || (t > i + 1 && sql[t] >= '0' && sql[t] <= '9')))
		t++;
	if (t < len && sql[t] == '$') {
		size_t tag = t + 1 - i;
		char delim[72];

		if (tag >= sizeof(delim))
			return idem__error(IDEM_EINVAL, "dollar-quote tag too long");
		memcpy(delim, sql + i, tag);
		delim[tag] = '\0';
		close = strstr(sql + i + tag, delim);
		*end = close ? (size_t)(close - sql) + tag : len;
	} else {
		*end = i + 1;
	}
	return 0;
}

/* `?` to $1..$n outside strings, quoted names, comments and dollar quotes,
 * whose text is copied as it is. */
int idem__pg_rewrite(const char *sql, char **out, int *nparams)
{
	size_t len = strlen(sql), o = 0, cap;
	char *buf;
	int n = 0, rc;

	*out = NULL;
	if (len > SQL_MAX)
		return idem__error(IDEM_EINVAL, "SQL text longer than %d bytes", SQL_MAX);
	/* Each one-byte `?` becomes at most "$" and 7 digits. */
	cap = len * 8 + 1;
	if (!(buf = malloc(cap)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	for (size_t i = 0; i < len;) {
		char ch = sql[i];
		size_t end = i + 1;

		if (ch == '?') {
			o += (size_t)snprintf(buf + o, cap - o, "$%d", ++n);
			i++;
			continue;
		}
		if (ch == '\'' || ch == '"') {
			end = quoted_end(sql, len, i);
		} else if (ch == '-' && i + 1 < len && sql[i + 1] == '-') {
			end = i + strcspn(sql + i, "\n");
		} else if (ch == '/' && i + 1 < len && sql[i + 1] == '*') {
			end = comment_end(sql, len, i);
		} else if (ch == '$' && (i == 0 || !(sql[i - 1] == '_' ||
		                                     (sql[i - 1] >= 'a' && sql[i - 1] <= 'z') ||
		                                     (sql[i - 1] >= 'A' && sql[i - 1] <= 'Z') ||
		                                     (sql[i - 1] >= '0' && sql[i - 1] <= '9')))) {
			if ((rc = dollar_end(sql, len, i, &end)) < 0) {
				free(buf);
				return rc;
			}
		}
		memcpy(buf + o, sql + i, end - i);
		o += end - i;
		i = end;
	}
	buf[o] = '\0';
	*out = buf;
	*nparams = n;
	return 0;
}

/* ---- parameters and results ------------------------------------------ */

void idem__pg_bound_free(bound *b)
{
	free(b->mem);
	memset(b, 0, sizeof(*b));
}

int idem__pg_bind_params(bound *b, const idem_value *params, int n)
{
	size_t size = 0, off;
	char *text;

	memset(b, 0, sizeof(*b));
	if (n <= 0)
		return 0;
	for (int i = 0; i < n; i++) {
		if (params[i].type == IDEM_VAL_TEXT) {
			if (params[i].len && memchr(params[i].p, '\0', params[i].len))
				return idem__error(
				    IDEM_EINVAL,
				    "postgresql text cannot hold a NUL byte (parameter %d)", i + 1);
			size += params[i].len + 1;
		} else if (params[i].type == IDEM_VAL_INT) {
			size += 24;
		}
	}
	off = (size_t)n * (sizeof(char *) + 2 * sizeof(int));
	if (!(b->mem = malloc(off + size + 1)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	b->values = (const char **)(void *)b->mem;
	b->lengths = (int *)(void *)(b->mem + (size_t)n * sizeof(char *));
	b->formats = b->lengths + n;
	text = b->mem + off;
	for (int i = 0; i < n; i++) {
		const idem_value *v = &params[i];

		b->lengths[i] = 0;
		b->formats[i] = 0;
		switch (v->type) {
		case IDEM_VAL_INT:
			b->values[i] = text;
			text += snprintf(text, 24, "%lld", (long long)v->i) + 1;
			break;
		case IDEM_VAL_TEXT:
			if (v->len)
				memcpy(text, v->p, v->len);
			text[v->len] = '\0';
			b->values[i] = text;
			text += v->len + 1;
			break;
		case IDEM_VAL_BLOB:
			if (v->len > 0x7fffffff) {
				idem__pg_bound_free(b);
				return idem__error(IDEM_EINVAL, "blob parameter too large");
			}
			/* Never a NULL pointer: that would bind SQL NULL, not an empty blob. */
			b->values[i] = v->p ? v->p : "";
			b->lengths[i] = (int)v->len;
			b->formats[i] = 1;
			break;
		default: b->values[i] = NULL; break;
		}
	}
	return 0;
}

/* Call fn for each row of res; bytea is unescaped, integers parsed. */
int idem__pg_deliver_rows(PGresult *res, idem_row_fn fn, void *ctx)
{
	int nrows = PQntuples(res), ncols = PQnfields(res), rc = 0;
	unsigned char *owned[MAX_COLS];

	if (!fn || nrows == 0)
		return 0;
	if (ncols > MAX_COLS)
		return idem__error(IDEM_EINVAL, "query returns more than %d columns", MAX_COLS);
	for (int r = 0; r < nrows && rc == 0; r++) {
		idem_value cols[MAX_COLS];
		int nowned = 0;

		for (int i = 0; i < ncols; i++) {
			const char *v = PQgetvalue(res, r, i);
			size_t len = (size_t)PQgetlength(res, r, i);
			Oid type = PQftype(res, i);
			int64_t n;

			if (PQgetisnull(res, r, i)) {
				cols[i] = IDEM_V_NULL;
			} else if (type == OID_BYTEA) {
				size_t blen = 0;
				unsigned char *b = PQunescapeBytea((const unsigned char *)v, &blen);

				if (!b) {
					rc = idem__error(IDEM_ENOMEM, "out of memory");
					break;
				}
				owned[nowned++] = b;
				cols[i] = IDEM_V_BLOB(b, blen);
			} else if (type == OID_BOOL) {
				cols[i] = IDEM_V_INT(v[0] == 't');
			} else if ((type == OID_INT8 || type == OID_INT4 || type == OID_INT2 ||
			            type == OID_OID || type == OID_NUMERIC) &&
			           idem__parse_int64(v, len, &n) == 0) {
				/* numeric too when integral: sum(bigint) is numeric here,
				 * an integer in the other backends. */
				cols[i] = IDEM_V_INT(n);
			} else {
				cols[i] = IDEM_V_TEXTN(v, len);
			}
		}
		if (rc == 0 && (rc = fn(ctx, cols, ncols)) > 0)
			rc = 1;
		for (int i = 0; i < nowned; i++)
			PQfreemem(owned[i]);
	}
	return rc > 0 ? 0 : rc;
}
