/*
 * pay/payment.c: the payment row as the domain files share it (payment.h):
 * read by id or by (merchant, order number), inside a transaction or on a
 * read connection, its API object, and the backstop answer when a payment
 * exists already under another key. Creating payments (payments.c), moving
 * them through the channel's states (chanpay.c, notifications.c) and
 * refunding them (refunds.c) sit above it: this file only reads and builds
 * answers, and never writes a row or calls a channel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pay/payment.h"
#include "util/error.h"

#define PAYMENT_COLS                                                                               \
	"id, merchant_id, merchant_order_no, amount, currency, channel, description, "             \
	"metadata, status, refunded_amount, fingerprint, created_at, updated_at"

void pay__payment_clear(pay__payment *p)
{
	free(p->description);
	free(p->metadata);
	memset(p, 0, sizeof(*p));
}

static char *dup_col(const idem_value *c)
{
	char *s;

	if (c->type != IDEM_VAL_TEXT && c->type != IDEM_VAL_BLOB)
		return NULL;
	if (!(s = malloc(c->len + 1)))
		return NULL;
	memcpy(s, c->p, c->len);
	s[c->len] = '\0';
	return s;
}

static int payment_row(void *ctx, const idem_value *c, int n)
{
	pay__payment *p = ctx;

	if (n != 13)
		return idem__error(IDEM_ESTORE, "payment row has %d columns", n);
	pay__col_text(p->id, sizeof(p->id), &c[0]);
	pay__col_text(p->merchant_id, sizeof(p->merchant_id), &c[1]);
	pay__col_text(p->order_no, sizeof(p->order_no), &c[2]);
	p->amount = c[3].i;
	pay__col_text(p->currency, sizeof(p->currency), &c[4]);
	pay__col_text(p->channel, sizeof(p->channel), &c[5]);
	p->description = dup_col(&c[6]);
	p->metadata = dup_col(&c[7]);
	if ((c[6].type != IDEM_VAL_NULL && !p->description) ||
	    (c[7].type != IDEM_VAL_NULL && !p->metadata))
		return idem__error(IDEM_ENOMEM, "out of memory");
	pay__col_text(p->status, sizeof(p->status), &c[8]);
	p->refunded = c[9].i;
	pay__col_text(p->fingerprint, sizeof(p->fingerprint), &c[10]);
	p->created_at = c[11].i;
	p->updated_at = c[12].i;
	p->found = 1;
	return 1;
}

static int load(idem_pay *pay, idem_txn *txn, pay__payment *p, const char *sql,
                const idem_value *params, int n)
{
	int rc;

	pay__payment_clear(p);
	rc = txn ? idem_txn_query(txn, sql, params, n, payment_row, p)
	         : idem_store_query(pay->store, sql, params, n, payment_row, p);
	if (rc < 0)
		pay__payment_clear(p);
	return rc;
}

int pay__payment_load(idem_pay *pay, idem_txn *txn, pay__payment *p, const char *merchant,
                      const char *id)
{
	idem_value prm[2] = {IDEM_V_TEXT(id), IDEM_V_TEXT(merchant ? merchant : "")};

	if (merchant)
		return load(pay, txn, p,
		            "SELECT " PAYMENT_COLS
		            " FROM payments WHERE id = ? AND merchant_id = ?",
		            prm, 2);
	return load(pay, txn, p, "SELECT " PAYMENT_COLS " FROM payments WHERE id = ?", prm, 1);
}

int pay__payment_load_by_order(idem_pay *pay, idem_txn *txn, pay__payment *p, const char *merchant,
                               const char *order_no)
{
	idem_value prm[2] = {IDEM_V_TEXT(merchant), IDEM_V_TEXT(order_no)};

	return load(pay, txn, p,
	            "SELECT " PAYMENT_COLS
	            " FROM payments WHERE merchant_id = ? AND merchant_order_no = ?",
	            prm, 2);
}

json_t *pay__payment_object(const pay__payment *p)
{
	char created[32], updated[32];
	json_t *meta = NULL;

	pay__time(created, p->created_at);
	pay__time(updated, p->updated_at);
	if (p->metadata)
		meta = json_loads(p->metadata, 0, NULL);
	return json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:I, s:s?, s:o?, s:s, s:s}", "id",
	                 p->id, "object", "payment", "merchant_order_no", p->order_no, "amount",
	                 (json_int_t)p->amount, "currency", p->currency, "channel", p->channel,
	                 "status", p->status, "refunded_amount", (json_int_t)p->refunded,
	                 "description", p->description, "metadata", meta, "created_at", created,
	                 "updated_at", updated);
}

/* The answer for an existing resource: 200 of it, or 409 with its id. */
int pay__backstop(idem_response *resp, json_t *existing, const char *existing_id,
                  const char *existing_fp, const char *fp, const char *what)
{
	char detail[160], *body = NULL;
	size_t len = 0;
	int rc;

	if (strcmp(existing_fp, fp) == 0)
		return pay__json(resp, 200, existing);
	snprintf(detail, sizeof(detail), "a different %s already uses this business key", what);
	if ((rc = idem_pay_problem(&body, &len, 409, "business_key_conflict", detail, "existing_id",
	                           existing_id)) < 0)
		return rc;
	rc = idem_response_set(resp, 409, body, len);
	free(body);
	return rc;
}
