/* pay/payment.h: the payment row as the domain files share it (payment.c). */
#ifndef IDEM_PAY_PAYMENT_H
#define IDEM_PAY_PAYMENT_H

#include "pay/internal.h"

typedef struct {
	char id[IDEM_PAY_ID_SIZE];
	char merchant_id[IDEM_PAY_ID_SIZE];
	char order_no[72];
	int64_t amount;
	char currency[8];
	char channel[IDEM_PAY_CHANNEL_MAX + 1];
	char *description; /* owned, NULL when none */
	char *metadata;    /* owned JSON text, NULL when none */
	char status[24];
	int64_t refunded;
	char fingerprint[IDEM_FINGERPRINT_LEN + 1];
	int64_t created_at, updated_at;
	int found;
} pay__payment;

/* Free p's owned strings and zero it (a cleared row is not found). */
void pay__payment_clear(pay__payment *p);

/* Load a payment by id (merchant may be NULL: any merchant) inside txn, or
 * on a read connection when txn is NULL. Sets p->found. */
int pay__payment_load(idem_pay *pay, idem_txn *txn, pay__payment *p, const char *merchant,
                      const char *id);
/* The same by (merchant, merchant_order_no). */
int pay__payment_load_by_order(idem_pay *pay, idem_txn *txn, pay__payment *p, const char *merchant,
                               const char *order_no);

/* The answer for an existing resource: 200 of existing when fp equals
 * existing_fp, else 409 business_key_conflict naming existing_id. */
int pay__backstop(idem_response *resp, json_t *existing, const char *existing_id,
                  const char *existing_fp, const char *fp, const char *what);

/* The API object of a payment (new reference). */
json_t *pay__payment_object(const pay__payment *p);

#endif
