/*
 * core/claim.c: the claim protocol. Decides FIRST / REPLAY / IN_PROGRESS /
 * MISMATCH from what the store's INSERT and reads return; holds no SQL.
 *
 * Why this is exactly-once. Only rec_insert (an INSERT into the UNIQUE index
 * over (scope, business_type, key)) or rec_takeover (an UPDATE conditional on
 * the version read in the same transaction) can make a caller FIRST, and
 * both happen in the write transaction that also runs the work (atomic mode)
 * or commits the lease (two-phase). Two callers cannot both insert the same
 * key: the database lets one INSERT win and makes the other wait for that
 * transaction and then report the conflict. Two callers cannot both take over
 * the same record: the UPDATE matches only the version both read, and after
 * the first one commits the version has changed. The read-connection fast
 * path only ever answers REPLAY, MISMATCH or IN_PROGRESS, never FIRST.
 *
 * Errors are never outcomes: any failure of the store returns a negative
 * code with the transaction rolled back, so nothing is half-applied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "core/cache.h"
#include "core/claim_internal.h"
#include "core/engine.h"
#include "idem/claim.h"
#include "idem/metrics.h"
#include "idem/util.h"
#include "util/error.h"
#include "util/rand.h"
#include "util/waiter.h"

#define OUTCOME_TAKEOVER 0

struct idem_claim {
	idem_store *store;
	int64_t id;
	char owner[33];
	char type[IDEM_TYPE_MAX + 1];
};

static int type_validate(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > IDEM_TYPE_MAX)
		return IDEM_EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return IDEM_EINVAL;
	return 0;
}

static int fingerprint_validate(const char *s)
{
	if (!s || strlen(s) != IDEM_FINGERPRINT_LEN)
		return IDEM_EINVAL;
	for (size_t i = 0; i < IDEM_FINGERPRINT_LEN; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return IDEM_EINVAL;
	return 0;
}

static int key_from_parts(idem__key *k, const char *scope, const char *type, const char *key,
                          size_t key_len)
{
	if (!scope || idem_token_validate(scope, strlen(scope), IDEM_SCOPE_MAX) < 0)
		return idem__error(IDEM_EINVAL, "scope must be 1..%d bytes of 0x21..0x7E",
		                   IDEM_SCOPE_MAX);
	if (type_validate(type) < 0)
		return idem__error(IDEM_EINVAL, "business type must be 1..%d of [a-z0-9_]",
		                   IDEM_TYPE_MAX);
	if (!key || idem_key_validate(key, key_len) < 0)
		return idem__error(IDEM_EINVAL, "idempotency key must be 1..%d bytes of 0x21..0x7E",
		                   IDEM_KEY_MAX);
	k->scope = scope;
	k->scope_len = strlen(scope);
	k->type = type;
	k->type_len = strlen(type);
	k->key = key;
	k->key_len = key_len;
	return 0;
}

int idem__request_key(idem__key *k, const idem_request *req)
{
	if (!req || req->version != IDEM_REQUEST_VERSION)
		return idem__error(IDEM_EINVAL, "idem_request missing or of another version");
	if (fingerprint_validate(req->fingerprint) < 0)
		return idem__error(IDEM_EINVAL, "fingerprint must be 64 lower-case hex digits");
	if (req->ttl_ms < 0 || req->lease_ms < 0)
		return idem__error(IDEM_EINVAL, "ttl and lease must not be negative");
	return key_from_parts(k, req->scope, req->business_type, req->key, req->key_len);
}

/*
 * What an existing record means for a caller with fingerprint fp at now.
 * A PROCESSING record is governed by its lease alone (a live lease is never
 * taken over, even past expires_at); a completed one by expires_at.
 */
static int classify(const idem__record *ex, const char *fp, int64_t now)
{
	if (ex->status == IDEM__ST_PROCESSING ? ex->lease_until <= now : ex->expires_at <= now)
		return OUTCOME_TAKEOVER;
	if (strcmp(ex->fingerprint, fp) != 0)
		return IDEM_MISMATCH;
	if (ex->status == IDEM__ST_PROCESSING)
		return IDEM_IN_PROGRESS;
	return IDEM_REPLAY;
}

/* Fill out for a non-FIRST outcome; takes ex's body for REPLAY. */
static void answer_from(idem_result *out, int outcome, idem__record *ex, int64_t now)
{
	out->outcome = (idem_outcome)outcome;
	out->expires_at_ms = ex->expires_at;
	if (outcome == IDEM_REPLAY) {
		out->http_status = ex->http_status;
		out->body = ex->body;
		out->body_len = ex->body_len;
		ex->body = NULL;
		ex->body_len = 0;
	} else if (outcome == IDEM_IN_PROGRESS) {
		out->retry_after_ms = ex->lease_until > now ? ex->lease_until - now : 0;
	}
}

/* A duplicate weighs 3 new keys: the score rises while more than one miss
 * in four is a duplicate, falls otherwise, and the read runs above ON. MAX
 * bounds how long a past storm of duplicates is remembered (MAX - ON new
 * keys). */
#define MISS_DUP 3
#define MISS_ON  32
#define MISS_MAX 256

void idem__miss_note(idem_store *s, int duplicate)
{
	int v = atomic_load_explicit(&s->miss_score, memory_order_relaxed);
	int n = duplicate ? v + MISS_DUP : v - 1;

	n = n < 0 ? 0 : n > MISS_MAX ? MISS_MAX : n;
	if (n != v)
		atomic_store_explicit(&s->miss_score, n, memory_order_relaxed);
}

int idem__miss_read_pays(const idem_store *s)
{
	return atomic_load_explicit(&s->miss_score, memory_order_relaxed) > MISS_ON;
}

/*
 * The read before the write (DESIGN.md §3): a completed record is immutable,
 * so finding one answers the duplicate with no write at all. Returns 1 when
 * out is answered, 0 when the write path must decide, or an error.
 */
int idem__fast_path(idem_store *s, const idem__key *k, const char *fp, idem_result *out)
{
	idem__record ex = {0};
	int64_t now = idem_store_now(s);
	int rc = idem__cache_get(s->cache, k, fp, now, out);
	int outcome;

	if (rc != 0)
		return rc;
	if ((rc = idem__rec_read(s->ops, s->be, k, &ex)) == IDEM_ENOTFOUND) {
		idem__miss_note(s, 0);
		return 0;
	}
	if (rc < 0)
		return rc;
	idem__miss_note(s, 1);
	outcome = classify(&ex, fp, now);
	if (outcome == IDEM_REPLAY)
		idem__cache_put(s->cache, k, ex.fingerprint, ex.http_status, ex.body, ex.body_len,
		                ex.expires_at, now);
	if (outcome != OUTCOME_TAKEOVER)
		answer_from(out, outcome, &ex, now);
	idem__record_clear(&ex);
	return outcome != OUTCOME_TAKEOVER;
}

void idem__cache_after_commit(idem_store *s, const idem__key *k, const idem_request *req,
                              const idem_result *res)
{
	if ((res->outcome == IDEM_FIRST && res->stored) || res->outcome == IDEM_REPLAY)
		idem__cache_put(s->cache, k, req->fingerprint, res->http_status, res->body,
		                res->body_len, res->expires_at_ms, idem_store_now(s));
}

/*
 * The replay shortcut (src/pay/pipeline.c). A hit is a REPLAY exactly as
 * the canonical path would have found it: raw was kept with this entry
 * only after those very bytes had produced the entry's fingerprint
 * (idem__replay_note_raw), and equal bytes give an equal fingerprint.
 * Anything but a hit returns 0 and decides nothing. req->fingerprint is
 * not read here (the caller has none yet).
 */
int idem__replay_raw(idem_store *s, const idem_request *req, const void *raw, size_t len,
                     idem_result *out)
{
	idem__key k;
	int rc;

	if (!s || !s->cache || !req || req->version != IDEM_REQUEST_VERSION ||
	    key_from_parts(&k, req->scope, req->business_type, req->key, req->key_len) < 0)
		return 0;
	rc = idem__cache_get_raw(s->cache, &k, raw, len, idem_store_now(s), out);
	if (rc == 1)
		idem__count(s, req->business_type, 0, out);
	return rc;
}

void idem__replay_note_raw(idem_store *s, const idem_request *req, const void *raw, size_t len)
{
	idem__key k;

	if (s && s->cache && idem__request_key(&k, req) == 0)
		idem__cache_note_raw(s->cache, &k, req->fingerprint, raw, len, idem_store_now(s));
}

static int64_t ttl_of(const idem_store *s, const idem_request *req)
{
	return req->ttl_ms > 0 ? req->ttl_ms : s->opts.default_ttl_ms;
}

static int64_t lease_of(const idem_store *s, const idem_request *req)
{
	return req->lease_ms > 0 ? req->lease_ms : s->opts.default_lease_ms;
}

/*
 * Claim inside an open write transaction. On FIRST, *id_out is the record's
 * id, held PROCESSING by owner. Otherwise out holds the answer.
 */
static int claim_in_txn(idem_txn *txn, const idem__key *k, const idem_request *req,
                        const char *owner, int64_t *id_out, idem_result *out)
{
	idem_store *s = txn->store;
	int64_t now = idem_store_now(s);
	idem__record rec = {0}, ex = {0};
	int rc, outcome, changed = 0;

	rec.version = 1;
	rec.status = IDEM__ST_PROCESSING;
	memcpy(rec.fingerprint, req->fingerprint, IDEM_FINGERPRINT_LEN + 1);
	memcpy(rec.owner, owner, sizeof(rec.owner));
	rec.lease_until = now + lease_of(s, req);
	rec.created_at = now;
	rec.expires_at = now + ttl_of(s, req);

	rc = s->ops->rec_insert(txn, k, &rec);
	if (rc < 0)
		return rc;
	if (rc == 0) {
		*id_out = rec.id;
		out->outcome = IDEM_FIRST;
		out->expires_at_ms = rec.expires_at;
		return 0;
	}
	/* IDEM__DUPLICATE: the key exists (committed, since the INSERT waited). */
	rc = idem__rec_get(txn, k, &ex);
	if (rc == IDEM_ENOTFOUND) /* deleted between our INSERT and read: go again */
		return idem__error(IDEM_ERETRY, "record vanished during claim");
	if (rc < 0)
		return rc;
	outcome = classify(&ex, req->fingerprint, now);
	if (outcome != OUTCOME_TAKEOVER) {
		answer_from(out, outcome, &ex, now);
		idem__record_clear(&ex);
		return 0;
	}
	rc = s->ops->rec_takeover(txn, ex.id, ex.version, &rec, &changed);
	if (rc == 0 && !changed)
		rc = idem__error(IDEM_ERETRY, "record changed during takeover");
	if (rc == 0) {
		*id_out = ex.id;
		out->outcome = IDEM_FIRST;
		out->expires_at_ms = rec.expires_at;
	}
	idem__record_clear(&ex);
	return rc;
}

static idem__status status_for(int http_status)
{
	return http_status >= 200 && http_status < 300 ? IDEM__ST_SUCCEEDED : IDEM__ST_FAILED;
}

/*
 * Run work for the record id held by owner, then complete the record with its
 * response when it is to be kept. On success out holds the response; when
 * out->stored is 0 the caller rolls the work back. Inside the caller's
 * transaction and savepoint, in which claim_in_txn claimed id.
 */
static int work_and_complete(idem_txn *txn, int64_t id, const char *owner, idem_work_fn work,
                             void *ctx, idem_result *out)
{
	const idem__backend_ops *ops = txn->ops;
	idem_response resp = {0, NULL, 0, 1};
	int rc, changed = 0;

	if ((rc = work(txn, ctx, &resp)) < 0)
		goto done;
	if (resp.http_status < 100 || resp.http_status > 599) {
		rc = idem__error(IDEM_EINVAL, "unit of work answered HTTP status %d",
		                 resp.http_status);
		goto done;
	}
	if (resp.persist && ops->rec_complete_held) {
		/* The claim above holds the row: the completion cannot miss. */
		rc = ops->rec_complete_held(txn, id, owner, status_for(resp.http_status),
		                            resp.http_status, resp.body, resp.body_len,
		                            idem_store_now(txn->store));
		if (rc < 0)
			goto done;
	} else if (resp.persist) {
		rc = ops->rec_complete(txn, id, owner, status_for(resp.http_status),
		                       resp.http_status, resp.body, resp.body_len,
		                       idem_store_now(txn->store), &changed);
		if (rc == 0 && !changed)
			rc = idem__error(IDEM_ELEASE, "the claim's lease was taken over");
		if (rc < 0)
			goto done;
	}
	out->outcome = IDEM_FIRST;
	out->http_status = resp.http_status;
	out->body = resp.body;
	out->body_len = resp.body_len;
	out->stored = resp.persist != 0;
	resp.body = NULL;
done:
	free(resp.body);
	return rc;
}

/*
 * One unit inside a (possibly shared) transaction: its own savepoint, so a
 * failing unit rolls back alone, claim included. A response that is not to
 * be kept rolls the unit back too: nothing of it remains but the answer.
 */
int idem__run_unit(idem_txn *txn, const idem__key *k, const idem_request *req, const char *owner,
                   idem_work_fn work, void *ctx, idem_result *out)
{
	const idem__backend_ops *ops = txn->ops;
	int64_t id = 0;
	int rc;

	if ((rc = ops->savepoint(txn, "idem_unit")) < 0)
		return rc;
	if ((rc = claim_in_txn(txn, k, req, owner, &id, out)) < 0)
		goto undo;
	if (out->outcome != IDEM_FIRST)
		return ops->release(txn, "idem_unit");
	if ((rc = work_and_complete(txn, id, owner, work, ctx, out)) < 0)
		goto undo;
	if (!out->stored && (rc = ops->rollback_to(txn, "idem_unit")) < 0)
		return rc;
	return ops->release(txn, "idem_unit");
undo:
	/* The transaction may already be gone (SQLite rolls back on some I/O
	 * errors); the caller rolls back the whole transaction on any error. */
	if (ops->rollback_to(txn, "idem_unit") == 0)
		ops->release(txn, "idem_unit");
	return rc;
}

void idem__count(idem_store *s, const char *type, int rc, const idem_result *out)
{
	idem__metrics_count(&s->metrics, type, rc < 0 ? IDEM_COUNT_ERROR : (int)out->outcome);
	if (rc < 0)
		idem__store_count_error(s, rc);
}

/* What one transaction of the claim protocol needs: a closure for idem__with_txn. */
typedef struct {
	const idem__key *k;
	const idem_request *req;
	idem_claim *claim; /* two-phase: its record; atomic: only the owner */
	char owner[33];
	int64_t id;
	idem_work_fn work;
	void *ctx;
	idem_result *out;
} step;

/* One unit in a transaction of its own: a closure for idem__with_txn. */
typedef struct {
	const idem__key *k;
	const idem_request *req;
	char owner[33];
	idem_work_fn work;
	void *ctx;
	idem_result *out;
} direct_unit;

/*
 * idem__run_unit without its savepoint: the unit has the transaction to
 * itself, so undoing the transaction undoes exactly the unit. Two
 * statements fewer per unit (SAVEPOINT, RELEASE: round trips on PostgreSQL
 * and MariaDB) when units run one per transaction (--batch-max 1, and a
 * group-commit batch of one).
 */
static int unit_step(idem_txn *txn, void *arg, int *undo)
{
	direct_unit *u = arg;
	int64_t id = 0;
	int rc;

	if ((rc = claim_in_txn(txn, u->k, u->req, u->owner, &id, u->out)) < 0)
		return rc;
	if (u->out->outcome != IDEM_FIRST)
		return 0;
	if ((rc = work_and_complete(txn, id, u->owner, u->work, u->ctx, u->out)) < 0)
		return rc;
	*undo = !u->out->stored;
	return 0;
}

int idem__execute_direct(idem_store *store, const idem__key *k, const idem_request *req,
                         idem_work_fn work, void *ctx, idem_result *out)
{
	direct_unit u = {k, req, "", work, ctx, out};
	int rc;

	if ((rc = idem__rand_hex(u.owner, 16)) < 0)
		return rc;
	if ((rc = idem__with_txn_undo(store, unit_step, &u, out)) == 0)
		idem__cache_after_commit(store, k, req, out);
	return rc;
}

static int begin_step(idem_txn *txn, void *arg)
{
	step *s = arg;

	return claim_in_txn(txn, s->k, s->req, s->claim->owner, &s->id, s->out);
}

int idem_claim_begin(idem_claim **out_claim, idem_result *out, idem_store *store,
                     const idem_request *req)
{
	return idem_claim_begin_with(out_claim, out, store, req, NULL, NULL);
}

typedef enum { OP_COMPLETE, OP_EXTEND, OP_ABORT } owned_op;

typedef struct {
	idem_claim *c;
	owned_op op;
	int http_status;
	const void *body;
	size_t len;
	int64_t lease_ms;
} owned;

static int owned_step(idem_txn *txn, void *arg)
{
	owned *o = arg;
	idem_claim *c = o->c;
	const idem__backend_ops *ops = txn->ops;
	int rc, changed = 0;

	if (o->op == OP_COMPLETE)
		rc = ops->rec_complete(txn, c->id, c->owner, status_for(o->http_status),
		                       o->http_status, o->body, o->len, idem_store_now(c->store),
		                       &changed);
	else if (o->op == OP_EXTEND)
		rc = ops->rec_extend(txn, c->id, c->owner, idem_store_now(c->store) + o->lease_ms,
		                     &changed);
	else
		rc = ops->rec_delete_owned(txn, c->id, c->owner, &changed);
	if (rc == 0 && !changed)
		rc = idem__error(IDEM_ELEASE, "the claim's lease was taken over");
	return rc;
}

/* Run one conditional write on the claim's own record, with retries. */
static int owned_write(idem_claim *c, owned_op op, int http_status, const void *body, size_t len,
                       int64_t lease_ms)
{
	owned o = {c, op, http_status, body, len, lease_ms};
	int rc = idem__with_txn(c->store, owned_step, &o, NULL);

	if (rc < 0 && rc != IDEM_ELEASE)
		idem__store_count_error(c->store, rc);
	return rc;
}

int idem_claim_complete(idem_claim *claim, int http_status, const void *body, size_t len)
{
	IDEM__ASSERT_ARG(claim);
	IDEM__ASSERT_ARG(body || len == 0);
	if (http_status < 100 || http_status > 599)
		return idem__error(IDEM_EINVAL, "idem_claim_complete: HTTP status %d", http_status);
	return owned_write(claim, OP_COMPLETE, http_status, body, len, 0);
}

/* The work under a savepoint: an answer not to be kept leaves only the
 * record's deletion behind, never the work's rows. */
static int finish_step(idem_txn *txn, void *arg)
{
	step *s = arg;
	idem_claim *c = s->claim;
	idem_work_fn work = s->work;
	void *ctx = s->ctx;
	idem_result *out = s->out;
	const idem__backend_ops *ops = txn->ops;
	int rc, changed = 0;

	if ((rc = ops->savepoint(txn, "idem_unit")) < 0)
		return rc;
	if ((rc = work_and_complete(txn, c->id, c->owner, work, ctx, out)) < 0)
		return rc; /* the caller rolls the transaction back */
	if (!out->stored && (rc = ops->rollback_to(txn, "idem_unit")) < 0)
		return rc;
	if ((rc = ops->release(txn, "idem_unit")) < 0)
		return rc;
	if (!out->stored) {
		rc = ops->rec_delete_owned(txn, c->id, c->owner, &changed);
		if (rc == 0 && !changed)
			rc = idem__error(IDEM_ELEASE, "the claim's lease was taken over");
	}
	return rc;
}

int idem_claim_finish(idem_result *out, idem_claim *claim, idem_work_fn work, void *ctx)
{
	step st = {NULL, NULL, claim, "", 0, work, ctx, out};
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(claim);
	IDEM__ASSERT_ARG(work);
	rc = idem__with_txn(claim->store, finish_step, &st, out);
	if (rc < 0 && rc != IDEM_ELEASE)
		idem__store_count_error(claim->store, rc);
	return rc;
}

int idem_claim_extend(idem_claim *claim, int64_t lease_ms)
{
	IDEM__ASSERT_ARG(claim);
	if (lease_ms <= 0)
		return idem__error(IDEM_EINVAL, "idem_claim_extend: lease_ms must be positive");
	return owned_write(claim, OP_EXTEND, 0, NULL, 0, lease_ms);
}

int idem_claim_abort(idem_claim *claim)
{
	if (!claim)
		return idem__error(IDEM_EINVAL, "idem_claim_abort: no claim");
	return owned_write(claim, OP_ABORT, 0, NULL, 0, 0);
}

void idem_claim_free(idem_claim *claim)
{
	free(claim);
}

int idem_record_get(idem_record_info *out, idem_store *store, const char *scope,
                    const char *business_type, const char *key, size_t key_len)
{
	idem__key k;
	idem__record rec = {0};
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(store);
	IDEM__ASSERT_ARG(scope);
	IDEM__ASSERT_ARG(business_type);
	IDEM__ASSERT_ARG(key);
	if ((rc = key_from_parts(&k, scope, business_type, key, key_len)) < 0)
		return rc;
	if ((rc = idem__rec_read(store->ops, store->be, &k, &rec)) < 0) {
		if (rc != IDEM_ENOTFOUND)
			idem__store_count_error(store, rc);
		return rc;
	}
	snprintf(out->status, sizeof(out->status), "%s", idem__status_name(rec.status));
	out->http_status = rec.http_status;
	memcpy(out->fingerprint, rec.fingerprint, sizeof(out->fingerprint));
	out->created_at_ms = rec.created_at;
	out->expires_at_ms = rec.expires_at;
	out->lease_until_ms = rec.lease_until;
	out->body = rec.body;
	out->body_len = rec.body_len;
	return 0;
}

/* ---- two-phase with business rows in the claim's transaction ---------- */

typedef struct {
	step s;
	int held; /* the claim stays PROCESSING for the caller */
} begin_with;

static int begin_with_step(idem_txn *txn, void *arg)
{
	begin_with *b = arg;
	step *s = &b->s;
	const idem__backend_ops *ops = txn->ops;
	idem_response resp = {0, NULL, 0, 1};
	int rc, changed = 0;

	b->held = 0;
	if ((rc = ops->savepoint(txn, "idem_claim")) < 0)
		return rc;
	if ((rc = claim_in_txn(txn, s->k, s->req, s->claim->owner, &s->id, s->out)) < 0)
		goto undo;
	if (s->out->outcome != IDEM_FIRST)
		return ops->release(txn, "idem_claim");
	if ((rc = s->work(txn, s->ctx, &resp)) < 0)
		goto undo;
	if (resp.http_status == 0) {
		free(resp.body);
		b->held = 1;
		return ops->release(txn, "idem_claim");
	}
	if (resp.http_status < 100 || resp.http_status > 599) {
		rc = idem__error(IDEM_EINVAL, "unit of work answered HTTP status %d",
		                 resp.http_status);
		goto undo;
	}
	if (resp.persist) {
		rc = ops->rec_complete(txn, s->id, s->claim->owner, status_for(resp.http_status),
		                       resp.http_status, resp.body, resp.body_len,
		                       idem_store_now(txn->store), &changed);
		if (rc == 0 && !changed)
			rc = idem__error(IDEM_ERETRY, "record changed during claim");
		if (rc < 0)
			goto undo;
	} else if ((rc = ops->rollback_to(txn, "idem_claim")) < 0) {
		goto undo;
	}
	s->out->http_status = resp.http_status;
	s->out->body = resp.body;
	s->out->body_len = resp.body_len;
	s->out->stored = resp.persist != 0;
	return ops->release(txn, "idem_claim");
undo:
	free(resp.body);
	if (ops->rollback_to(txn, "idem_claim") == 0)
		ops->release(txn, "idem_claim");
	return rc;
}

int idem_claim_begin_with(idem_claim **out_claim, idem_result *out, idem_store *store,
                          const idem_request *req, idem_work_fn prep, void *ctx)
{
	idem__key k;
	idem_claim *c = NULL;
	int rc;

	IDEM__ASSERT_ARG(out_claim);
	IDEM__ASSERT_ARG(out);
	*out_claim = NULL;
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(store);
	IDEM__ASSERT_ARG(req);
	if ((rc = idem__request_key(&k, req)) < 0)
		return rc;
	if ((rc = idem__fast_path(store, &k, req->fingerprint, out)) != 0)
		goto done;
	if (!(c = calloc(1, sizeof(*c)))) {
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto done;
	}
	if ((rc = idem__rand_hex(c->owner, 16)) < 0)
		goto done;
	{
		begin_with b = {{&k, req, c, "", 0, prep, ctx, out}, 1};

		/* Without prep the claim is all the transaction holds. */
		rc = prep ? idem__with_txn(store, begin_with_step, &b, out)
		          : idem__with_txn(store, begin_step, &b.s, out);
		if (rc == 0 && out->outcome == IDEM_FIRST && b.held) {
			c->store = store;
			c->id = b.s.id;
			memcpy(c->type, k.type, k.type_len + 1);
			*out_claim = c;
			c = NULL;
		} else if (rc == 0 && out->outcome == IDEM_FIRST && out->stored) {
			idem__cache_after_commit(store, &k, req, out);
		}
	}
done:
	free(c);
	if (rc > 0)
		rc = 0;
	idem__count(store, req->business_type, rc, out);
	return rc;
}

/* ---- settling a record its owner left behind -------------------------- */

int idem_record_settle(idem_txn *txn, const char *scope, const char *business_type, const char *key,
                       size_t key_len, int http_status, const void *body, size_t len, int *settled)
{
	idem__key k;
	idem__record ex = {0};
	int rc, changed = 0;

	IDEM__ASSERT_ARG(txn);
	IDEM__ASSERT_ARG(settled);
	*settled = 0;
	IDEM__ASSERT_ARG(scope);
	IDEM__ASSERT_ARG(business_type);
	IDEM__ASSERT_ARG(key);
	IDEM__ASSERT_ARG(body || len == 0);
	if (http_status < 100 || http_status > 599)
		return idem__error(IDEM_EINVAL, "idem_record_settle: HTTP status %d", http_status);
	if ((rc = key_from_parts(&k, scope, business_type, key, key_len)) < 0)
		return rc;
	if ((rc = idem__rec_get(txn, &k, &ex)) == IDEM_ENOTFOUND)
		return 0;
	if (rc < 0)
		return rc;
	if (ex.status == IDEM__ST_PROCESSING && ex.lease_until <= idem_store_now(txn->store)) {
		rc = txn->ops->rec_complete(txn, ex.id, ex.owner, status_for(http_status),
		                            http_status, body, len, idem_store_now(txn->store),
		                            &changed);
		*settled = rc == 0 && changed;
	}
	idem__record_clear(&ex);
	return rc;
}
