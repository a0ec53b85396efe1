/*
 * store/records.c: the record writes whose SQL is the same on every
 * backend (conditional UPDATEs and a DELETE keyed by id, version and
 * owner) and the reads of one record, written once on top of each
 * backend's generic execute/query. What differs between databases (the
 * claim INSERT and how its conflict shows, purge batches) stays in the
 * backend files.
 */
#include <stdlib.h>
#include <string.h>

#include "store/backend.h"
#include "util/error.h"

const char *idem__status_name(idem__status st)
{
	switch (st) {
	case IDEM__ST_PROCESSING: return "PROCESSING";
	case IDEM__ST_SUCCEEDED: return "SUCCEEDED";
	case IDEM__ST_FAILED: return "FAILED";
	}
	return "?";
}

int idem__status_parse(const char *s, size_t len, idem__status *out)
{
	for (int st = IDEM__ST_PROCESSING; st <= IDEM__ST_FAILED; st++) {
		const char *name = idem__status_name((idem__status)st);

		if (strlen(name) == len && memcmp(name, s, len) == 0) {
			*out = (idem__status)st;
			return 0;
		}
	}
	return idem__error(IDEM_ESTORE, "unknown record status '%.*s'", (int)len, s);
}

void idem__record_clear(idem__record *rec)
{
	if (!rec)
		return;
	free(rec->body);
	memset(rec, 0, sizeof(*rec));
}

int idem_row_int(void *ctx, const idem_value *cols, int ncols)
{
	IDEM__ASSERT_ARG(ctx);
	IDEM__ASSERT_ARG(cols || ncols <= 0);
	*(int64_t *)ctx = ncols > 0 && cols[0].type == IDEM_VAL_INT ? cols[0].i : 0;
	return 1;
}

#define RECORD_COLS                                                                                \
	"id, version, status, fingerprint, owner, http_status, response, lease_until, "            \
	"created_at, expires_at"

static const char sql_get[] = "SELECT " RECORD_COLS " FROM idem_records"
                              " WHERE scope = ? AND business_type = ? AND idem_key = ?";

/* Fill an idem__record (ctx) from one row of RECORD_COLS; one row is enough. */
static int record_row(void *ctx, const idem_value *c, int n)
{
	idem__record *r = ctx;
	int rc;

	if (n != 10 || c[0].type != IDEM_VAL_INT || c[1].type != IDEM_VAL_INT ||
	    c[2].type != IDEM_VAL_TEXT || c[3].type != IDEM_VAL_TEXT || c[8].type != IDEM_VAL_INT ||
	    c[9].type != IDEM_VAL_INT)
		return idem__error(IDEM_ESTORE, "record row malformed (%d columns)", n);
	r->id = c[0].i;
	r->version = c[1].i;
	if ((rc = idem__status_parse(c[2].p, c[2].len, &r->status)) < 0)
		return rc;
	if (c[3].len != IDEM_FINGERPRINT_LEN)
		return idem__error(IDEM_ESTORE, "record fingerprint malformed");
	memcpy(r->fingerprint, c[3].p, IDEM_FINGERPRINT_LEN);
	r->fingerprint[IDEM_FINGERPRINT_LEN] = '\0';
	if (c[4].type == IDEM_VAL_TEXT && c[4].len < sizeof(r->owner)) {
		memcpy(r->owner, c[4].p, c[4].len);
		r->owner[c[4].len] = '\0';
	}
	r->http_status = c[5].type == IDEM_VAL_INT ? (int)c[5].i : 0;
	if (c[6].type == IDEM_VAL_BLOB || c[6].type == IDEM_VAL_TEXT) {
		if (!(r->body = malloc(c[6].len ? c[6].len : 1)))
			return idem__error(IDEM_ENOMEM, "out of memory");
		if (c[6].len)
			memcpy(r->body, c[6].p, c[6].len);
		r->body_len = c[6].len;
	}
	r->lease_until = c[7].type == IDEM_VAL_INT ? c[7].i : 0;
	r->created_at = c[8].i;
	r->expires_at = c[9].i;
	return 1;
}

/* What a read found: the record, or IDEM_ENOTFOUND; nothing kept on error. */
static int got(int rc, idem__record *out)
{
	if (rc < 0) {
		idem__record_clear(out);
		return rc;
	}
	return out->id ? 0 : IDEM_ENOTFOUND;
}

int idem__rec_get(idem_txn *txn, const idem__key *k, idem__record *out)
{
	idem_value p[3] = {IDEM_V_TEXTN(k->scope, k->scope_len), IDEM_V_TEXTN(k->type, k->type_len),
	                   IDEM_V_TEXTN(k->key, k->key_len)};

	memset(out, 0, sizeof(*out));
	return got(txn->ops->txn_query(txn, sql_get, p, 3, record_row, out), out);
}

int idem__rec_read(const idem__backend_ops *ops, idem__backend *be, const idem__key *k,
                   idem__record *out)
{
	idem_value p[3] = {IDEM_V_TEXTN(k->scope, k->scope_len), IDEM_V_TEXTN(k->type, k->type_len),
	                   IDEM_V_TEXTN(k->key, k->key_len)};

	memset(out, 0, sizeof(*out));
	return got(ops->read_query(be, sql_get, p, 3, record_row, out), out);
}

static int changed_one(idem_txn *txn, const char *sql, const idem_value *p, int n, int *changed)
{
	int64_t ch = 0;
	int rc = txn->ops->txn_exec(txn, sql, p, n, &ch);

	*changed = rc == 0 && ch == 1;
	return rc;
}

int idem__rec_takeover(idem_txn *txn, int64_t id, int64_t version, const idem__record *rec,
                       int *changed)
{
	static const char sql[] =
	    "UPDATE idem_records SET version = version + 1, status = 'PROCESSING',"
	    " fingerprint = ?, owner = ?, http_status = NULL, response = NULL,"
	    " lease_until = ?, created_at = ?, expires_at = ?, completed_at = NULL"
	    " WHERE id = ? AND version = ?";
	idem_value p[7] = {IDEM_V_TEXT(rec->fingerprint),
	                   IDEM_V_TEXT(rec->owner),
	                   IDEM_V_INT(rec->lease_until),
	                   IDEM_V_INT(rec->created_at),
	                   IDEM_V_INT(rec->expires_at),
	                   IDEM_V_INT(id),
	                   IDEM_V_INT(version)};

	return changed_one(txn, sql, p, 7, changed);
}

int idem__rec_complete(idem_txn *txn, int64_t id, const char *owner, idem__status st,
                       int http_status, const unsigned char *body, size_t len, int64_t now,
                       int *changed)
{
	static const char sql[] =
	    "UPDATE idem_records SET version = version + 1, status = ?, http_status = ?,"
	    " response = ?, owner = NULL, lease_until = NULL, completed_at = ?"
	    " WHERE id = ? AND owner = ? AND status = 'PROCESSING'";
	idem_value p[6] = {IDEM_V_TEXT(idem__status_name(st)),
	                   IDEM_V_INT(http_status),
	                   IDEM_V_BLOB(body, len),
	                   IDEM_V_INT(now),
	                   IDEM_V_INT(id),
	                   IDEM_V_TEXT(owner)};

	return changed_one(txn, sql, p, 6, changed);
}

int idem__rec_extend(idem_txn *txn, int64_t id, const char *owner, int64_t lease_until,
                     int *changed)
{
	static const char sql[] = "UPDATE idem_records SET lease_until = ?"
	                          " WHERE id = ? AND owner = ? AND status = 'PROCESSING'";
	idem_value p[3] = {IDEM_V_INT(lease_until), IDEM_V_INT(id), IDEM_V_TEXT(owner)};

	return changed_one(txn, sql, p, 3, changed);
}

int idem__rec_delete_owned(idem_txn *txn, int64_t id, const char *owner, int *changed)
{
	static const char sql[] =
	    "DELETE FROM idem_records WHERE id = ? AND owner = ? AND status = 'PROCESSING'";
	idem_value p[2] = {IDEM_V_INT(id), IDEM_V_TEXT(owner)};

	return changed_one(txn, sql, p, 2, changed);
}
