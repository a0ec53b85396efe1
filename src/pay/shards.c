/*
 * pay/shards.c: sharding by merchant (docs/scaling.md, "Sharding"): which
 * shard a request goes to, the directory of merchants, the ids that carry a
 * shard, and channel rows copied to every shard. The request files route
 * through it; it never opens or closes a handle (pay.c does) and never runs
 * a request itself.
 *
 * A router handle (idem_pay_open_shards, in pay.c) holds one plain handle
 * per store. A merchant lives on exactly one shard: at creation, shard =
 * SHA-256(merchant id), its first 8 bytes as a big-endian integer, modulo the
 * number of shards configured then, and the choice is recorded in the
 * directory table merchant_shards on shard 0. Adding a shard changes where
 * new merchants go and nothing else. The directory is read-mostly: a
 * merchant never moves, so what was read once is kept (a fixed cache; a slot
 * reused by another merchant costs one more read on shard 0).
 *
 * Ids that another party must find without a merchant carry their shard:
 * payment ids (the channel's out_trade_no), refund and transfer ids, and API
 * key ids. Shard 0's are exactly the ids of one store; another shard's have
 * "s" and three decimal digits where the first four random hex digits were.
 *
 * Channels are configuration kept on shard 0 and copied to every other shard
 * (at open, and by every change made through the router), so that each
 * request still reads only its own shard.
 */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "util/digest.h"
#include "util/error.h"
#include "util/rand.h"

#define DIR_SLOTS   8192
#define DIR_STRIPES 16

typedef struct {
	char merchant[IDEM_PAY_ID_SIZE];
	int shard; /* -1: empty */
} dir_slot;

struct pay__dir {
	pthread_mutex_t locks[DIR_STRIPES];
	dir_slot slots[DIR_SLOTS];
};

pay__dir *pay__dir_new(void)
{
	pay__dir *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	for (int i = 0; i < DIR_STRIPES; i++)
		pthread_mutex_init(&d->locks[i], NULL);
	for (int i = 0; i < DIR_SLOTS; i++)
		d->slots[i].shard = -1;
	return d;
}

void pay__dir_free(pay__dir *d)
{
	if (!d)
		return;
	for (int i = 0; i < DIR_STRIPES; i++)
		pthread_mutex_destroy(&d->locks[i]);
	free(d);
}

static unsigned dir_hash(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h % DIR_SLOTS;
}

static int dir_get(pay__dir *d, const char *merchant)
{
	unsigned i = dir_hash(merchant);
	int shard = -1;

	pthread_mutex_lock(&d->locks[i % DIR_STRIPES]);
	if (d->slots[i].shard >= 0 && strcmp(d->slots[i].merchant, merchant) == 0)
		shard = d->slots[i].shard;
	pthread_mutex_unlock(&d->locks[i % DIR_STRIPES]);
	return shard;
}

void pay__dir_remember(idem_pay *pay, const char *merchant, int shard)
{
	unsigned i;

	if (!pay->dir || !merchant || strlen(merchant) >= IDEM_PAY_ID_SIZE)
		return;
	i = dir_hash(merchant);
	pthread_mutex_lock(&pay->dir->locks[i % DIR_STRIPES]);
	snprintf(pay->dir->slots[i].merchant, IDEM_PAY_ID_SIZE, "%s", merchant);
	pay->dir->slots[i].shard = shard;
	pthread_mutex_unlock(&pay->dir->locks[i % DIR_STRIPES]);
}

int pay__dir_insert(idem_txn *txn, const char *merchant, int shard, int64_t now)
{
	idem_value p[3] = {IDEM_V_TEXT(merchant), IDEM_V_INT(shard), IDEM_V_INT(now)};

	return idem_txn_exec(txn,
	                     "INSERT INTO merchant_shards (merchant_id, shard, created_at)"
	                     " VALUES (?, ?, ?)",
	                     p, 3, NULL);
}

int pay__dir_lookup(idem_pay *pay, const char *merchant, int *shard, int *found)
{
	int64_t v = -1;
	idem_value p[1];
	int rc;

	*shard = 0;
	*found = 0;
	if (!merchant || !merchant[0] || strlen(merchant) >= IDEM_PAY_ID_SIZE)
		return 0; /* no such merchant anywhere */
	if ((*shard = dir_get(pay->dir, merchant)) >= 0) {
		*found = 1;
		return 0;
	}
	*shard = 0;
	p[0] = IDEM_V_TEXT(merchant);
	rc = idem_store_query(pay->shards[0]->store,
	                      "SELECT shard FROM merchant_shards WHERE merchant_id = ?", p, 1,
	                      idem_row_int, &v);
	if (rc < 0 || v < 0)
		return rc;
	*shard = (int)v;
	*found = 1;
	pay__dir_remember(pay, merchant, *shard);
	return 0;
}

int pay__route(idem_pay *pay, const char *merchant, idem_pay **out)
{
	int shard = 0, found = 0, rc;

	*out = pay;
	if (!pay->nshards)
		return 0;
	if ((rc = pay__dir_lookup(pay, merchant, &shard, &found)) < 0)
		return rc;
	if (shard >= pay->nshards)
		return idem__error(IDEM_ESTORE,
		                   "merchant '%s' lives on shard %d, but only %d are configured"
		                   " (--db)",
		                   merchant, shard, pay->nshards);
	*out = pay->shards[shard];
	return 0;
}

idem_pay *pay__route_async(idem_pay *pay, const char *merchant, idem_done_fn done, void *done_ctx)
{
	idem_pay *home = pay;
	int rc;

	if (pay->nshards && (rc = pay__route(pay, merchant, &home)) < 0) {
		idem_result none = {0};

		done(done_ctx, rc, &none);
		return NULL;
	}
	return home;
}

idem_pay *pay__route_notify(idem_pay *pay, const idem_pay_request *rq)
{
	json_t *doc, *id;
	int shard = 0;

	if (!pay->nshards)
		return pay;
	/* One parse more, on notifications only; the shard parses it for real. */
	doc = rq->body ? json_loadb(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, NULL) : NULL;
	id = json_is_object(doc) ? json_object_get(doc, "payment_id") : NULL;
	if (json_is_string(id))
		shard = pay__id_shard(json_string_value(id));
	json_decref(doc);
	return pay->shards[shard > 0 && shard < pay->nshards ? shard : 0];
}

int pay__id_shard(const char *id)
{
	const char *p = id ? strchr(id, '_') : NULL;

	if (!p)
		return -1;
	p++;
	if (p[0] == 's' && p[1] >= '0' && p[1] <= '9' && p[2] >= '0' && p[2] <= '9' &&
	    p[3] >= '0' && p[3] <= '9')
		return (p[1] - '0') * 100 + (p[2] - '0') * 10 + (p[3] - '0');
	return 0;
}

int pay__new_key_id(const idem_pay *pay, char out[17])
{
	if (pay->shard <= 0)
		return idem__rand_hex(out, 8);
	snprintf(out, 5, "s%03u", (unsigned)pay->shard % 1000u);
	return idem__rand_hex(out + 4, 6);
}

int idem_pay_shard_of(const char *merchant_id, int nshards)
{
	unsigned char md[32];
	uint64_t v = 0;
	int rc;

	IDEM__ASSERT_ARG(merchant_id);
	IDEM__ASSERT_ARG(nshards >= 1);
	if ((rc = idem__sha256(md, merchant_id, strlen(merchant_id))) < 0)
		return rc;
	for (int i = 0; i < 8; i++)
		v = v << 8 | md[i];
	return (int)(v % (uint64_t)nshards);
}

int idem_pay_shard_count(const idem_pay *pay)
{
	IDEM__ASSERT_ARG(pay); /* IDEM_EINVAL: never a count */
	return pay->nshards ? pay->nshards : 1;
}

int idem_pay_merchant_shard(idem_pay *pay, const char *merchant_id, int *shard)
{
	int found = 0, rc;

	IDEM__ASSERT_ARG(shard);
	*shard = 0;
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(merchant_id);
	if (!pay->nshards)
		return 0;
	if ((rc = pay__dir_lookup(pay, merchant_id, shard, &found)) < 0)
		return rc;
	return found ? 0 : idem__error(IDEM_ENOTFOUND, "no merchant '%s'", merchant_id);
}

idem_pay *idem_pay_shard(idem_pay *pay, int i)
{
	IDEM__ASSERT_ARG_WITH_RETVAL(pay, NULL); /* as for a shard out of range */
	if (!pay->nshards)
		return i == 0 ? pay : NULL;
	return i >= 0 && i < pay->nshards ? pay->shards[i] : NULL;
}

/* ---- channels: shard 0's rows, copied to the others ---------------------- */

typedef struct {
	char name[IDEM_PAY_CHANNEL_MAX + 1];
	char secret[PAY__STORED_SECRET_SIZE];
	char url[512];
	int has_url;
	int64_t timeout_ms, created_at;
} chan_copy;

typedef struct {
	chan_copy *rows;
	int n, cap;
} chan_rows;

static int collect_chan(void *ctx, const idem_value *c, int n)
{
	chan_rows *r = ctx;
	chan_copy *row;

	if (n != 5)
		return idem__error(IDEM_ESTORE, "channel row has %d columns", n);
	if (r->n == r->cap) {
		int cap = r->cap ? 2 * r->cap : 8;
		chan_copy *rows = realloc(r->rows, (size_t)cap * sizeof(*rows));

		if (!rows)
			return idem__error(IDEM_ENOMEM, "out of memory");
		r->rows = rows;
		r->cap = cap;
	}
	row = &r->rows[r->n++];
	pay__col_text(row->name, sizeof(row->name), &c[0]);
	pay__col_text(row->secret, sizeof(row->secret), &c[1]);
	pay__col_text(row->url, sizeof(row->url), &c[2]);
	row->has_url = c[2].type != IDEM_VAL_NULL;
	row->timeout_ms = c[3].i;
	row->created_at = c[4].i;
	return 0;
}

typedef struct {
	char secret[PAY__STORED_SECRET_SIZE];
	char url[512];
	int has_url, found;
	int64_t timeout_ms;
} chan_have;

static int read_have(void *ctx, const idem_value *c, int n)
{
	chan_have *h = ctx;

	if (n != 3)
		return idem__error(IDEM_ESTORE, "channel row has %d columns", n);
	pay__col_text(h->secret, sizeof(h->secret), &c[0]);
	pay__col_text(h->url, sizeof(h->url), &c[1]);
	h->has_url = c[1].type != IDEM_VAL_NULL;
	h->timeout_ms = c[2].i;
	h->found = 1;
	return 1;
}

/* Whether two stored secrets differ, in time that does not depend on where. */
static int stored_differs(const char *a, const char *b)
{
	size_t n = strlen(a);

	return n != strlen(b) || CRYPTO_memcmp(a, b, n) != 0;
}

static int copy_step(idem_txn *txn, void *ctx)
{
	chan_rows *r = ctx;
	int rc = 0;

	for (int i = 0; i < r->n && rc == 0; i++) {
		chan_copy *c = &r->rows[i];
		chan_have h = {"", "", 0, 0, 0};
		idem_value k[1] = {IDEM_V_TEXT(c->name)};
		idem_value url = c->has_url ? IDEM_V_TEXT(c->url) : IDEM_V_NULL;

		if ((rc = idem_txn_query(txn,
		                         "SELECT secret, base_url, timeout_ms FROM channels"
		                         " WHERE name = ?",
		                         k, 1, read_have, &h)) < 0)
			break;
		if (!h.found) {
			idem_value v[5] = {IDEM_V_TEXT(c->name), IDEM_V_TEXT(c->secret),
			                   IDEM_V_INT(c->created_at), url,
			                   IDEM_V_INT(c->timeout_ms)};

			rc = idem_txn_exec(
			    txn,
			    "INSERT INTO channels (name, secret, created_at, base_url,"
			    " timeout_ms) VALUES (?, ?, ?, ?, ?)",
			    v, 5, NULL);
		} else if (stored_differs(h.secret, c->secret) || h.has_url != c->has_url ||
		           strcmp(h.url, c->url) != 0 || h.timeout_ms != c->timeout_ms) {
			idem_value v[4] = {IDEM_V_TEXT(c->secret), url, IDEM_V_INT(c->timeout_ms),
			                   IDEM_V_TEXT(c->name)};

			rc = idem_txn_exec(
			    txn,
			    "UPDATE channels SET secret = ?, base_url = ?, timeout_ms = ?"
			    " WHERE name = ?",
			    v, 4, NULL);
		}
		OPENSSL_cleanse(&h, sizeof(h));
	}
	return rc;
}

int pay__channels_sync(idem_pay *router, const char *name)
{
	chan_rows r = {NULL, 0, 0};
	idem_value p[1];
	int rc;

	if (!router->nshards || router->nshards < 2)
		return 0;
	if (name) {
		p[0] = IDEM_V_TEXT(name);
		rc = idem_store_query(router->shards[0]->store,
		                      "SELECT name, secret, base_url, timeout_ms, created_at"
		                      " FROM channels WHERE name = ?",
		                      p, 1, collect_chan, &r);
	} else
		rc = idem_store_query(router->shards[0]->store,
		                      "SELECT name, secret, base_url, timeout_ms, created_at"
		                      " FROM channels ORDER BY name",
		                      NULL, 0, collect_chan, &r);
	for (int i = 1; rc == 0 && r.n > 0 && i < router->nshards; i++)
		rc = idem_store_transact(router->shards[i]->store, copy_step, &r);
	if (r.rows) {
		OPENSSL_cleanse(r.rows, (size_t)r.cap * sizeof(*r.rows));
		free(r.rows);
	}
	return rc;
}
