/*
 * pay/reads.c: the read endpoints: balance and idempotency records. Reads
 * run on a read connection, never in a write transaction, and are always
 * scoped to the calling merchant.
 */
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "util/error.h"

static int balance_row(void *ctx, const idem_value *c, int n)
{
	char currency[8];

	if (n != 2)
		return idem__error(IDEM_ESTORE, "balance row has %d columns", n);
	pay__col_text(currency, sizeof(currency), &c[0]);
	if (json_array_append_new(ctx, json_pack("{s:s, s:I}", "currency", currency, "amount",
	                                         (json_int_t)c[1].i)) < 0)
		return idem__error(IDEM_ENOMEM, "out of memory");
	return 0;
}

int idem_pay_get_balance(idem_result *out, idem_pay *pay, const char *merchant)
{
	json_t *list = NULL;
	idem_value p[1];
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(merchant);
	p[0] = IDEM_V_TEXT(merchant);
	if (!(list = json_array()))
		return idem__error(IDEM_ENOMEM, "out of memory");
	if ((rc = pay__route(pay, merchant, &pay)) < 0) {
		json_decref(list);
		return rc;
	}
	rc = idem_store_query(pay->store,
	                      "SELECT currency, amount FROM balances WHERE merchant_id = ?"
	                      " ORDER BY currency",
	                      p, 1, balance_row, list);
	if (rc < 0) {
		json_decref(list);
		return rc;
	}
	return pay__read_answer(out,
	                        json_pack("{s:s, s:o}", "object", "balance", "available", list));
}

int idem_pay_get_record(idem_result *out, idem_pay *pay, const char *merchant,
                        const char *business_type, const char *key, size_t key_len)
{
	idem_record_info info;
	char created[32], expires[32], *k = NULL;
	json_t *obj;
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(merchant);
	IDEM__ASSERT_ARG(business_type);
	IDEM__ASSERT_ARG(key);
	if ((rc = pay__route(pay, merchant, &pay)) < 0)
		return rc;
	rc = idem_record_get(&info, pay->store, merchant, business_type, key, key_len);
	if (rc == IDEM_ENOTFOUND || rc == IDEM_EINVAL)
		return pay__reject(out, 404, "not_found", "no such idempotency record");
	if (rc < 0)
		return rc;
	pay__time(created, info.created_at_ms);
	pay__time(expires, info.expires_at_ms);
	if (!(k = strndup(key, key_len))) {
		idem_record_info_clear(&info);
		return idem__error(IDEM_ENOMEM, "out of memory");
	}
	obj = json_pack("{s:s, s:s, s:s, s:o, s:s, s:s, s:s}", "business_type", business_type,
	                "key", k, "status", info.status, "http_status",
	                info.http_status ? json_integer(info.http_status) : json_null(),
	                "fingerprint", info.fingerprint, "created_at", created, "expires_at",
	                expires);
	free(k);
	idem_record_info_clear(&info);
	return pay__read_answer(out, obj);
}
