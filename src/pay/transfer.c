/*
 * pay/transfer.c: what a transfer's two paths share: the transfer as its
 * answer shows it, and the decision its debit takes under the payer's lock
 * (a replay, a business key conflict, or a balance too low). The transfer on
 * one shard (transfers.c) and the first step of the saga between shards
 * (saga.c) both call it; it reads the payer's balance and never writes,
 * locks or starts anything itself.
 */
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "util/error.h"

int pay__transfer_answer(idem_response *resp, int status, const pay__transfer_row *t)
{
	char created[32];
	json_t *obj;
	int rc;

	pay__time(created, t->created_at);
	obj = json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:s}", "id", t->id, "object",
	                "transfer", "transfer_no", t->no, "from_merchant", t->from, "to_merchant",
	                t->to, "amount", (json_int_t)t->amount, "currency", t->currency, "status",
	                t->status, "created_at", created);
	if (!obj)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = pay__json(resp, status, obj);
	json_decref(obj);
	return rc;
}

int pay__transfer_check(idem_txn *txn, const pay__transfer_row *t, const char *fp,
                        const char *payer, const char *currency, int64_t amount,
                        idem_response *resp)
{
	int64_t balance = 0;
	int rc;

	if (t->found) {
		char *body = NULL;
		size_t len = 0;

		if (strcmp(t->fp, fp) == 0)
			rc = pay__transfer_answer(resp, 200, t);
		else if ((rc =
		              idem_pay_problem(&body, &len, 409, "business_key_conflict",
		                               "a different transfer already uses this transfer_no",
		                               "existing_id", t->id)) == 0)
			rc = idem_response_set(resp, 409, body, len);
		free(body);
		return rc < 0 ? rc : 1;
	}
	if ((rc = pay__balance(txn, payer, currency, &balance)) < 0)
		return rc;
	if (balance >= amount)
		return 0;
	rc = pay__problem(resp, 409, "insufficient_balance",
	                  "the balance cannot cover this transfer");
	return rc < 0 ? rc : 1;
}
