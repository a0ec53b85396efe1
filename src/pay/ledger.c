/*
 * pay/ledger.c: balances and the ledger. Every change to a balance is one
 * ledger entry in the same transaction, so a balance always equals the sum
 * of its entries. Balance-changing units of a merchant are serialised by a
 * conditional write on the merchant's row, taken before any read that a
 * decision depends on (an insufficient-balance check must not race).
 */
#include <string.h>

#include "pay/internal.h"
#include "util/error.h"

int pay__lock_merchant(idem_txn *txn, const char *merchant, int64_t now)
{
	idem_value p[1] = {IDEM_V_TEXT(merchant)};
	int64_t changed = 0;
	int rc;

	(void)now;
	rc = idem_txn_exec(txn, "UPDATE merchants SET lock_version = lock_version + 1 WHERE id = ?",
	                   p, 1, &changed);
	if (rc < 0)
		return rc;
	return changed == 1 ? 0 : IDEM_ENOTFOUND;
}

int pay__balance(idem_txn *txn, const char *merchant, const char *currency, int64_t *out)
{
	idem_value p[2] = {IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency)};

	*out = 0;
	return idem_txn_query(txn,
	                      "SELECT amount FROM balances WHERE merchant_id = ? AND currency = ?",
	                      p, 2, idem_row_int, out);
}

int pay__post(idem_txn *txn, const char *merchant, const char *currency, int64_t amount,
              const char *kind, const char *ref, int64_t now)
{
	idem_value bal[3] = {IDEM_V_INT(amount), IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency)};
	idem_value entry[6] = {IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency), IDEM_V_INT(amount),
	                       IDEM_V_TEXT(kind),     IDEM_V_TEXT(ref),      IDEM_V_INT(now)};
	int64_t changed = 0;
	int rc;

	rc = idem_txn_exec(
	    txn, "UPDATE balances SET amount = amount + ? WHERE merchant_id = ? AND currency = ?",
	    bal, 3, &changed);
	if (rc == 0 && changed == 0) {
		/* No row yet; the merchant lock means nobody else inserts it now. */
		idem_value ins[3] = {IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency),
		                     IDEM_V_INT(amount)};

		rc = idem_txn_exec(
		    txn, "INSERT INTO balances (merchant_id, currency, amount) VALUES (?, ?, ?)",
		    ins, 3, NULL);
	}
	if (rc < 0)
		return rc;
	return idem_txn_exec(
	    txn,
	    "INSERT INTO ledger_entries (merchant_id, currency, amount, kind, ref_id,"
	    " created_at) VALUES (?, ?, ?, ?, ?, ?)",
	    entry, 6, NULL);
}
