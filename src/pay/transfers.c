/*
 * pay/transfers.c: transfers between merchants. Two ledger entries that sum
 * to zero, in one unit with the claim. Both merchants are locked in id
 * order, so two opposite transfers cannot deadlock each other; the balance
 * is checked under the lock before anything is written.
 */
#include <string.h>

#include "pay/internal.h"
#include "util/error.h"

typedef pay__transfer_row transfer_row;

static int read_transfer(void *ctx, const idem_value *c, int n)
{
	transfer_row *t = ctx;

	if (n != 9)
		return idem__error(IDEM_ESTORE, "transfer row has %d columns", n);
	pay__col_text(t->id, sizeof(t->id), &c[0]);
	pay__col_text(t->no, sizeof(t->no), &c[1]);
	pay__col_text(t->from, sizeof(t->from), &c[2]);
	pay__col_text(t->to, sizeof(t->to), &c[3]);
	t->amount = c[4].i;
	pay__col_text(t->currency, sizeof(t->currency), &c[5]);
	pay__col_text(t->status, sizeof(t->status), &c[6]);
	pay__col_text(t->fp, sizeof(t->fp), &c[7]);
	t->created_at = c[8].i;
	t->found = 1;
	return 1;
}

static int load_transfer(idem_txn *txn, transfer_row *t, const char *from, const char *no)
{
	idem_value p[2] = {IDEM_V_TEXT(from), IDEM_V_TEXT(no)};

	memset(t, 0, sizeof(*t));
	return idem_txn_query(
	    txn,
	    "SELECT id, transfer_no, from_merchant, to_merchant, amount, currency,"
	    " status, fingerprint, created_at FROM transfers"
	    " WHERE from_merchant = ? AND transfer_no = ?",
	    p, 2, read_transfer, t);
}

static int transfer_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	pay__op *c = vctx;
	json_t *d = c->doc;
	const char *from = c->rq->caller, *to = pay__str(d, "to_merchant");
	const char *currency = pay__str(d, "currency"), *no = pay__str(d, "transfer_no");
	const char *first = strcmp(from, to) < 0 ? from : to, *second = first == from ? to : from;
	int64_t amount = pay__int(d, "amount"), now = pay__now(c->pay);
	transfer_row t;
	int rc;

	if ((rc = pay__lock_merchant(txn, first, now)) == 0)
		rc = pay__lock_merchant(txn, second, now);
	if (rc == IDEM_ENOTFOUND) {
		resp->persist = 0;
		return pay__problem(resp, 404, "unknown_merchant", "'to_merchant' does not exist");
	}
	if (rc < 0)
		return rc;
	/* Under the sender's lock no other transfer of it runs: the read decides. */
	if ((rc = load_transfer(txn, &t, from, no)) < 0 ||
	    (rc = pay__transfer_check(txn, &t, c->fp, from, currency, amount, resp)) != 0)
		return rc < 0 ? rc : 0;
	{
		int fits = 0;

		if ((rc = pay__credit_fits(txn, to, currency, amount, &fits)) < 0)
			return rc;
		if (!fits)
			return pay__overflow_problem(resp);
	}
	if ((rc = pay__new_id(t.id, "tr_", c->pay->shard)) < 0)
		return rc;
	{
		idem_value v[8] = {IDEM_V_TEXT(t.id),  IDEM_V_TEXT(no),    IDEM_V_TEXT(from),
		                   IDEM_V_TEXT(to),    IDEM_V_INT(amount), IDEM_V_TEXT(currency),
		                   IDEM_V_TEXT(c->fp), IDEM_V_INT(now)};

		rc = idem_txn_exec(
		    txn,
		    "INSERT INTO transfers (id, transfer_no, from_merchant, to_merchant,"
		    " amount, currency, status, fingerprint, created_at)"
		    " VALUES (?, ?, ?, ?, ?, ?, 'succeeded', ?, ?)",
		    v, 8, NULL);
	}
	if (rc < 0 ||
	    (rc = pay__post(txn, from, currency, -amount, "transfer_out", t.id, now)) < 0 ||
	    (rc = pay__post(txn, to, currency, amount, "transfer_in", t.id, now)) < 0 ||
	    (rc = load_transfer(txn, &t, from, no)) < 0)
		return rc;
	return pay__transfer_answer(resp, 201, &t);
}

/* A transfer to another shard: step 1 of the saga (pay/saga.c). */
static int saga_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	pay__op *c = vctx;

	return pay__saga_debit(txn, c, pay__str(c->doc, "to_merchant"), c->to_shard, resp);
}

static const pay__field transfer_fields[] = {
    {"transfer_no", F_STRING, 0, V_NATURAL_KEY, 1},
    {"to_merchant", F_STRING, 1, V_ID, 0},
    {"amount", F_INT, 1, V_AMOUNT, 0},
    {"currency", F_STRING, 1, V_CURRENCY, 0},
};

void idem_pay_transfer_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                             void *done_ctx)
{
	pay__op *c;
	const char *no, *to;
	idem_result *out;
	int rc, shard = 0, found = 0;

	if (!pay__async_args(__func__, pay, rq, done, done_ctx) ||
	    !(pay = pay__route_async(pay, rq->caller, done, done_ctx)) ||
	    !(c = pay__op_new(pay, rq, done, done_ctx)))
		return;
	out = &c->res;
	if ((rc = pay__parse_request(&c->doc, out, rq, transfer_fields,
	                             sizeof(transfer_fields) / sizeof(transfer_fields[0]))) < 0 ||
	    !c->doc) {
		pay__finish(c, rc);
		return;
	}
	no = pay__str(c->doc, "transfer_no");
	to = pay__str(c->doc, "to_merchant");
	/* The one check a field table cannot say: the payee is someone else. */
	if (strcmp(to, rq->caller) == 0)
		rc = pay__reject(out, 400, "invalid_request", "'to_merchant' cannot be the sender");
	else if (pay->router && (rc = pay__dir_lookup(pay->router, to, &shard, &found)) < 0)
		; /* the directory is unreadable: 503, nothing claimed */
	else if (found && shard != pay->shard) {
		/* Both ledgers cannot be one transaction across shards: the saga,
		 * whose first step is this request's own unit on the payer's shard. */
		if ((rc = pay__fingerprint(c->fp, rq, c->doc)) == 0) {
			c->to_shard = shard;
			pay__start(c, "transfer", no, pay->opts.ttl_ms, saga_work, NULL, 1);
			return;
		}
	} else if ((rc = pay__fingerprint(c->fp, rq, c->doc)) == 0) {
		pay__start(c, "transfer", no, pay->opts.ttl_ms, transfer_work, NULL, 1);
		return;
	}
	pay__finish(c, rc);
}

int idem_pay_transfer(idem_result *out, idem_pay *pay, const idem_pay_request *rq)
{
	IDEM__ASSERT_ARG(out); /* pay and rq: the async call answers them */
	return pay__wait(out, pay, rq, idem_pay_transfer_async);
}
