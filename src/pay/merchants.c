/*
 * pay/merchants.c: merchants with their API keys. An API key is
 * "sk_<key id>_<secret>". Only the key id (for the lookup) and the SHA-256
 * digest of the whole key are stored; the presented key's digest is
 * compared with CRYPTO_memcmp, so timing says nothing about how much of a
 * guess was right. The key itself goes to the caller's buffer once and is
 * never kept, logged or put in an error message. On a router a merchant is
 * created on its shard and recorded in the directory (shards.c).
 */
#include <openssl/crypto.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pay/internal.h"
#include "util/digest.h"
#include "util/error.h"
#include "util/rand.h"

#define KEY_ID_HEX     16
#define KEY_SECRET_HEX 48

static int sha256_hex(char out[65], const void *data, size_t len)
{
	unsigned char md[32];
	int rc = idem__sha256(md, data, len);

	if (rc == 0)
		idem__hex(out, md, sizeof(md));
	OPENSSL_cleanse(md, sizeof(md));
	return rc;
}

typedef struct {
	const char *name;
	char id[IDEM_PAY_ID_SIZE];
	char key_id[KEY_ID_HEX + 1];
	char digest[65];
	int64_t now;
	int directory; /* write the directory row (shard 0) in the same transaction */
} merchant_new;

static int insert_merchant(idem_txn *txn, void *ctx)
{
	merchant_new *m = ctx;
	idem_value p[5] = {IDEM_V_TEXT(m->id), IDEM_V_TEXT(m->name), IDEM_V_TEXT(m->key_id),
	                   IDEM_V_TEXT(m->digest), IDEM_V_INT(m->now)};
	int rc;

	if (m->directory && (rc = pay__dir_insert(txn, m->id, 0, m->now)) < 0)
		return rc;
	return idem_txn_exec(txn,
	                     "INSERT INTO merchants (id, name, key_id, key_digest, created_at)"
	                     " VALUES (?, ?, ?, ?, ?)",
	                     p, 5, NULL);
}

typedef struct {
	const char *id;
	int shard;
	int64_t now;
} dir_new_row;

static int insert_dir_row(idem_txn *txn, void *ctx)
{
	dir_new_row *d = ctx;

	return pay__dir_insert(txn, d->id, d->shard, d->now);
}

/*
 * Length of the well-formed UTF-8 sequence at s (at most n bytes) and its
 * code point, or 0: no overlong forms, no surrogates, nothing past U+10FFFF.
 */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp)
{
	static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
	size_t len = s[0] < 0x80                    ? 1
	             : s[0] >= 0xc2 && s[0] <= 0xdf ? 2
	             : s[0] >= 0xe0 && s[0] <= 0xef ? 3
	             : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
	                                            : 0;
	uint32_t v;

	if (len == 0 || len > n)
		return 0;
	v = len == 1 ? s[0] : s[0] & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		v = v << 6 | (s[i] & 0x3f);
	}
	if (v < min[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
		return 0;
	*cp = v;
	return len;
}

/* 1..100 bytes of well-formed UTF-8 without control characters (C0, DEL, C1). */
static int valid_name(const char *name)
{
	const unsigned char *s = (const unsigned char *)name;
	size_t n = name ? strlen(name) : 0, len;
	uint32_t cp = 0;

	if (n == 0 || n > 100)
		return 0;
	for (size_t i = 0; i < n; i += len) {
		if (!(len = utf8_seq(s + i, n - i, &cp)) || cp < 0x20 || (cp >= 0x7f && cp < 0xa0))
			return 0;
	}
	return 1;
}

int idem_pay_merchant_add(idem_pay *pay, const char *name, char id_out[IDEM_PAY_ID_SIZE],
                          char key_out[IDEM_PAY_SECRET_SIZE])
{
	merchant_new m = {0};
	char secret[KEY_SECRET_HEX + 1];
	idem_pay *home = pay;
	int rc, shard = 0;

	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(id_out);
	IDEM__ASSERT_ARG(key_out);
	id_out[0] = key_out[0] = '\0';
	if (!valid_name(name))
		return idem__error(IDEM_EINVAL,
		                   "merchant name must be 1..100 bytes of UTF-8 without"
		                   " control characters");
	m.name = name;
	m.now = pay__now(pay);
	if ((rc = pay__new_id(m.id, "m_", 0)) < 0)
		return rc;
	if (pay->nshards) {
		/* Its shard, recorded before its row exists: a crash in between leaves a
		 * directory row naming nobody, never a merchant the directory lacks. */
		dir_new_row d = {m.id, 0, m.now};

		if ((shard = idem_pay_shard_of(m.id, pay->nshards)) < 0)
			return shard;
		home = pay->shards[shard];
		d.shard = shard;
		if (shard != 0 &&
		    (rc = idem_store_transact(pay->shards[0]->store, insert_dir_row, &d)) < 0)
			return rc;
	}
	m.directory = shard == 0;
	if ((rc = pay__new_key_id(home, m.key_id)) < 0 ||
	    (rc = idem__rand_hex(secret, KEY_SECRET_HEX / 2)) < 0)
		return rc;
	snprintf(key_out, IDEM_PAY_SECRET_SIZE, "sk_%s_%s", m.key_id, secret);
	OPENSSL_cleanse(secret, sizeof(secret));
	if ((rc = sha256_hex(m.digest, key_out, strlen(key_out))) < 0 ||
	    (rc = idem_store_transact(home->store, insert_merchant, &m)) < 0) {
		OPENSSL_cleanse(key_out, IDEM_PAY_SECRET_SIZE);
		key_out[0] = '\0';
		return rc;
	}
	pay__dir_remember(pay, m.id, shard);
	memcpy(id_out, m.id, IDEM_PAY_ID_SIZE);
	return 0;
}

int idem_pay_merchant_count(idem_pay *pay, int64_t *out)
{
	IDEM__ASSERT_ARG(out);
	*out = 0;
	IDEM__ASSERT_ARG(pay);
	for (int i = 0; i < pay->nshards; i++) {
		int64_t n = 0;
		int rc = idem_pay_merchant_count(pay->shards[i], &n);

		if (rc < 0)
			return rc;
		*out += n;
	}
	if (pay->nshards)
		return 0;
	return idem_store_query(pay->store, "SELECT count(*) FROM merchants", NULL, 0, idem_row_int,
	                        out);
}

typedef struct {
	char id[IDEM_PAY_ID_SIZE];
	char digest[65];
	int found;
} key_row;

static int read_key_row(void *ctx, const idem_value *cols, int n)
{
	key_row *k = ctx;

	if (n != 2)
		return idem__error(IDEM_ESTORE, "merchant row has %d columns", n);
	pay__col_text(k->id, sizeof(k->id), &cols[0]);
	pay__col_text(k->digest, sizeof(k->digest), &cols[1]);
	k->found = 1;
	return 1;
}

/* IDEM_ENOTFOUND unless api_key has the form of a key: "sk_<id>_<secret>". */
static int key_form(const char *api_key, size_t len)
{
	if (!api_key || len != 3 + KEY_ID_HEX + 1 + KEY_SECRET_HEX ||
	    memcmp(api_key, "sk_", 3) != 0 || api_key[3 + KEY_ID_HEX] != '_')
		return IDEM_ENOTFOUND;
	return 0;
}

/* A router's shard for api_key: its key id names it ("s" + three digits;
 * else shard 0). -1 when that is no shard of this router. */
static int key_shard(const idem_pay *pay, const char *api_key)
{
	int shard = api_key[3] == 's' ? pay__id_shard(api_key) : 0;

	return shard < 0 || shard >= pay->nshards ? -1 : shard;
}

int idem_pay_authenticate_cached(idem_pay *pay, const char *api_key, size_t len,
                                 char id_out[IDEM_PAY_ID_SIZE])
{
	char digest[65];
	int rc, shard;

	IDEM__ASSERT_ARG(id_out);
	id_out[0] = '\0';
	IDEM__ASSERT_ARG(pay);
	if ((rc = key_form(api_key, len)) < 0)
		return rc;
	if (pay->nshards) {
		if ((shard = key_shard(pay, api_key)) < 0)
			return IDEM_ENOTFOUND;
		rc = idem_pay_authenticate_cached(pay->shards[shard], api_key, len, id_out);
		if (rc == 1) /* memory only, as the lookup below */
			pay__dir_remember(pay, id_out, shard);
		return rc;
	}
	/* No cache, or no digest (out of memory): the full lookup will say. */
	if (!pay->auth || sha256_hex(digest, api_key, len) < 0)
		return 0;
	return pay__authcache_get(pay->auth, digest, pay__now(pay), id_out) ? 1 : 0;
}

int idem_pay_authenticate(idem_pay *pay, const char *api_key, size_t len,
                          char id_out[IDEM_PAY_ID_SIZE])
{
	key_row row = {0};
	char key_id[KEY_ID_HEX + 1], digest[65];
	idem_value p[1];
	int rc, shard;

	IDEM__ASSERT_ARG(id_out);
	id_out[0] = '\0';
	IDEM__ASSERT_ARG(pay);
	if ((rc = key_form(api_key, len)) < 0)
		return rc;
	if (pay->nshards) {
		/* One shard is asked, and what it confirms fills the directory cache. */
		if ((shard = key_shard(pay, api_key)) < 0)
			return IDEM_ENOTFOUND;
		if ((rc = idem_pay_authenticate(pay->shards[shard], api_key, len, id_out)) == 0)
			pay__dir_remember(pay, id_out, shard);
		return rc;
	}
	if ((rc = sha256_hex(digest, api_key, len)) < 0)
		return rc;
	if (pay->auth && pay__authcache_get(pay->auth, digest, pay__now(pay), id_out))
		return 0;
	memcpy(key_id, api_key + 3, KEY_ID_HEX);
	key_id[KEY_ID_HEX] = '\0';
	p[0] = IDEM_V_TEXT(key_id);
	rc = idem_store_query(pay->store, "SELECT id, key_digest FROM merchants WHERE key_id = ?",
	                      p, 1, read_key_row, &row);
	if (rc < 0)
		return rc;
	if (!row.found || strlen(row.digest) != 64 || !pay__digest_equal(digest, row.digest))
		return IDEM_ENOTFOUND;
	memcpy(id_out, row.id, IDEM_PAY_ID_SIZE);
	if (pay->auth)
		pay__authcache_put(pay->auth, digest, pay__now(pay), row.id);
	return 0;
}
