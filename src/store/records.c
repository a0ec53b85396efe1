/*
 * store/records.c: the record writes whose SQL is the same on every
 * backend (conditional UPDATEs and a DELETE keyed by id, version and
 * owner), written once on top of each backend's txn_exec. What differs
 * between databases (the claim INSERT and how its conflict shows, reads,
 * purge batches) stays in the backend files.
 */
#include "store/backend.h"
#include "store/store.h"

static int changed_one(idem_txn *txn, const char *sql, const idem_value *p, int n, int *changed)
{
	int64_t ch = 0;
	int rc = txn->store->ops->txn_exec(txn, sql, p, n, &ch);

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
	idem_value p[7] = {IDEM_V_TEXT(rec->fingerprint), IDEM_V_TEXT(rec->owner),
			   IDEM_V_INT(rec->lease_until),  IDEM_V_INT(rec->created_at),
			   IDEM_V_INT(rec->expires_at),   IDEM_V_INT(id),
			   IDEM_V_INT(version)};

	return changed_one(txn, sql, p, 7, changed);
}

int idem__rec_complete(idem_txn *txn, int64_t id, const char *owner, idem__status st,
		       int http_status, const unsigned char *body, size_t len, int *changed)
{
	static const char sql[] =
		"UPDATE idem_records SET version = version + 1, status = ?, http_status = ?,"
		" response = ?, owner = NULL, lease_until = NULL, completed_at = ?"
		" WHERE id = ? AND owner = ? AND status = 'PROCESSING'";
	idem_value p[6] = {IDEM_V_TEXT(idem__status_name(st)),
			   IDEM_V_INT(http_status),
			   IDEM_V_BLOB(body, len),
			   IDEM_V_INT(idem_store_now(txn->store)),
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
