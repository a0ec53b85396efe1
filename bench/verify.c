/*
 * bench/verify.c: exactly-once, checked after the load. On SQLite the
 * database file is opened read-only and its rows are counted: one payment
 * per acknowledged payment key, one notification, refund, transfer per
 * acknowledged key, and every balance equal to the sum of its ledger
 * entries. On every store, each merchant's balance as idemd reports it
 * (GET /v1/balance) must have moved by exactly what the acknowledged
 * requests predict. A request that got no answer may or may not exist; the
 * counts allow for those and say how many there were.
 */
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct {
	uint64_t acked, unsure;
} tally;

static void count_keys(bench *b, req_type type, tally *out)
{
	uint64_t n = atomic_load(&b->alloc[type]);

	memset(out, 0, sizeof(*out));
	if (type == REQ_NOTIFICATION)
		n = atomic_load(&b->alloc[REQ_PAYMENT]);
	for (uint64_t i = 0; i < n; i++) {
		unsigned f;

		if (type == REQ_PAYMENT || type == REQ_NOTIFICATION) {
			pay_slot *ps = slot_get(&b->pays, i);

			f = ps ? atomic_load(&ps->flags) : 0;
			if (type == REQ_NOTIFICATION)
				f = ((f & F_NACK) ? F_ACK : 0) | ((f & F_NUNSURE) ? F_UNSURE : 0);
		} else {
			key_slot *ks =
			    slot_get(type == REQ_REFUND ? &b->refunds : &b->transfers, i);

			f = ks ? atomic_load(&ks->flags) : 0;
		}
		if (f & F_ACK)
			out->acked++;
		else if (f & F_UNSURE)
			out->unsure++;
	}
}

/* CNY balance of merchant m through the API; 0 or -1. */
static int balance_of(bench *b, const bench_merchant *m, int64_t *out)
{
	char body[65536];
	json_t *doc = NULL, *arr, *it;
	size_t i;
	int rc = -1;

	*out = 0;
	if (http_simple(b->cfg.host, b->cfg.port, "GET", "/v1/balance", m->key, body,
	                sizeof(body)) != 200)
		return -1;
	if (!(doc = json_loads(body, 0, NULL)) ||
	    !json_is_array(arr = json_object_get(doc, "available")))
		goto done;
	json_array_foreach(arr, i, it)
	{
		const char *cur = json_string_value(json_object_get(it, "currency"));

		if (cur && strcmp(cur, "CNY") == 0)
			*out = json_integer_value(json_object_get(it, "amount"));
	}
	rc = 0;
done:
	json_decref(doc);
	return rc;
}

int verify_balances_before(bench *b, char *err, size_t errlen)
{
	for (int i = 0; i < b->cfg.nmerchants; i++)
		if (balance_of(b, &b->cfg.merchants[i], &b->cfg.merchants[i].before) < 0) {
			snprintf(err, errlen, "GET /v1/balance failed for merchant %d", i);
			return -1;
		}
	return 0;
}

static int64_t one_int(sqlite3 *db, const char *sql, const char *a, const char *bb, int *err)
{
	sqlite3_stmt *st = NULL;
	int64_t v = -1;

	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		*err = 1;
		return -1;
	}
	if (a)
		sqlite3_bind_text(st, 1, a, -1, SQLITE_TRANSIENT);
	if (bb)
		sqlite3_bind_text(st, 2, bb, -1, SQLITE_TRANSIENT);
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	else
		*err = 1;
	sqlite3_finalize(st);
	return v;
}

#define APPEND(...)                                                                                \
	do {                                                                                       \
		if (used < reportlen) {                                                            \
			int n_ = snprintf(report + used, reportlen - used, __VA_ARGS__);           \
			if (n_ > 0)                                                                \
				used += (size_t)n_;                                                \
		}                                                                                  \
	} while (0)

static int check_count(const char *what, int64_t rows, const tally *t, char *report,
                       size_t reportlen, size_t *usedp)
{
	size_t used = *usedp;
	int ok = rows >= (int64_t)t->acked && rows <= (int64_t)(t->acked + t->unsure);

	APPEND("%s%s: %lld rows, %llu keys acknowledged%s", used ? "; " : "", what, (long long)rows,
	       (unsigned long long)t->acked, ok ? "" : " MISMATCH");
	if (t->unsure)
		APPEND(" (+%llu unanswered)", (unsigned long long)t->unsure);
	*usedp = used;
	return ok;
}

static int verify_sqlite(bench *b, const char *path, char *report, size_t reportlen, size_t *usedp)
{
	static const char *const sql[] = {
	    "SELECT count(*) FROM payments WHERE substr(merchant_order_no, 1, length(?1)) = ?1",
	    "SELECT count(*) FROM notifications WHERE substr(notify_id, 1, length(?1)) = ?1"
	    " AND channel = ?2",
	    "SELECT count(*) FROM refunds WHERE substr(refund_request_no, 1, length(?1)) = ?1",
	    "SELECT count(*) FROM transfers WHERE substr(transfer_no, 1, length(?1)) = ?1",
	};
	static const char *const what[] = {"payments", "notifications", "refunds", "transfers"};
	static const char prefix_ch[] = {'P', 'N', 'R', 'X'};
	sqlite3 *db = NULL;
	size_t used = *usedp;
	int ok = 1, err = 0;
	int64_t bad;

	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
		APPEND("cannot open %s read-only: %s", path, db ? sqlite3_errmsg(db) : "?");
		sqlite3_close(db);
		*usedp = used;
		return -1;
	}
	sqlite3_busy_timeout(db, 10000);
	for (int ty = 0; ty < REQ_NTYPES; ty++) {
		char prefix[48];
		tally t;
		int64_t rows;

		count_keys(b, (req_type)ty, &t);
		if (t.acked == 0 && t.unsure == 0 && ty != REQ_PAYMENT)
			continue;
		snprintf(prefix, sizeof(prefix), "%c%s-", prefix_ch[ty], b->cfg.run_id);
		rows = one_int(db, sql[ty], prefix, b->cfg.channel, &err);
		if (err)
			break;
		ok &= check_count(what[ty], rows, &t, report, reportlen, &used);
	}
	/* every balance is the sum of its ledger entries, both ways round */
	bad = err ? 0
	          : one_int(db,
	                    "SELECT (SELECT count(*) FROM balances b WHERE b.amount <>"
	                    " (SELECT coalesce(sum(l.amount), 0) FROM ledger_entries l"
	                    "  WHERE l.merchant_id = b.merchant_id AND l.currency = b.currency))"
	                    " + (SELECT count(*) FROM (SELECT merchant_id, currency, sum(amount) s"
	                    "  FROM ledger_entries GROUP BY merchant_id, currency) g"
	                    "  LEFT JOIN balances b USING (merchant_id, currency)"
	                    "  WHERE coalesce(b.amount, 0) <> g.s)",
	                    NULL, NULL, &err);
	if (err) {
		APPEND("%squery failed: %s", used ? "; " : "", sqlite3_errmsg(db));
		sqlite3_close(db);
		*usedp = used;
		return -1;
	}
	APPEND("; balances = ledger sums: %s", bad == 0 ? "yes" : "NO");
	ok &= bad == 0;
	sqlite3_close(db);
	*usedp = used;
	return ok ? 0 : 1;
}

int verify_run(bench *b, char *report, size_t reportlen)
{
	size_t used = 0;
	int ok = 1, bal_ok = 1, rc;
	uint64_t unsure_total = 0;

	report[0] = '\0';
	for (int ty = 0; ty < REQ_NTYPES; ty++) {
		tally t;

		count_keys(b, (req_type)ty, &t);
		unsure_total += t.unsure;
	}
	if (strncmp(b->cfg.db, "sqlite:", 7) == 0) {
		rc = verify_sqlite(b, b->cfg.db + 7, report, reportlen, &used);
		if (rc < 0)
			return -1;
		ok &= rc == 0;
	}
	for (int i = 0; i < b->cfg.nmerchants; i++) {
		bench_merchant *m = &b->cfg.merchants[i];
		int64_t now = 0, want = m->before + atomic_load(&m->expected_delta);

		if (balance_of(b, m, &now) < 0) {
			APPEND("%sGET /v1/balance failed", used ? "; " : "");
			return -1;
		}
		if (now != want) {
			/* an unanswered request may have moved it; only then is it not a failure */
			APPEND("%smerchant %d balance %lld, expected %lld%s", used ? "; " : "", i,
			       (long long)now, (long long)want,
			       unsure_total ? " (unanswered requests: inconclusive)" : " MISMATCH");
			if (!unsure_total)
				bal_ok = 0;
		}
	}
	APPEND("%sbalances via API = acknowledged requests: %s", used ? "; " : "",
	       bal_ok ? "yes" : "NO");
	return ok && bal_ok ? 0 : 1;
}
