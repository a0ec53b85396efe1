/*
 * pay/internal.h: what the payment domain's files share: the handle, JSON
 * answers and input checks, ids and times, the ledger, and the request
 * pipeline every write goes through (validate, fingerprint, claim, run).
 * Each section names the file that defines it. Calls between the files go
 * down, never back up (scripts/check-layers.py): pay.c, the handle's
 * lifecycle, calls what it starts and nothing calls it; the sweeper sits on
 * the status moves of chanpay.c and refunds.c; the request files (payments,
 * refunds, transfers, notifications, reads, recon, admin) on the channel
 * flows, the saga, the pipeline and the shard routing; at the bottom is what
 * they all share: answers, input, the ledger, the payment row (payment.c),
 * a transfer's decision (transfer.c), channel configuration (chanconfig.c),
 * the pool and the ticker.
 */
#ifndef IDEM_PAY_INTERNAL_H
#define IDEM_PAY_INTERNAL_H

#include <jansson.h>
#include <pthread.h>

#include "idem/idem.h"

typedef struct pay__authcache pay__authcache;
typedef struct pay__chanstate pay__chanstate; /* pay/chanclient.c */
typedef struct pay__pool pay__pool;           /* pay/chanpool.c */
typedef struct pay__sweeper pay__sweeper;     /* pay/sweeper.c */
typedef struct pay__dir pay__dir;             /* pay/shards.c */
typedef struct pay__saga pay__saga;           /* pay/saga.c */

struct idem_pay {
	idem_store *store;
	idem_pay_opts opts;
	pay__authcache *auth; /* NULL: every request reads the key from the store */
	pthread_mutex_t channels_lock;
	pthread_cond_t idle; /* signalled when two_phase drops to 0 */
	int two_phase;       /* two-phase requests running on threads of their own */
	int nchannels;       /* channels known to exist (they are never removed) */
	char channels[64][IDEM_PAY_CHANNEL_MAX + 1];
	int has_secret_key;           /* channel secrets are sealed at rest */
	unsigned char secret_key[32]; /* AES-256-GCM key (util/secretbox.h) */
	pay__chanstate *chans;        /* connected channels: config cache, counters */
	pthread_mutex_t pool_lock;
	pay__pool *pool;       /* channel workers, started at the first call */
	pay__sweeper *sweeper; /* NULL unless idem_pay_sweeper_start */
	char public_url[512];  /* opts.public_url, copied ("" when none) */
	/* Sharding by merchant (pay/shards.c, docs/scaling.md). A router has
	 * nshards > 0 and one plain handle per shard; store is shard 0's. A
	 * shard knows its router and number; a plain handle is shard 0 alone. */
	int nshards;
	idem_pay **shards;
	pay__dir *dir;    /* the router's cache of merchant -> shard */
	idem_pay *router; /* a shard's router; NULL for a router or plain handle */
	int shard;        /* this handle's shard number (ids and key ids carry it) */
	pay__saga *saga;  /* the router's transfer driver (NULL: none runs) */
};

/* ---- channels as configured (chanconfig.c; pay/channel.h has the calls) ---- */

/* Room for a channel secret as stored: plain, or sealed (util/secretbox.h). */
#define PAY__STORED_SECRET_SIZE 256
/* The secret as it is to be stored for channel: sealed when a key is set. */
int pay__secret_seal(idem_pay *pay, const char *channel, const char *secret,
                     char out[PAY__STORED_SECRET_SIZE]);
/* Whether channel exists: from memory, else from the store (inside txn). */
int pay__channel_exists(idem_pay *pay, idem_txn *txn, const char *name, int *exists);

/* ---- what the handle starts and stops (pay.c) ---- */

/* Connected channels' configuration cache and counters (chanclient.c), one
 * for a router and its shards: NULL when out of memory; free takes NULL. */
pay__chanstate *pay__chanstate_new(void);
void pay__chanstate_free(pay__chanstate *s);
/* Stop the sweeper thread, if one runs (sweeper.c). */
void pay__sweeper_stop(idem_pay *pay);
/* Stop the transfer driver, if one runs (saga.c). */
void pay__saga_stop(idem_pay *pay);

/* ---- background threads (ticker.c): the sweeper's and the saga's ---- */

/*
 * A thread running fn(arg) every interval_ms: first at once when run_first,
 * else after one interval. A kick runs the next pass at once; stop waits
 * for a pass under way and frees t.
 */
typedef struct pay__ticker pay__ticker;
typedef void (*pay__tick_fn)(void *arg);
int pay__ticker_start(pay__ticker **out, int64_t interval_ms, int run_first, pay__tick_fn fn,
                      void *arg);
void pay__ticker_kick(pay__ticker *t);
void pay__ticker_stop(pay__ticker *t);

/* ---- the cache of verified API keys (authcache.c) ---- */

/* An empty cache: NULL when out of memory; free takes NULL. */
pay__authcache *pay__authcache_new(void);
void pay__authcache_free(pay__authcache *c);
/* 1 and merchant set when digest was verified less than the TTL ago. */
int pay__authcache_get(pay__authcache *c, const char digest[65], int64_t now,
                       char merchant[IDEM_PAY_ID_SIZE]);
/* Remember that the store confirmed digest as merchant's key at now. */
void pay__authcache_put(pay__authcache *c, const char digest[65], int64_t now,
                        const char *merchant);
/* Drop every entry of merchant (its key was rotated here). */
void pay__authcache_forget(pay__authcache *c, const char *merchant);
/*
 * Whether two 64-hex-digit key digests are equal, in time that does not
 * depend on where they differ (CRYPTO_memcmp over all 64 bytes). The one
 * way digests are compared (tests/security/test_constant_time.py checks).
 */
int pay__digest_equal(const char a[64], const char b[64]);

/* ---- answers (answer.c) ---- */

/* Set resp to status with obj serialised compactly (obj is not consumed). */
int pay__json(idem_response *resp, int status, json_t *obj);
/* Set resp to a problem+json body. */
int pay__problem(idem_response *resp, int status, const char *code, const char *detail);
/* A read's answer: 200 with obj (consumed; NULL means out of memory). */
int pay__read_answer(idem_result *out, json_t *obj);
/* An answer given before any claim (validation): FIRST, not stored. */
int pay__reject(idem_result *out, int status, const char *code, const char *detail);
/*
 * The stated arguments of an async write (idem_pay_*_async, named func):
 * 1 when pay, rq and done are there. Otherwise 0, the error detail naming
 * the first missing one as IDEM__ASSERT_ARG does, and done (when there is
 * one) answered once with IDEM_EINVAL and an empty result.
 */
int pay__async_args(const char *func, const idem_pay *pay, const idem_pay_request *rq,
                    idem_done_fn done, void *done_ctx);

/* ---- input (input.c) ---- */

typedef enum { F_STRING, F_INT, F_OBJECT } pay__ftype;

/* What a present field's value must be; each has one message. */
typedef enum {
	V_ANY,
	V_NATURAL_KEY,   /* 1..64 of A-Z a-z 0-9 _ - . (idem_natural_key_validate) */
	V_ID,            /* an id of ours: the same syntax, "is malformed" */
	V_AMOUNT,        /* 1..10^15 minor units */
	V_CURRENCY,      /* three upper-case letters */
	V_CHANNEL,       /* a channel name: 1..32 of a-z 0-9 _ - */
	V_TEXT255,       /* at most 255 bytes */
	V_NOTIFY_STATUS, /* SUCCESS, FAILED or CLOSED */
} pay__rule;

/*
 * One member of a write request's body: its type, whether it must be there,
 * its rule, and whether it is the natural key (the idempotency key when no
 * Idempotency-Key header came; required either way). A request's fields are
 * one table, checked in its order.
 */
typedef struct {
	const char *name;
	pay__ftype type;
	int required;
	pay__rule rule;
	int natural;
} pay__field;

/*
 * Parse a write request's body as a JSON object whose members are all in
 * fields, of the right types, with the required ones present; a malformed
 * Idempotency-Key is rejected after the JSON syntax and before the fields
 * (the documented order of checks). Then the natural key: absent with no
 * Idempotency-Key, 400 missing_idempotency_key; then each present field's
 * rule, in table order. On failure *doc is NULL and out holds the 400
 * answer; returns 0 either way, negative only on a hard error.
 */
int pay__parse_request(json_t **doc, idem_result *out, const idem_pay_request *rq,
                       const pay__field *fields, size_t nfields);

/* op->fp from the parsed body, without parsing it again. */
int pay__fingerprint(char out[IDEM_FINGERPRINT_LEN + 1], const idem_pay_request *rq, json_t *doc);

/* Member helpers: NULL / 0 when absent. */
const char *pay__str(json_t *doc, const char *name);
int64_t pay__int(json_t *doc, const char *name);

/* The checks behind V_AMOUNT, V_CURRENCY and V_CHANNEL, also for input from
 * elsewhere (reconciliation files, channel names in admin calls): 1 valid. */
int pay__valid_amount(int64_t amount);
int pay__valid_currency(const char *s);
int pay__valid_channel_name(const char *s);

/* ---- ids and time (input.c; the shard in an id: shards.c) ---- */

/*
 * A new id for a row of shard: prefix + 32 hex digits on shard 0, prefix +
 * "s" + three decimal digits of the shard + 28 hex digits on another
 * (pay/shards.c). The hex digits begin with 12 of the wall clock's
 * milliseconds, the rest random (80 bits on shard 0, 64 on another): ids
 * made one after the other sort one after the other, so a batch's new rows
 * land on the last leaf of each id index (one page written, not one per
 * row; InnoDB clusters the table itself on it) instead of on random ones.
 */
int pay__new_id(char out[IDEM_PAY_ID_SIZE], const char *prefix, int shard);
/* The shard an id of ours names (0 when it names none); -1 for no id. */
int pay__id_shard(const char *id);
/* An API key id for pay's shard: 16 hex digits on shard 0, else "s" + the
 * shard's three digits + 12 hex digits (16 characters either way). */
int pay__new_key_id(const idem_pay *pay, char out[17]);
/* The store's clock, in ms (idem_store_now). */
int64_t pay__now(const idem_pay *pay);
/* RFC 3339 UTC with milliseconds. */
void pay__time(char out[32], int64_t ms);

/* ---- shards (shards.c) ---- */

/*
 * The handle merchant's requests go to: pay itself when it is not a router,
 * else the shard the directory names (from memory, else one read on shard
 * 0). A merchant the directory does not know goes to shard 0, which answers
 * for it as for any unknown merchant. Negative: the directory read failed,
 * or names a shard not configured (IDEM_ESTORE).
 */
int pay__route(idem_pay *pay, const char *merchant, idem_pay **out);
/* pay__route for an async write: NULL after answering done with the error. */
idem_pay *pay__route_async(idem_pay *pay, const char *merchant, idem_done_fn done, void *done_ctx);
/* A notification's shard: the one its body's payment_id names (shard 0 when
 * the body names none, which then answers it as malformed or unknown). */
idem_pay *pay__route_notify(idem_pay *pay, const idem_pay_request *rq);
/* The directory's shard of merchant (*found 0 when it has none). Router only. */
int pay__dir_lookup(idem_pay *pay, const char *merchant, int *shard, int *found);
/* Remember merchant -> shard (a merchant never moves). */
void pay__dir_remember(idem_pay *pay, const char *merchant, int shard);
/* Write the directory row (merchant, shard) in txn (shard 0's store). */
int pay__dir_insert(idem_txn *txn, const char *merchant, int shard, int64_t now);
/* Copy channel name's row from shard 0 to every other shard (all: name NULL). */
int pay__channels_sync(idem_pay *router, const char *name);
/* A router's empty directory cache (NULL: out of memory); free: NULL is fine. */
pay__dir *pay__dir_new(void);
void pay__dir_free(pay__dir *d);

/* ---- the ledger (ledger.c) ---- */

/*
 * Serialise every balance-changing unit of one merchant: a conditional write
 * on its row holds the row lock (PostgreSQL, MariaDB) until the transaction
 * ends; SQLite has one writer anyway. Returns IDEM_ENOTFOUND for no merchant.
 */
int pay__lock_merchant(idem_txn *txn, const char *merchant, int64_t now);
/* The merchant's balance in currency (0 when none). Call under the lock. */
int pay__balance(idem_txn *txn, const char *merchant, const char *currency, int64_t *out);
/*
 * Whether crediting amount keeps the balance within int64 (*fits 1), under
 * the lock: ask before the unit writes anything, and answer a refusal with
 * pay__overflow_problem. pay__post refuses a credit that does not fit with
 * IDEM_ECONSTRAINT (a unit that skipped the check fails, nothing is kept).
 */
int pay__credit_fits(idem_txn *txn, const char *merchant, const char *currency, int64_t amount,
                     int *fits);
/* The stored answer for a refused credit: 409 balance_overflow. */
int pay__overflow_problem(idem_response *resp);
/* Post amount (signed) to the balance and the ledger, under the lock. */
int pay__post(idem_txn *txn, const char *merchant, const char *currency, int64_t amount,
              const char *kind, const char *ref, int64_t now);

/* ---- the pipeline (pipeline.c) ---- */

/*
 * One write request on its way through the pipeline. Work functions get it
 * as their ctx and read pay, rq, doc and fp; the rest is the pipeline's.
 * It lives from idem_pay_*_async until done has been called.
 */
typedef struct {
	idem_pay *pay;
	const idem_pay_request *rq; /* &rq_copy: the strings stay the caller's */
	json_t *doc;                /* the parsed body */
	char fp[IDEM_FINGERPRINT_LEN + 1];

	idem_pay_request rq_copy;
	idem_request req;
	int backstop;    /* a 200 from the work is a backstop replay */
	idem_result res; /* an answer given before any claim */
	idem_done_fn done;
	void *done_ctx;
	idem_work_fn work; /* two phases: run on a thread of its own */
	void (*before_work)(idem_pay *pay);
	int to_shard; /* a transfer between shards: the payee's */
	/* What a route made before its unit runs, off the writer thread (a new
	 * payment's id, time and answer); freed with op by prep_free. */
	void *prep;
	void (*prep_free)(void *prep);
} pay__op;

/* A new op for rq, or NULL after calling done with IDEM_ENOMEM. */
pay__op *pay__op_new(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done, void *done_ctx);

/* Free op without answering (a _nowait call that would wait): IDEM_EWOULDBLOCK. */
int pay__op_drop(pay__op *op);

/* Answer with op->res (validation) or error rc, and free op. */
void pay__finish(pay__op *op, int rc);
/* Answer with a claim's result (duplicates get their problem bodies), free op. */
void pay__op_done(pay__op *op, int rc, idem_result *res);
/*
 * The channel has answered (or the call ended unknown): what the request
 * writes from here (the completion, or the abort that lets a retry take
 * over) runs under a deadline of its own, from now, never the remains of
 * the request's: the channel call has its own timeout, and money it moved
 * must be recorded, not cut off because the call took the request's time.
 */
void pay__after_channel(idem_pay *pay);
/* Fill op->req for (caller, type, key or natural) as pay__start does. */
void pay__op_request(pay__op *op, const char *type, const char *natural, int64_t ttl_ms,
                     int backstop);

/*
 * Claim (caller, business_type, key) and run work, where key is the
 * Idempotency-Key or natural. Atomically through the group-commit queue, or
 * in two phases when before_work is set (it runs between the committed claim
 * and the work, outside any transaction: the call to the channel). Answers
 * through op->done and frees op. backstop: see pay__op.
 */
void pay__start(pay__op *op, const char *type, const char *natural, int64_t ttl_ms,
                idem_work_fn work, void (*before_work)(idem_pay *pay), int backstop);

/*
 * pay__start's atomic path for a caller that must not wait
 * (idem_execute_async_nowait): 0 when started, or IDEM_EWOULDBLOCK with op
 * freed and nothing answered.
 */
int pay__start_nowait(pay__op *op, const char *type, const char *natural, int64_t ttl_ms,
                      idem_work_fn work, int backstop);

/* The synchronous form of an async write: wait for its answer. */
typedef void (*pay__async_fn)(idem_pay *, const idem_pay_request *, idem_done_fn, void *);
int pay__wait(idem_result *out, idem_pay *pay, const idem_pay_request *rq, pay__async_fn fn);

/* ---- transfers: what transfers.c calls below it (saga.c, transfer.c) ---- */

/*
 * A transfer to a merchant on another shard, step 1 of the saga (saga.c):
 * in the request's unit on the payer's shard, debit the payer and write the
 * outbox row; answers 202 "pending". The driver does the rest.
 */
int pay__saga_debit(idem_txn *txn, pay__op *c, const char *to, int to_shard, idem_response *resp);

/* A transfer as its answer shows it: a row of transfers (transfers.c) or of
 * transfer_outbox (saga.c). What both share is in transfer.c. */
typedef struct {
	char id[IDEM_PAY_ID_SIZE], no[72], from[IDEM_PAY_ID_SIZE], to[IDEM_PAY_ID_SIZE];
	char currency[8], status[16], fp[IDEM_FINGERPRINT_LEN + 1];
	int64_t amount, created_at;
	int to_shard; /* transfer_outbox only */
	int found;
} pay__transfer_row;

/* The transfer's API object as the answer, with HTTP status. */
int pay__transfer_answer(idem_response *resp, int status, const pay__transfer_row *t);

/*
 * The debit's decision, local or the saga's, taken under the payer's lock
 * with t read by (payer, transfer_no): 1 and resp set when that is the
 * answer (t found: 200 with it when its fingerprint is fp, else 409
 * business_key_conflict naming it; the payer's balance in currency below
 * amount: 409 insufficient_balance); 0 to go on and write the transfer;
 * negative on error.
 */
int pay__transfer_check(idem_txn *txn, const pay__transfer_row *t, const char *fp,
                        const char *payer, const char *currency, int64_t amount,
                        idem_response *resp);

/* ---- row access (input.c) ---- */

/* Copy a text column into out (size n); "" for NULL. */
void pay__col_text(char *out, size_t n, const idem_value *col);

#endif
