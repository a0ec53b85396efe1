/*
 * pay/ledger.c: balances and the ledger. Every change to a balance is one
 * ledger entry in the same transaction, so a balance always equals the sum
 * of its entries. Balance-changing units of a merchant are serialised by a
 * conditional write on the merchant's row, taken before any read that a
 * decision depends on (an insufficient-balance check must not race).
 *
 * Balances are int64 minor units and no credit may take one past INT64_MAX:
 * SQLite would turn the sum into a REAL (no longer equal to the ledger),
 * PostgreSQL and MariaDB fail the statement with a range error. Callers ask
 * pay__credit_fits before any write of the unit and answer 409
 * balance_overflow (stored); pay__post refuses such a credit itself too, so
 * the store never sees the overflowing statement.
 */
#include <stdint.h>
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

int pay__credit_fits(idem_txn *txn, const char *merchant, const char *currency, int64_t amount,
                     int *fits)
{
	int64_t balance = 0;
	int rc;

	*fits = 0;
	if ((rc = pay__balance(txn, merchant, currency, &balance)) < 0)
		return rc;
	*fits = amount <= 0 || balance <= INT64_MAX - amount;
	return 0;
}

int pay__post(idem_txn *txn, const char *merchant, const char *currency, int64_t amount,
              const char *kind, const char *ref, int64_t now)
{
	/* The row is changed only while the sum fits (a debit: always). */
	idem_value bal[4] = {IDEM_V_INT(amount), IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency),
	                     IDEM_V_INT(amount > 0 ? INT64_MAX - amount : INT64_MAX)};
	idem_value entry[6] = {IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency), IDEM_V_INT(amount),
	                       IDEM_V_TEXT(kind),     IDEM_V_TEXT(ref),      IDEM_V_INT(now)};
	int64_t changed = 0;
	int rc;

	rc = idem_txn_exec(txn,
	                   "UPDATE balances SET amount = amount + ?"
	                   " WHERE merchant_id = ? AND currency = ? AND amount <= ?",
	                   bal, 4, &changed);
	if (rc == 0 && changed == 0) {
		/* No row yet; the merchant lock means nobody else inserts it now. */
		idem_value ins[3] = {IDEM_V_TEXT(merchant), IDEM_V_TEXT(currency),
		                     IDEM_V_INT(amount)};
		int64_t rows = 0;

		/* Or the row is there and the credit does not fit: refuse it here. */
		if ((rc = idem_txn_query(txn,
		                         "SELECT count(*) FROM balances"
		                         " WHERE merchant_id = ? AND currency = ?",
		                         ins, 2, idem_row_int, &rows)) < 0)
			return rc;
		if (rows != 0)
			return idem__error(IDEM_ECONSTRAINT, "a credit would overflow the balance");
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

int pay__overflow_problem(idem_response *resp)
{
	return pay__problem(resp, 409, "balance_overflow",
	                    "this credit would take the balance past the largest amount a balance"
	                    " can hold (2^63-1 minor units)");
}
