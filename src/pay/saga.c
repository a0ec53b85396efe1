/*
 * pay/saga.c: transfers between merchants on different shards (issue 14),
 * a saga of idempotent steps driven from an outbox row (docs/scaling.md,
 * "Sharding": "Transfers between shards").
 *
 *   1. On the payer's shard, in the request's own unit (claim (payer,
 *      "transfer", transfer_no)): debit the payer and write the outbox row
 *      transfer_outbox (status 'pending'). One local transaction: the
 *      request is answered 202 with status "pending" only after its COMMIT.
 *   2. The driver, for each pending row: on the payee's shard, a unit of its
 *      own claimed as (payee, "transfer_credit", transfer id) credits the
 *      payee ('transfer_in' in the ledger, whose unique (kind, ref_id,
 *      merchant_id) stands behind the claim once its record expired).
 *   3. On the payer's shard: the row becomes 'succeeded' (a conditional
 *      UPDATE from 'pending'). When step 2 answered that the credit cannot
 *      be made (the payee is gone, or the credit would overflow), the row
 *      becomes 'reversed' and the payer is credited back ('transfer_reverse')
 *      in that same transaction, once.
 *
 * A crash anywhere leaves either nothing (step 1 rolled back), or a pending
 * row that the next pass (any instance, after a restart) drives again: step 2
 * is answered from its record (REPLAY) or its ledger row, step 3 changes a
 * row only once. So each side is applied exactly once, and the sum of all
 * balances plus the pending rows' amounts never changes.
 */
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "util/clock.h"
#include "util/digest.h"
#include "util/error.h"
#include "util/rand.h"

#define DRIVE_BATCH 100

struct pay__saga {
	pay__ticker *ticker;
	int64_t step_delay_ms;
};

/* ---- step 1: the debit and the outbox row (the request's unit) ---------- */

typedef pay__transfer_row outbox_row;

#define OUTBOX_COLS                                                                                \
	"SELECT id, transfer_no, from_merchant, to_merchant, to_shard, amount, currency, status,"  \
	" fingerprint, created_at FROM transfer_outbox "

static int read_outbox(void *ctx, const idem_value *c, int n)
{
	outbox_row *o = ctx;

	if (n != 10)
		return idem__error(IDEM_ESTORE, "outbox row has %d columns", n);
	pay__col_text(o->id, sizeof(o->id), &c[0]);
	pay__col_text(o->no, sizeof(o->no), &c[1]);
	pay__col_text(o->from, sizeof(o->from), &c[2]);
	pay__col_text(o->to, sizeof(o->to), &c[3]);
	o->to_shard = (int)c[4].i;
	o->amount = c[5].i;
	pay__col_text(o->currency, sizeof(o->currency), &c[6]);
	pay__col_text(o->status, sizeof(o->status), &c[7]);
	pay__col_text(o->fp, sizeof(o->fp), &c[8]);
	o->created_at = c[9].i;
	o->found = 1;
	return 1;
}

static void saga_kick(idem_pay *router)
{
	if (router && router->saga)
		pay__ticker_kick(router->saga->ticker);
}

int pay__saga_debit(idem_txn *txn, pay__op *c, const char *to, int to_shard, idem_response *resp)
{
	idem_pay *pay = c->pay;
	json_t *d = c->doc;
	const char *from = c->rq->caller, *currency = pay__str(d, "currency");
	const char *no = pay__str(d, "transfer_no");
	int64_t amount = pay__int(d, "amount"), now = pay__now(pay);
	idem_value k[2] = {IDEM_V_TEXT(from), IDEM_V_TEXT(no)};
	outbox_row o = {0};
	int rc;

	if ((rc = pay__lock_merchant(txn, from, now)) < 0)
		return rc;
	/* Under the payer's lock no other transfer of it runs: the read decides. */
	if ((rc = idem_txn_query(txn, OUTBOX_COLS "WHERE from_merchant = ? AND transfer_no = ?", k,
	                         2, read_outbox, &o)) < 0 ||
	    (rc = pay__transfer_check(txn, &o, c->fp, from, currency, amount, resp)) != 0)
		return rc < 0 ? rc : 0;
	if ((rc = pay__new_id(o.id, "tr_", pay->shard)) < 0)
		return rc;
	{
		idem_value v[10] = {IDEM_V_TEXT(o.id),     IDEM_V_TEXT(no),      IDEM_V_TEXT(from),
		                    IDEM_V_TEXT(to),       IDEM_V_INT(to_shard), IDEM_V_INT(amount),
		                    IDEM_V_TEXT(currency), IDEM_V_TEXT(c->fp),   IDEM_V_INT(now),
		                    IDEM_V_INT(now)};

		rc = idem_txn_exec(txn,
		                   "INSERT INTO transfer_outbox (id, transfer_no, from_merchant,"
		                   " to_merchant, to_shard, amount, currency, status, fingerprint,"
		                   " created_at, updated_at)"
		                   " VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
		                   v, 10, NULL);
	}
	if (rc < 0 || (rc = pay__post(txn, from, currency, -amount, "transfer_out", o.id, now)) < 0)
		return rc;
	memset(&o, 0, sizeof(o));
	if ((rc = idem_txn_query(txn, OUTBOX_COLS "WHERE from_merchant = ? AND transfer_no = ?", k,
	                         2, read_outbox, &o)) < 0)
		return rc;
	saga_kick(pay->router); /* the driver looks again soon (after this COMMIT) */
	return pay__transfer_answer(resp, 202, &o);
}

/* ---- step 2: the credit on the payee's shard (a unit of its own) -------- */

typedef struct {
	const outbox_row *o;
} credit_ctx;

static int credit_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	const outbox_row *o = ((credit_ctx *)vctx)->o;
	idem_store *store = idem_txn_store(txn);
	int64_t now = idem_store_now(store), seen = 0;
	idem_value k[3] = {IDEM_V_TEXT("transfer_in"), IDEM_V_TEXT(o->id), IDEM_V_TEXT(o->to)};
	int rc, fits = 0;

	rc = pay__lock_merchant(txn, o->to, now);
	if (rc == IDEM_ENOTFOUND)
		return pay__problem(resp, 404, "unknown_merchant", "the payee does not exist");
	if (rc < 0)
		return rc;
	/* The ledger row says "credited" after the record expired and was purged. */
	if ((rc = idem_txn_query(txn,
	                         "SELECT count(*) FROM ledger_entries"
	                         " WHERE kind = ? AND ref_id = ? AND merchant_id = ?",
	                         k, 3, idem_row_int, &seen)) < 0)
		return rc;
	if (seen == 0) {
		if ((rc = pay__credit_fits(txn, o->to, o->currency, o->amount, &fits)) < 0)
			return rc;
		if (!fits)
			return pay__overflow_problem(resp);
		if ((rc = pay__post(txn, o->to, o->currency, o->amount, "transfer_in", o->id,
		                    now)) < 0)
			return rc;
	}
	{
		static const char ok[] = "{\"object\":\"transfer_credit\",\"credited\":true}";

		return idem_response_set(resp, 201, ok, sizeof(ok) - 1);
	}
}

/* The fingerprint of step 2: the outbox row's values. */
static int credit_fingerprint(const outbox_row *o, char out[IDEM_FINGERPRINT_LEN + 1])
{
	char buf[512];
	unsigned char md[32];
	int len = snprintf(buf, sizeof(buf), "transfer_credit\n%s\n%s\n%s\n%lld\n%s", o->id,
	                   o->from, o->to, (long long)o->amount, o->currency);
	int rc;

	if (len < 0 || len >= (int)sizeof(buf))
		return idem__error(IDEM_ESTORE, "transfer credit fingerprint: values too long");
	if ((rc = idem__sha256(md, buf, (size_t)len)) < 0)
		return rc;
	idem__hex(out, md, sizeof(md));
	return 0;
}

/* ---- step 3: the outbox row settles, on the payer's shard ---------------- */

typedef struct {
	const outbox_row *o;
	int reverse;
	int64_t changed;
} settle_ctx;

static int settle_step(idem_txn *txn, void *vctx)
{
	settle_ctx *s = vctx;
	const outbox_row *o = s->o;
	int64_t now = idem_store_now(idem_txn_store(txn));
	idem_value v[3] = {IDEM_V_TEXT(s->reverse ? "reversed" : "succeeded"), IDEM_V_INT(now),
	                   IDEM_V_TEXT(o->id)};
	int rc;

	s->changed = 0;
	if (s->reverse && (rc = pay__lock_merchant(txn, o->from, now)) < 0)
		return rc;
	if ((rc = idem_txn_exec(txn,
	                        "UPDATE transfer_outbox SET status = ?, updated_at = ?"
	                        " WHERE id = ? AND status = 'pending'",
	                        v, 3, &s->changed)) < 0)
		return rc;
	if (s->reverse && s->changed == 1)
		rc =
		    pay__post(txn, o->from, o->currency, o->amount, "transfer_reverse", o->id, now);
	return rc;
}

typedef struct {
	outbox_row *rows;
	int n;
} pending_list;

static int collect_pending(void *ctx, const idem_value *c, int n)
{
	pending_list *l = ctx;
	int rc;

	if (l->n >= DRIVE_BATCH)
		return 1;
	memset(&l->rows[l->n], 0, sizeof(l->rows[0]));
	if ((rc = read_outbox(&l->rows[l->n], c, n)) < 0)
		return rc;
	l->n++;
	return 0;
}

static void step_pause(int64_t ms)
{
	if (ms > 0)
		idem__sleep_us(ms * 1000);
}

/* Drive one pending row through steps 2 and 3. 1 when it settled. */
static int drive_one(idem_pay *router, idem_pay *payer, const outbox_row *o, int64_t step_delay_ms)
{
	char fp[IDEM_FINGERPRINT_LEN + 1];
	idem_request req = IDEM_REQUEST_INIT;
	idem_result res = {0};
	credit_ctx cc = {o};
	settle_ctx sc = {o, 0, 0};
	int rc;

	if (o->to_shard < 0 || o->to_shard >= router->nshards)
		return 0; /* a shard left out of --db: the row waits for it */
	if (credit_fingerprint(o, fp) < 0)
		return 0;
	req.scope = o->to;
	req.business_type = "transfer_credit";
	req.key = o->id;
	req.key_len = strlen(o->id);
	req.fingerprint = fp;
	req.ttl_ms = router->opts.notification_ttl_ms;
	rc = idem_execute(&res, router->shards[o->to_shard]->store, &req, credit_work, &cc);
	if (rc == 0 && (res.outcome == IDEM_FIRST || res.outcome == IDEM_REPLAY)) {
		/* 201: credited. A stored 4xx: the credit cannot be made: reverse. */
		sc.reverse = res.http_status >= 400;
		rc = 1;
	} else {
		rc = 0; /* a store error, or another instance holds it: next pass */
	}
	idem_result_clear(&res);
	if (!rc)
		return 0;
	step_pause(step_delay_ms); /* tests: a window to kill idemd between the steps */
	if (idem_store_transact(payer->store, settle_step, &sc) < 0)
		return 0;
	return sc.changed == 1;
}

int idem_pay_transfers_drive(idem_pay *pay, int *settled)
{
	int64_t delay = 0;
	outbox_row *rows;
	int rc = 0;

	IDEM__ASSERT_ARG(pay);
	delay = pay->saga ? pay->saga->step_delay_ms : 0;
	if (settled)
		*settled = 0;
	if (!pay->nshards)
		return 0; /* one store: every transfer is one transaction */
	if (!(rows = calloc(DRIVE_BATCH, sizeof(*rows))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	for (int i = 0; i < pay->nshards && rc == 0; i++) {
		pending_list l = {rows, 0};

		rc = idem_store_query(pay->shards[i]->store,
		                      OUTBOX_COLS
		                      "WHERE status = 'pending' ORDER BY updated_at LIMIT 100",
		                      NULL, 0, collect_pending, &l);
		for (int k = 0; rc == 0 && k < l.n; k++) {
			int n = drive_one(pay, pay->shards[i], &rows[k], delay);

			if (settled)
				*settled += n;
		}
	}
	free(rows);
	return rc;
}

/* ---- the driver thread --------------------------------------------------- */

static void drive_pass(void *arg)
{
	idem_pay_transfers_drive(arg, NULL);
}

int idem_pay_transfer_driver_start(idem_pay *pay, int64_t interval_ms, int64_t step_delay_ms)
{
	pay__saga *s;
	int rc;

	IDEM__ASSERT_ARG(pay);
	if (interval_ms < 10 || step_delay_ms < 0 || step_delay_ms > 600000)
		return idem__error(IDEM_EINVAL,
		                   "transfer driver: interval >= 10 ms, delay 0..600000");
	if (!pay->nshards)
		return 0; /* nothing to drive on one store */
	if (pay->saga)
		return idem__error(IDEM_EINVAL, "the transfer driver runs already");
	if (!(s = calloc(1, sizeof(*s))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	s->step_delay_ms = step_delay_ms;
	pay->saga = s; /* before the first pass, which reads step_delay_ms */
	if ((rc = pay__ticker_start(&s->ticker, interval_ms, 1, drive_pass, pay)) < 0) {
		pay->saga = NULL;
		free(s);
		return rc;
	}
	return 0;
}

void pay__saga_stop(idem_pay *pay)
{
	if (!pay->saga)
		return;
	pay__ticker_stop(pay->saga->ticker);
	free(pay->saga);
	pay->saga = NULL;
}
