/*
 * pay/admin.c: the operator's calls on credentials (list, rotate) and the
 * purge dry run. Rotation writes a new key digest or secret in one
 * statement, so the old credential stops working at that commit and never
 * both at once. Nothing here returns or logs a stored digest or secret; the
 * new ones go to the caller's buffer only. SQL is the shared subset with
 * bound parameters, like the rest of src/pay.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "idem/admin.h"
#include "pay/internal.h"
#include "util/digest.h"
#include "util/error.h"
#include "util/rand.h"

/* As in merchants.c: "sk_<16 hex key id>_<48 hex secret>". */
#define KEY_ID_HEX     16
#define KEY_SECRET_HEX 48

typedef struct {
	idem_admin_entry_fn fn;
	void *ctx;
} list_ctx;

static int entry_row(void *arg, const idem_value *cols, int n)
{
	list_ctx *l = arg;
	char id[IDEM_PAY_ID_SIZE + 32], name[256];
	idem_admin_entry e;

	if (n != 3)
		return idem__error(IDEM_ESTORE, "list row has %d columns", n);
	pay__col_text(id, sizeof(id), &cols[0]);
	pay__col_text(name, sizeof(name), &cols[1]);
	e.id = id;
	e.name = name;
	e.created_at_ms = cols[2].type == IDEM_VAL_INT ? cols[2].i : 0;
	return l->fn(l->ctx, &e);
}

int idem_admin_merchant_list(idem_pay *pay, idem_admin_entry_fn fn, void *ctx)
{
	list_ctx l = {fn, ctx};

	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(fn);
	for (int i = 0; i < pay->nshards; i++) { /* shard by shard */
		int rc = idem_admin_merchant_list(pay->shards[i], fn, ctx);

		if (rc != 0 || i == pay->nshards - 1)
			return rc;
	}
	return idem_store_query(
	    pay->store, "SELECT id, name, created_at FROM merchants ORDER BY created_at, id", NULL,
	    0, entry_row, &l);
}

int idem_admin_channel_list(idem_pay *pay, idem_admin_entry_fn fn, void *ctx)
{
	list_ctx l = {fn, ctx};

	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(fn);
	return idem_store_query(pay->store,
	                        "SELECT name, name, created_at FROM channels"
	                        " ORDER BY created_at, name",
	                        NULL, 0, entry_row, &l);
}

typedef struct {
	const char *sql;
	idem_value p[3];
	int n;
	int64_t changed;
} update_one;

static int run_update(idem_txn *txn, void *ctx)
{
	update_one *u = ctx;

	return idem_txn_exec(txn, u->sql, u->p, u->n, &u->changed);
}

int idem_admin_merchant_rotate_key(idem_pay *pay, const char *merchant_id,
                                   char key_out[IDEM_PAY_SECRET_SIZE])
{
	char key_id[KEY_ID_HEX + 1], secret[KEY_SECRET_HEX + 1], digest[65];
	unsigned char md[32];
	update_one u = {0};
	int rc;

	IDEM__ASSERT_ARG(key_out);
	key_out[0] = '\0';
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(merchant_id);
	if (idem_token_validate(merchant_id, strlen(merchant_id), 64) < 0)
		return idem__error(IDEM_ENOTFOUND, "no such merchant");
	if (pay->nshards) {
		idem_pay *home;

		if ((rc = pay__route(pay, merchant_id, &home)) < 0)
			return rc;
		return idem_admin_merchant_rotate_key(home, merchant_id, key_out);
	}
	/* The new key id names the merchant's shard, as the first one did. */
	if ((rc = pay__new_key_id(pay, key_id)) < 0 ||
	    (rc = idem__rand_hex(secret, KEY_SECRET_HEX / 2)) < 0)
		return rc;
	snprintf(key_out, IDEM_PAY_SECRET_SIZE, "sk_%s_%s", key_id, secret);
	OPENSSL_cleanse(secret, sizeof(secret));
	if ((rc = idem__sha256(md, key_out, strlen(key_out))) < 0)
		goto done;
	idem__hex(digest, md, sizeof(md));
	u.sql = "UPDATE merchants SET key_id = ?, key_digest = ? WHERE id = ?";
	u.p[0] = IDEM_V_TEXT(key_id);
	u.p[1] = IDEM_V_TEXT(digest);
	u.p[2] = IDEM_V_TEXT(merchant_id);
	u.n = 3;
	if ((rc = idem_store_transact(pay->store, run_update, &u)) < 0)
		goto done;
	if (u.changed != 1)
		rc = idem__error(IDEM_ENOTFOUND, "no merchant '%s'", merchant_id);
done:
	if (rc < 0) {
		OPENSSL_cleanse(key_out, IDEM_PAY_SECRET_SIZE);
		key_out[0] = '\0';
	}
	return rc;
}

int idem_admin_channel_rotate_secret(idem_pay *pay, const char *channel,
                                     char secret_out[IDEM_PAY_SECRET_SIZE])
{
	char stored[PAY__STORED_SECRET_SIZE] = "";
	update_one u = {0};
	int rc;

	IDEM__ASSERT_ARG(secret_out);
	secret_out[0] = '\0';
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(channel);
	if (!pay__valid_channel_name(channel))
		return idem__error(IDEM_ENOTFOUND, "no such channel");
	if (pay->nshards) {
		if ((rc = idem_admin_channel_rotate_secret(pay->shards[0], channel, secret_out)) <
		    0)
			return rc;
		return pay__channels_sync(pay, channel);
	}
	if ((rc = idem__rand_hex(secret_out, 32)) < 0)
		return rc;
	if ((rc = pay__secret_seal(pay, channel, secret_out, stored)) < 0)
		goto done;
	u.sql = "UPDATE channels SET secret = ? WHERE name = ?";
	u.p[0] = IDEM_V_TEXT(stored);
	u.p[1] = IDEM_V_TEXT(channel);
	u.n = 2;
	if ((rc = idem_store_transact(pay->store, run_update, &u)) == 0 && u.changed != 1)
		rc = idem__error(IDEM_ENOTFOUND, "no channel '%s'", channel);
done:
	OPENSSL_cleanse(stored, sizeof(stored));
	if (rc < 0) {
		OPENSSL_cleanse(secret_out, IDEM_PAY_SECRET_SIZE);
		secret_out[0] = '\0';
	}
	return rc;
}

int idem_admin_purge_count(idem_store *store, int64_t *out)
{
	int64_t now;
	idem_value p[2];

	IDEM__ASSERT_ARG(out);
	*out = 0;
	IDEM__ASSERT_ARG(store);
	/* The same condition every backend's purge_batch deletes by. */
	now = idem_store_now(store);
	p[0] = p[1] = IDEM_V_INT(now);
	return idem_store_query(store,
	                        "SELECT count(*) FROM idem_records WHERE expires_at <= ?"
	                        " AND (status <> 'PROCESSING' OR lease_until <= ?)",
	                        p, 2, idem_row_int, out);
}
