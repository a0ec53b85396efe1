/*
 * pay/chanconfig.c: channels as configured, the rows of the channels table:
 * adding a channel, connecting it to a base URL, its signing secret at rest,
 * checking a notification's signature with it, and the reads the rest of
 * src/pay makes of a channel (whether it exists; its configuration with the
 * secret opened, which chanclient.c caches). A channel's secret must be kept
 * itself (checking an HMAC needs it): as is, or sealed with AES-256-GCM
 * under the operator's secret key (idem_pay_set_secret_key; the channel name
 * is the associated data). Plain secrets from before a key was set are still
 * read, and idem_admin_channel_rekey seals them. Secrets are never put in
 * error messages; nothing here calls a channel or starts a thread.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/admin.h"
#include "pay/channel.h"
#include "pay/internal.h"
#include "util/error.h"
#include "util/rand.h"
#include "util/secretbox.h"

typedef struct {
	const char *name;
	const char *secret;
	int64_t now;
} channel_new;

static int insert_channel(idem_txn *txn, void *ctx)
{
	channel_new *c = ctx;
	idem_value p[3] = {IDEM_V_TEXT(c->name), IDEM_V_TEXT(c->secret), IDEM_V_INT(c->now)};

	return idem_txn_exec(
	    txn, "INSERT INTO channels (name, secret, created_at) VALUES (?, ?, ?)", p, 3, NULL);
}

int idem_pay_channel_add(idem_pay *pay, const char *name, char secret_out[IDEM_PAY_SECRET_SIZE])
{
	char stored[PAY__STORED_SECRET_SIZE];
	channel_new c = {name, stored, 0};
	int rc;

	IDEM__ASSERT_ARG(secret_out);
	secret_out[0] = '\0';
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(name);
	c.now = pay__now(pay);
	if (pay->nshards) {
		/* Written on shard 0, then copied to the others as it is stored. */
		if ((rc = idem_pay_channel_add(pay->shards[0], name, secret_out)) < 0)
			return rc;
		return pay__channels_sync(pay, name);
	}
	if (!pay__valid_channel_name(name))
		return idem__error(IDEM_EINVAL, "channel name must be 1..%d of [a-z0-9_-]",
		                   IDEM_PAY_CHANNEL_MAX);
	if ((rc = idem__rand_hex(secret_out, 32)) < 0)
		return rc;
	if ((rc = pay__secret_seal(pay, name, secret_out, stored)) == 0)
		rc = idem_store_transact(pay->store, insert_channel, &c);
	OPENSSL_cleanse(stored, sizeof(stored));
	if (rc == IDEM_ECONFLICT)
		rc = idem__error(IDEM_ECONFLICT, "channel '%s' already exists", name);
	if (rc < 0) {
		OPENSSL_cleanse(secret_out, IDEM_PAY_SECRET_SIZE);
		secret_out[0] = '\0';
	}
	return rc;
}

static int read_secret(void *ctx, const idem_value *cols, int n)
{
	if (n != 1)
		return idem__error(IDEM_ESTORE, "channel row has %d columns", n);
	pay__col_text(ctx, PAY__STORED_SECRET_SIZE, &cols[0]);
	return 1;
}

int pay__secret_seal(idem_pay *pay, const char *channel, const char *secret,
                     char out[PAY__STORED_SECRET_SIZE])
{
	if (!pay->has_secret_key) {
		snprintf(out, PAY__STORED_SECRET_SIZE, "%s", secret);
		return 0;
	}
	return idem__secretbox_seal(pay->secret_key, channel, secret, strlen(secret), out,
	                            PAY__STORED_SECRET_SIZE);
}

/* The secret from its stored form (plain, or sealed under key). */
static int secret_open(const unsigned char *key, const char *channel, const char *stored,
                       char out[IDEM_PAY_SECRET_SIZE])
{
	size_t n = 0;

	if (!idem__secretbox_is_sealed(stored)) {
		snprintf(out, IDEM_PAY_SECRET_SIZE, "%s", stored);
		return 0;
	}
	if (!key)
		return idem__error(IDEM_EINVAL,
		                   "channel secrets are encrypted at rest: the secret key"
		                   " is required (--secret-key-file)");
	return idem__secretbox_open(key, channel, stored, out, IDEM_PAY_SECRET_SIZE, &n);
}

int idem_pay_secret_key_read(const char *path, unsigned char key[32])
{
	IDEM__ASSERT_ARG(path);
	IDEM__ASSERT_ARG(key);
	return idem__secretbox_read_key(path, key);
}

typedef struct {
	char name[IDEM_PAY_CHANNEL_MAX + 1];
	char stored[PAY__STORED_SECRET_SIZE];
	int found;
} sealed_row;

static int read_sealed_row(void *ctx, const idem_value *cols, int n)
{
	sealed_row *r = ctx;

	if (n != 2)
		return idem__error(IDEM_ESTORE, "channel row has %d columns", n);
	pay__col_text(r->name, sizeof(r->name), &cols[0]);
	pay__col_text(r->stored, sizeof(r->stored), &cols[1]);
	r->found = 1;
	return 1;
}

int idem_pay_set_secret_key(idem_pay *pay, const unsigned char key[32])
{
	char plain[IDEM_PAY_SECRET_SIZE];
	sealed_row row = {"", "", 0};
	int rc;

	IDEM__ASSERT_ARG(pay);
	for (int i = 0; i < pay->nshards; i++)
		if ((rc = idem_pay_set_secret_key(pay->shards[i], key)) < 0)
			return rc;
	/* A sealed secret, if any, says whether this is the key they were sealed with. */
	rc = idem_store_query(pay->store,
	                      "SELECT name, secret FROM channels WHERE secret LIKE 'v1:%'"
	                      " ORDER BY name LIMIT 1",
	                      NULL, 0, read_sealed_row, &row);
	if (rc < 0)
		goto done;
	if (row.found && (rc = secret_open(key, row.name, row.stored, plain)) < 0)
		goto done;
	pay->has_secret_key = key != NULL;
	if (key)
		memcpy(pay->secret_key, key, sizeof(pay->secret_key));
	else
		OPENSSL_cleanse(pay->secret_key, sizeof(pay->secret_key));
done:
	OPENSSL_cleanse(plain, sizeof(plain));
	OPENSSL_cleanse(&row, sizeof(row));
	return rc;
}

typedef struct {
	idem_pay *pay;
	const unsigned char *from; /* the key the secrets are sealed with now (NULL: none) */
	const unsigned char *to;   /* the key to seal them with */
	int64_t changed;
	int n, cap;
	sealed_row *rows;
} rekey_ctx;

static int collect_row(void *ctx, const idem_value *cols, int n)
{
	rekey_ctx *k = ctx;

	if (n != 2)
		return idem__error(IDEM_ESTORE, "channel row has %d columns", n);
	if (k->n == k->cap) {
		int cap = k->cap ? 2 * k->cap : 16;
		sealed_row *rows = realloc(k->rows, (size_t)cap * sizeof(*rows));

		if (!rows)
			return idem__error(IDEM_ENOMEM, "out of memory");
		k->rows = rows;
		k->cap = cap;
	}
	pay__col_text(k->rows[k->n].name, sizeof(k->rows[0].name), &cols[0]);
	pay__col_text(k->rows[k->n].stored, sizeof(k->rows[0].stored), &cols[1]);
	k->n++;
	return 0;
}

static int rekey_txn(idem_txn *txn, void *ctx)
{
	rekey_ctx *k = ctx;
	char plain[IDEM_PAY_SECRET_SIZE], sealed[PAY__STORED_SECRET_SIZE];
	int rc;

	k->n = 0;
	k->changed = 0;
	if ((rc = idem_txn_query(txn, "SELECT name, secret FROM channels ORDER BY name", NULL, 0,
	                         collect_row, k)) < 0)
		return rc;
	for (int i = 0; i < k->n && rc == 0; i++) {
		sealed_row *r = &k->rows[i];

		if ((rc = secret_open(k->from, r->name, r->stored, plain)) < 0 ||
		    (rc = idem__secretbox_seal(k->to, r->name, plain, strlen(plain), sealed,
		                               sizeof(sealed))) < 0)
			break;
		{
			idem_value p[2] = {IDEM_V_TEXT(sealed), IDEM_V_TEXT(r->name)};

			rc = idem_txn_exec(txn, "UPDATE channels SET secret = ? WHERE name = ?", p,
			                   2, NULL);
		}
		if (rc == 0)
			k->changed++;
	}
	OPENSSL_cleanse(plain, sizeof(plain));
	OPENSSL_cleanse(sealed, sizeof(sealed));
	return rc;
}

int idem_admin_channel_rekey(idem_pay *pay, const unsigned char *new_key, int64_t *changed_out)
{
	rekey_ctx k = {pay, NULL, NULL, 0, 0, 0, NULL};
	int rc;

	if (changed_out)
		*changed_out = 0;
	IDEM__ASSERT_ARG(pay);
	if (pay->nshards) {
		/* Each shard's copy of the channels, then the router's own key. */
		for (int i = 0; i < pay->nshards; i++) {
			int64_t n = 0;

			if ((rc = idem_admin_channel_rekey(pay->shards[i], new_key, &n)) < 0)
				return rc;
			if (i == 0 && changed_out)
				*changed_out = n;
		}
		if (new_key)
			memcpy(pay->secret_key, new_key, sizeof(pay->secret_key));
		return 0;
	}
	if (!pay->has_secret_key)
		return idem__error(IDEM_EINVAL,
		                   "rekey needs the current secret key (--secret-key-file)");
	k.from = pay->secret_key;
	k.to = new_key ? new_key : pay->secret_key;
	rc = idem_store_transact(pay->store, rekey_txn, &k);
	if (k.rows) {
		OPENSSL_cleanse(k.rows, (size_t)k.cap * sizeof(*k.rows));
		free(k.rows);
	}
	if (rc < 0)
		return rc;
	if (new_key)
		memcpy(pay->secret_key, new_key, sizeof(pay->secret_key));
	if (changed_out)
		*changed_out = k.changed;
	return 0;
}

static int unhex(unsigned char *out, const char *hex, size_t nbytes)
{
	for (size_t i = 0; i < 2 * nbytes; i++) {
		char c = hex[i];
		int v = c >= '0' && c <= '9'   ? c - '0'
		        : c >= 'a' && c <= 'f' ? c - 'a' + 10
		        : c >= 'A' && c <= 'F' ? c - 'A' + 10
		                               : -1;

		if (v < 0)
			return -1;
		if (i % 2 == 0)
			out[i / 2] = (unsigned char)(v << 4);
		else
			out[i / 2] |= (unsigned char)v;
	}
	return 0;
}

int idem_pay_verify_signature(idem_pay *pay, const char *channel, const char *sig, size_t sig_len,
                              const void *body, size_t len)
{
	char secret[IDEM_PAY_SECRET_SIZE] = "", stored[PAY__STORED_SECRET_SIZE] = "";
	unsigned char want[32], got[32];
	unsigned int n = 0;
	idem_value p[1];
	int rc;

	/* channel and sig are not: without them the signature is wrong (ENOTFOUND). */
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(body || len == 0);
	if (pay->nshards) /* shard 0 holds the channels */
		return idem_pay_verify_signature(pay->shards[0], channel, sig, sig_len, body, len);
	if (!pay__valid_channel_name(channel) || !sig || sig_len != 64 || unhex(got, sig, 32) < 0)
		return IDEM_ENOTFOUND;
	p[0] = IDEM_V_TEXT(channel);
	rc = idem_store_query(pay->store, "SELECT secret FROM channels WHERE name = ?", p, 1,
	                      read_secret, stored);
	if (rc == 0 && stored[0])
		rc = secret_open(pay->has_secret_key ? pay->secret_key : NULL, channel, stored,
		                 secret);
	OPENSSL_cleanse(stored, sizeof(stored));
	if (rc < 0)
		return rc == IDEM_EINVAL
		           ? idem__error(IDEM_ESTORE, "%s", idem_error_last()->message)
		           : rc;
	if (!secret[0])
		return IDEM_ENOTFOUND;
	if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), body, len, want, &n) || n != 32)
		rc = idem__error(IDEM_ESTORE, "HMAC-SHA256 failed");
	else if (CRYPTO_memcmp(want, got, 32) != 0)
		rc = IDEM_ENOTFOUND;
	OPENSSL_cleanse(secret, sizeof(secret));
	return rc;
}

int pay__channel_exists(idem_pay *pay, idem_txn *txn, const char *name, int *exists)
{
	idem_value p[1] = {IDEM_V_TEXT(name)};
	int64_t n = 0;
	int rc;

	*exists = 0;
	pthread_mutex_lock(&pay->channels_lock);
	for (int i = 0; i < pay->nchannels && !*exists; i++)
		*exists = strcmp(pay->channels[i], name) == 0;
	pthread_mutex_unlock(&pay->channels_lock);
	if (*exists)
		return 0;
	rc = idem_txn_query(txn, "SELECT count(*) FROM channels WHERE name = ?", p, 1, idem_row_int,
	                    &n);
	if (rc < 0 || n == 0)
		return rc;
	*exists = 1;
	/* Channels are never removed, so a name seen once stays valid. */
	pthread_mutex_lock(&pay->channels_lock);
	if (pay->nchannels < (int)(sizeof(pay->channels) / sizeof(pay->channels[0])))
		snprintf(pay->channels[pay->nchannels++], sizeof(pay->channels[0]), "%s", name);
	pthread_mutex_unlock(&pay->channels_lock);
	return 0;
}

/* ---- connected channels ---------------------------------------------- */

typedef struct {
	char stored[PAY__STORED_SECRET_SIZE];
	pay__chan *ch;
	int found;
} chan_row;

static int read_chan(void *ctx, const idem_value *c, int n)
{
	chan_row *r = ctx;

	if (n != 3)
		return idem__error(IDEM_ESTORE, "channel row has %d columns", n);
	pay__col_text(r->stored, sizeof(r->stored), &c[0]);
	pay__col_text(r->ch->base_url, sizeof(r->ch->base_url), &c[1]);
	r->ch->timeout_ms = c[2].i;
	r->found = 1;
	return 1;
}

int pay__chan_load(idem_pay *pay, const char *name, pay__chan *out, int *found)
{
	chan_row r = {"", out, 0};
	idem_value p[1] = {IDEM_V_TEXT(name)};
	int rc;

	memset(out, 0, sizeof(*out));
	*found = 0;
	snprintf(out->name, sizeof(out->name), "%s", name);
	rc = idem_store_query(pay->store,
	                      "SELECT secret, base_url, timeout_ms FROM channels WHERE name = ?", p,
	                      1, read_chan, &r);
	if (rc == 0 && r.found && out->base_url[0])
		rc = secret_open(pay->has_secret_key ? pay->secret_key : NULL, name, r.stored,
		                 out->secret);
	OPENSSL_cleanse(r.stored, sizeof(r.stored));
	if (rc < 0) {
		OPENSSL_cleanse(out, sizeof(*out));
		return rc == IDEM_EINVAL
		           ? idem__error(IDEM_ESTORE, "%s", idem_error_last()->message)
		           : rc;
	}
	*found = r.found;
	return 0;
}

static int valid_base_url(const char *u)
{
	size_t n = strlen(u);

	if (n < 8 || n >= 480)
		return 0;
	if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)u[i] <= 0x20 || (unsigned char)u[i] >= 0x7f || u[i] == '?' ||
		    u[i] == '#')
			return 0;
	return 1;
}

typedef struct {
	const char *name, *url;
	int64_t timeout_ms, changed;
} chan_connect;

static int connect_step(idem_txn *txn, void *ctx)
{
	chan_connect *c = ctx;
	idem_value p[3] = {c->url ? IDEM_V_TEXT(c->url) : IDEM_V_NULL, IDEM_V_INT(c->timeout_ms),
	                   IDEM_V_TEXT(c->name)};

	return idem_txn_exec(txn, "UPDATE channels SET base_url = ?, timeout_ms = ? WHERE name = ?",
	                     p, 3, &c->changed);
}

int idem_pay_channel_connect(idem_pay *pay, const char *name, const char *base_url,
                             int64_t timeout_ms)
{
	char url[512];
	chan_connect c = {name, NULL, timeout_ms, 0};
	int rc;

	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(name);
	if (!pay__valid_channel_name(name))
		return idem__error(IDEM_EINVAL, "channel name must be 1..%d of [a-z0-9_-]",
		                   IDEM_PAY_CHANNEL_MAX);
	if (timeout_ms < 1 || timeout_ms > 600000)
		return idem__error(IDEM_EINVAL, "timeout must be 1..600000 ms");
	if (base_url) {
		size_t n;

		if (!valid_base_url(base_url))
			return idem__error(IDEM_EINVAL,
			                   "base URL must be http:// or https://, printable,"
			                   " without a query, under 480 bytes");
		n = strlen(base_url);
		memcpy(url, base_url, n + 1);
		while (n > 8 && url[n - 1] == '/')
			url[--n] = '\0';
		c.url = url;
	}
	if (pay->nshards) {
		if ((rc = idem_pay_channel_connect(pay->shards[0], name, base_url, timeout_ms)) < 0)
			return rc;
		return pay__channels_sync(pay, name);
	}
	if ((rc = idem_store_transact(pay->store, connect_step, &c)) < 0)
		return rc;
	if (c.changed == 0)
		return idem__error(IDEM_ENOTFOUND, "no channel '%s'", name);
	return 0;
}
