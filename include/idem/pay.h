/*
 * idem/pay.h: the payment domain on top of the idempotency engine:
 * merchants and their API keys, channels and their signing secrets,
 * payments with their state machine, channel notifications, refunds,
 * transfers between merchants and the ledger behind balances.
 *
 * Every mutation is one unit of work claimed through idem_execute (or two
 * phases when the channel is slow), so a request that arrives again gets the
 * first answer back. Answers are HTTP-shaped (status + JSON body) because the
 * stored response is exactly what a retry must receive; the HTTP server only
 * frames them. Nothing here prints or reads the environment.
 */
#ifndef IDEM_PAY_H
#define IDEM_PAY_H

#include "claim.h"
#include "common.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct idem_pay idem_pay;

#define IDEM_PAY_OPTS_VERSION 2

typedef struct {
	unsigned int version;        /* IDEM_PAY_OPTS_VERSION */
	int64_t ttl_ms;              /* idempotency record retention (default 24 h) */
	int64_t notification_ttl_ms; /* for channel callbacks (default 72 h, never less) */
	int mock_channel_delay_ms;   /* > 0: the mock channel answers after this long,
	                                and payments on it run in two phases */
	/* Connected channels (CHANNEL.md), since version 2: */
	int channel_workers;    /* threads making channel calls (default 8) */
	int channel_queue;      /* calls waiting for one before 503 (default 1024) */
	const char *public_url; /* this service's base URL as channels reach it, for
	                           notify_url (copied; NULL: no notify_url sent) */
} idem_pay_opts;

#define IDEM_PAY_OPTS_INIT                                                                         \
	{                                                                                          \
		IDEM_PAY_OPTS_VERSION, 24LL * 3600 * 1000, 72LL * 3600 * 1000, 0, 8, 1024, NULL    \
	}

/* Sizes of the identifiers handed out (including the NUL). */
#define IDEM_PAY_ID_SIZE     40 /* "m_…", "pay_…", "re_…", "tr_…" */
#define IDEM_PAY_SECRET_SIZE 96 /* API keys and channel secrets */
#define IDEM_PAY_CHANNEL_MAX 32

/*
 * Attach the payment domain to an open store (whose schema includes the
 * payment tables). store is borrowed and must outlive the handle.
 */
IDEM_EXTERN int idem_pay_open(idem_pay **out, idem_store *store, const idem_pay_opts *opts);
IDEM_EXTERN void idem_pay_close(idem_pay *pay);

/*
 * Sharding by merchant (docs/scaling.md, "Sharding"): one handle over n
 * stores (1..1000; any backends), shard i being stores[i]. A merchant lives
 * on one shard, chosen at creation by idem_pay_shard_of and recorded in the
 * directory on shard 0; every request is one transaction on its merchant's
 * shard. The order of the stores is the shard numbering: new stores are
 * appended, never reordered. n == 1 is idem_pay_open. The stores are
 * borrowed and must outlive the handle.
 */
IDEM_EXTERN int idem_pay_open_shards(idem_pay **out, idem_store *const *stores, int n,
                                     const idem_pay_opts *opts);
/* The shard a merchant created now among nshards goes to: SHA-256 of its id,
 * the first 8 bytes big-endian, modulo nshards. */
IDEM_EXTERN int idem_pay_shard_of(const char *merchant_id, int nshards);
/* Number of shards (1 for a handle on one store); IDEM_EINVAL for NULL. */
IDEM_EXTERN int idem_pay_shard_count(const idem_pay *pay);
/* The shard merchant lives on (from the directory); IDEM_ENOTFOUND when it
 * has none. Always 0 for a handle on one store. */
IDEM_EXTERN int idem_pay_merchant_shard(idem_pay *pay, const char *merchant_id, int *shard);
/* Shard i's own handle (borrowed; NULL when out of range or pay is NULL). */
IDEM_EXTERN idem_pay *idem_pay_shard(idem_pay *pay, int i);

/*
 * Transfers between shards (a saga: debit with the request, then the
 * payee's credit under a claim of its own, then the outbox row settles; a
 * credit that cannot be made is reversed to the payer). One pass over every
 * shard's pending rows: *settled counts rows that settled (settled may be
 * NULL). 0 and nothing done for a handle on one store.
 */
IDEM_EXTERN int idem_pay_transfers_drive(idem_pay *pay, int *settled);
/*
 * Drive them every interval_ms (and at once after a new one) on a thread of
 * its own, until close. step_delay_ms > 0 waits that long between a credit
 * and the settling of its row (for tests that kill the process in between).
 */
IDEM_EXTERN int idem_pay_transfer_driver_start(idem_pay *pay, int64_t interval_ms,
                                               int64_t step_delay_ms);

/*
 * Create a merchant. id_out receives "m_…", key_out the API key ("sk_…"),
 * shown this once: only its SHA-256 digest is stored.
 * Returns 0; IDEM_EINVAL for a name that is not 1..100 bytes of printable UTF-8.
 */
IDEM_EXTERN int idem_pay_merchant_add(idem_pay *pay, const char *name,
                                      char id_out[IDEM_PAY_ID_SIZE],
                                      char key_out[IDEM_PAY_SECRET_SIZE]);

/*
 * Create a channel named name (1..32 of [a-z0-9_-]); secret_out receives its
 * signing secret. The secret itself is stored (verifying an HMAC needs it):
 * sealed when a secret key is set (idem_pay_set_secret_key), else as is.
 * Returns 0; IDEM_EINVAL for a bad name; IDEM_ECONFLICT when it exists.
 */
IDEM_EXTERN int idem_pay_channel_add(idem_pay *pay, const char *name,
                                     char secret_out[IDEM_PAY_SECRET_SIZE]);

/*
 * Connect channel name (created with idem_pay_channel_add): payments and
 * refunds on it are then sent to base_url (http:// or https://, no query)
 * per CHANNEL.md, each call given timeout_ms (1..600000). base_url NULL
 * disconnects it (it then only receives notifications). IDEM_ENOTFOUND for
 * no such channel, IDEM_EINVAL for a bad URL or timeout.
 */
IDEM_EXTERN int idem_pay_channel_connect(idem_pay *pay, const char *name, const char *base_url,
                                         int64_t timeout_ms);

/*
 * The sweeper (CHANNEL.md): resolve payments and refunds left 'creating'
 * for longer than age_ms (the client never came back, or an instance died
 * mid-call) by querying the channel; an order the channel does not have is
 * closed there before the payment is marked failed. One pass: at most one
 * instance sweeps at a time, by a lease row in the store; *ran is 0 when
 * another instance holds it. *resolved counts what was settled.
 */
IDEM_EXTERN int idem_pay_sweep(idem_pay *pay, int64_t age_ms, int *ran, int *resolved);
/* Run idem_pay_sweep every interval_ms on a thread of its own, until close. */
IDEM_EXTERN int idem_pay_sweeper_start(idem_pay *pay, int64_t interval_ms, int64_t age_ms);

/*
 * The channel and sweeper counters in Prometheus text format
 * (idem_channel_calls_total, idem_channel_queue_depth,
 * idem_sweeper_runs_total, idem_sweeper_resolved_total). *out is malloc'd.
 */
IDEM_EXTERN int idem_pay_metrics_text(idem_pay *pay, char **out, size_t *len);

/*
 * Keep channel secrets sealed at rest with key (32 bytes; AES-256-GCM, the
 * channel name as associated data): secrets written from now on are sealed,
 * sealed ones are opened with it, plain ones (written before) still verify.
 * The key is checked against a stored sealed secret: IDEM_EINVAL when it
 * does not open it (a wrong key). key NULL: no key, and IDEM_EINVAL when a
 * secret is sealed (one is needed). The key is copied.
 */
IDEM_EXTERN int idem_pay_set_secret_key(idem_pay *pay, const unsigned char key[32]);

/*
 * Read a secret key file: 32 bytes, or 64 hex digits and an optional newline
 * (`openssl rand -hex 32 > key`). IDEM_EINVAL, with a message naming the
 * file, when it is unreadable, malformed, not a regular file, or open to its
 * group or others (it must be chmod 600 or stricter).
 */
IDEM_EXTERN int idem_pay_secret_key_read(const char *path, unsigned char key[32]);

/* Number of merchants (for a first-run check). NULL pay or out: IDEM_EINVAL. */
IDEM_EXTERN int idem_pay_merchant_count(idem_pay *pay, int64_t *out);

/*
 * Find the merchant an API key belongs to; the digest is compared in
 * constant time. Returns 0 with id_out set; IDEM_ENOTFOUND when the key is
 * unknown or malformed (a NULL api_key too); IDEM_EINVAL for a NULL pay or
 * id_out; a store error otherwise.
 */
IDEM_EXTERN int idem_pay_authenticate(idem_pay *pay, const char *api_key, size_t len,
                                      char id_out[IDEM_PAY_ID_SIZE]);

/*
 * idem_pay_authenticate from memory alone, for a caller that must never
 * wait (an HTTP event thread): the cache of keys the store confirmed in
 * the last 10 s. Never touches the store and never blocks but on a short
 * in-memory lock.
 *   pay      the handle (a router asks the shard the key names)
 *   api_key  the key's bytes, len of them (a NUL is one of them)
 *   id_out   the merchant on a hit; "" otherwise
 * Returns 1 with id_out set when the key is a verified one; 0 when memory
 * cannot say (not cached, expired, no cache): call idem_pay_authenticate,
 * which may read the store; IDEM_ENOTFOUND when the key is malformed (or
 * NULL), which no lookup would find either; IDEM_EINVAL for a NULL pay or
 * id_out.
 */
IDEM_EXTERN int idem_pay_authenticate_cached(idem_pay *pay, const char *api_key, size_t len,
                                             char id_out[IDEM_PAY_ID_SIZE]);

/*
 * Check X-Signature (hex HMAC-SHA256 of body with the channel's secret),
 * in constant time. 0 when valid; IDEM_ENOTFOUND when the channel is
 * unknown or the signature wrong (a NULL channel or sig is a wrong
 * signature); IDEM_EINVAL for a NULL pay, or a NULL body with len > 0; a
 * store error otherwise.
 */
IDEM_EXTERN int idem_pay_verify_signature(idem_pay *pay, const char *channel, const char *sig,
                                          size_t sig_len, const void *body, size_t len);

/* One write request, as the HTTP layer hands it over. Borrowed for the call. */
typedef struct {
	const char *caller; /* merchant id, or the channel name for notifications */
	const char *key;    /* Idempotency-Key (validated); NULL: use the natural key */
	size_t key_len;
	int key_invalid;    /* the header was present but malformed: 400 after the
	                       JSON syntax check (docs/api-notes.md order of checks) */
	const char *method; /* for the fingerprint: "POST" */
	const char *path;   /* for the fingerprint: "/v1/payments" */
	const char *body;   /* the raw JSON body */
	size_t body_len;
} idem_pay_request;

/*
 * The write operations. Each answers through out: the outcome (FIRST,
 * REPLAY, IN_PROGRESS, MISMATCH), the HTTP status and the exact body (a
 * problem+json body for errors). Validation failures are answered as FIRST
 * with stored = 0. A negative return is a store failure with nothing
 * committed: answer 503, never a duplicate.
 */
IDEM_EXTERN int idem_pay_create_payment(idem_result *out, idem_pay *pay,
                                        const idem_pay_request *rq);
IDEM_EXTERN int idem_pay_notify(idem_result *out, idem_pay *pay, const idem_pay_request *rq);
IDEM_EXTERN int idem_pay_refund(idem_result *out, idem_pay *pay, const idem_pay_request *rq);
IDEM_EXTERN int idem_pay_transfer(idem_result *out, idem_pay *pay, const idem_pay_request *rq);

/*
 * The same without blocking the caller: done gets (rc, result) exactly once,
 * possibly before the call returns (validation errors, duplicates answered
 * from the cache or a read), otherwise on a group-commit writer thread after
 * the COMMIT returned. rq's strings must stay valid until done was called.
 * A NULL pay or rq: done(done_ctx, IDEM_EINVAL, an empty result), once; a
 * NULL done: nothing runs.
 */
IDEM_EXTERN void idem_pay_create_payment_async(idem_pay *pay, const idem_pay_request *rq,
                                               idem_done_fn done, void *done_ctx);
IDEM_EXTERN void idem_pay_notify_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                                       void *done_ctx);
IDEM_EXTERN void idem_pay_refund_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                                       void *done_ctx);
IDEM_EXTERN void idem_pay_transfer_async(idem_pay *pay, const idem_pay_request *rq,
                                         idem_done_fn done, void *done_ctx);

/*
 * idem_pay_create_payment_async for a thread that must never wait (an HTTP
 * event thread): the body is checked and hashed here, and the payment is
 * answered from the front cache or queued for its group-commit writer
 * without the read before the write (idem_execute_async_nowait). Returns
 * IDEM_EWOULDBLOCK, with nothing done and done not called, when it cannot
 * start so: a router (idem_pay_open_shards), a connected channel, or
 * whatever idem_execute_async_nowait refuses; make
 * the same request with idem_pay_create_payment_async from a thread that
 * may wait then. Otherwise 0, and done is called exactly once, as by the
 * _async call (before return for a bad request or a cached answer).
 */
IDEM_EXTERN int idem_pay_create_payment_nowait(idem_pay *pay, const idem_pay_request *rq,
                                               idem_done_fn done, void *done_ctx);

/*
 * The replay shortcut alone, without waiting: answers rq only when the
 * front cache holds its exact bytes (method, path, body) under its
 * Idempotency-Key, which the full path keeps after it answered those bytes
 * from a stored record (docs/api-notes.md, "Points decided"). Payments and
 * refunds with a valid Idempotency-Key only. Never touches the store, never
 * parses the body, never blocks but on a short in-memory lock; a router
 * (idem_pay_open_shards) answers nothing here.
 *   out  on 1, the REPLAY (stored status and body, owned by the caller:
 *        idem_result_clear); on 0, empty
 *   pay  the handle; rq the request, borrowed for the call
 * Returns 1 when answered; 0 when not (no hit, other bytes, another
 * route, no key, out of memory): nothing was done, and the request is to
 * be made with the matching idem_pay_*_async call, whose answer it gives.
 * IDEM_EINVAL for a NULL out, pay or rq.
 */
IDEM_EXTERN int idem_pay_try_replay(idem_result *out, idem_pay *pay, const idem_pay_request *rq);

/*
 * Reads, scoped to merchant. Answer through out (outcome FIRST, stored 0):
 * 200 with the JSON object, 404 problem when absent or another merchant's.
 */
IDEM_EXTERN int idem_pay_get_payment(idem_result *out, idem_pay *pay, const char *merchant,
                                     const char *id);
IDEM_EXTERN int idem_pay_find_payment(idem_result *out, idem_pay *pay, const char *merchant,
                                      const char *merchant_order_no);
IDEM_EXTERN int idem_pay_get_balance(idem_result *out, idem_pay *pay, const char *merchant);
IDEM_EXTERN int idem_pay_get_record(idem_result *out, idem_pay *pay, const char *merchant,
                                    const char *business_type, const char *key, size_t key_len);

/*
 * A problem+json body (RFC 9457) with a stable code: out receives a malloc'd,
 * NUL-terminated body. extra_name/extra_value add one string member (NULL:
 * none). Returns 0 or IDEM_ENOMEM.
 */
IDEM_EXTERN int idem_pay_problem(char **out, size_t *len, int status, const char *code,
                                 const char *detail, const char *extra_name,
                                 const char *extra_value);

#ifdef __cplusplus
}
#endif
#endif
