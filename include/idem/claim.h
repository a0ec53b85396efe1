/*
 * idem/claim.h: claiming an idempotency key and answering duplicates.
 *
 * A claim is decided by an INSERT into the composite UNIQUE index
 * (scope, business_type, key), never by a read: a read before the INSERT may
 * answer a duplicate of a completed request (completed records are
 * immutable), but finding nothing decides nothing.
 *
 * Two ways to run a request:
 *  - atomic (idem_execute): claim, business writes and completion in one
 *    transaction. Nothing PROCESSING is ever committed.
 *  - two-phase (idem_claim_begin / _complete / _abort): the claim commits
 *    PROCESSING with a lease, for work that calls outside the database.
 *
 * NULL handle or required pointer: IDEM_EINVAL (idem/common.h). An out
 * result that is given is cleared first, so it may be cleared after any error.
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

#include "common.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a claim found. Not errors: every one is a correct answer. */
typedef enum {
	IDEM_FIRST = 1,       /* the INSERT won (or took over an expired record): execute */
	IDEM_REPLAY = 2,      /* completed with the same fingerprint: answer the stored response */
	IDEM_IN_PROGRESS = 3, /* PROCESSING under a live lease: answer 409 + Retry-After */
	IDEM_MISMATCH = 4,    /* the key was used with another fingerprint: answer 422 */
} idem_outcome;

#define IDEM_OUTCOME_COUNT 4

/* Stable lower-case name: "first", "replay", "in_progress", "mismatch". */
IDEM_EXTERN const char *idem_outcome_name(idem_outcome o);

/* Limits on the parts of a key. */
#define IDEM_SCOPE_MAX       128
#define IDEM_TYPE_MAX        64
#define IDEM_KEY_MAX         255
#define IDEM_FINGERPRINT_LEN 64 /* lower-case hex SHA-256 */

#define IDEM_REQUEST_VERSION 1

/* One request to claim. All strings are borrowed for the call. */
typedef struct {
	unsigned int version;      /* IDEM_REQUEST_VERSION */
	const char *scope;         /* merchant or channel id: 1..128 bytes of 0x21..0x7E */
	const char *business_type; /* 1..64 bytes of [a-z0-9_] */
	const char *key;           /* the idempotency key: see idem_key_validate */
	size_t key_len;
	const char *fingerprint; /* 64 lower-case hex chars (idem_fingerprint) */
	int64_t ttl_ms;          /* retention; 0: the store's default */
	int64_t lease_ms;        /* two-phase lease; 0: the store's default */
} idem_request;

#define IDEM_REQUEST_INIT                                                                          \
	{                                                                                          \
		IDEM_REQUEST_VERSION, NULL, NULL, NULL, 0, NULL, 0, 0                              \
	}

/* The answer for one request. */
typedef struct {
	idem_outcome outcome;
	int http_status;     /* REPLAY, and FIRST after the work: the response status */
	unsigned char *body; /* owned; free with idem_result_clear */
	size_t body_len;
	int stored;             /* FIRST: 1 when the response was committed with the record */
	int64_t retry_after_ms; /* IN_PROGRESS: time left on the holder's lease */
	int64_t expires_at_ms;  /* FIRST (stored), REPLAY, MISMATCH: the record's expiry */
} idem_result;

/* Free what a result owns and zero it. NULL is accepted. */
IDEM_EXTERN void idem_result_clear(idem_result *res);

/* What a unit of work answers. */
typedef struct {
	int http_status;     /* 100..599 */
	unsigned char *body; /* malloc'd; the library takes ownership */
	size_t body_len;
	int persist; /* 1 (default): store it; 0: roll the unit back, answer once */
} idem_response;

/*
 * Set resp's status and a copy of body (NULL when len is 0). Returns 0,
 * IDEM_EINVAL, or IDEM_ENOMEM. Replaces (and frees) a body set before.
 */
IDEM_EXTERN int idem_response_set(idem_response *resp, int http_status, const void *body,
                                  size_t len);

/*
 * The unit of work: business writes through txn (idem_txn_exec/_query), then
 * fill resp. Return 0 to commit the unit with the record completed (status
 * SUCCEEDED for 2xx, FAILED otherwise), or a negative idem error to roll the
 * unit back, claim included. IDEM_ERETRY reruns it (so it must be safe to
 * run again: only its transaction may have effects). The unit may share its
 * transaction with other units (group commit): it must not COMMIT, ROLLBACK
 * or run DDL that ends a transaction.
 */
typedef int (*idem_work_fn)(idem_txn *txn, void *ctx, idem_response *resp);

/*
 * Atomic mode: claim req and, when FIRST, run work and complete the record in
 * the same transaction.
 * out:  receives the outcome and the response (FIRST: the work's; REPLAY: the
 *       stored one). Clear it with idem_result_clear, also after an error.
 * Returns 0 with an outcome, or a negative error with nothing committed:
 * a store failure is never reported as a duplicate.
 */
IDEM_EXTERN int idem_execute(idem_result *out, idem_store *store, const idem_request *req,
                             idem_work_fn work, void *ctx);

/*
 * Called once with the answer of idem_execute_async: rc and res as
 * idem_execute returns them. res belongs to the callee (idem_result_clear).
 */
typedef void (*idem_done_fn)(void *ctx, int rc, idem_result *res);

/*
 * Atomic mode without blocking the caller. Duplicates answered from the
 * cache or a read connection call done before this returns. Otherwise the
 * unit is queued for a writer thread when group commit is on
 * (opts.batch_max > 1): it runs inside a shared transaction under its own
 * savepoint, and done is called on the writer thread after that
 * transaction's COMMIT returned, so an acknowledged answer is durable. With
 * group commit off, the unit runs here and done is called before return.
 * req's strings, work and ctx must stay valid until done has been called;
 * work runs on the writer thread. done is called exactly once: with
 * IDEM_EINVAL and an empty result when store, req or work is NULL. done NULL:
 * nothing runs (there is nobody to answer).
 */
IDEM_EXTERN void idem_execute_async(idem_store *store, const idem_request *req, idem_work_fn work,
                                    void *ctx, idem_done_fn done, void *done_ctx);

/*
 * idem_execute_async for a thread that must never wait (an event loop's):
 * the answer of the front cache, or the unit queued for its writer without
 * the read before the write (its claim's INSERT decides, as always: a read
 * that finds nothing decides nothing, DESIGN.md §3). Returns
 * IDEM_EWOULDBLOCK, with nothing done and done not called, when that is
 * not how the store runs (group commit off, or no front cache), when the
 * read pays (lately about one request in four that missed the cache was a
 * duplicate all the same: after a restart, or for records another instance
 * wrote), and for anything idem_execute_async would refuse (NULL
 * arguments, an invalid req): call idem_execute_async from a thread that
 * may wait then. Otherwise 0, and done is called exactly once, as by
 * idem_execute_async: on this thread before return for a cached answer.
 */
IDEM_EXTERN int idem_execute_async_nowait(idem_store *store, const idem_request *req,
                                          idem_work_fn work, void *ctx, idem_done_fn done,
                                          void *done_ctx);

/* Two-phase mode. */
typedef struct idem_claim idem_claim;

/*
 * Claim req and commit it PROCESSING with a lease when FIRST.
 * out_claim: receives a claim handle when the outcome is FIRST (NULL otherwise);
 *            finish it with idem_claim_complete or idem_claim_abort, then free it.
 * out:       receives the outcome (and the stored response for REPLAY).
 * store, req: required.
 */
IDEM_EXTERN int idem_claim_begin(idem_claim **out_claim, idem_result *out, idem_store *store,
                                 const idem_request *req);

/*
 * Store the response and mark the record SUCCEEDED (2xx) or FAILED.
 * Returns 0; IDEM_ELEASE when the lease was lost to a takeover (the response
 * is not stored; the new owner's answer wins); store errors otherwise.
 */
IDEM_EXTERN int idem_claim_complete(idem_claim *claim, int http_status, const void *body,
                                    size_t len);

/*
 * Finish a claim with business writes: run work and, in the same transaction,
 * complete the record (resp.persist = 1) or delete it (persist = 0), both
 * only while the claim still holds its lease. For two-phase work whose
 * result must land together with business rows (the payment row written
 * after the channel answered).
 * out:  receives the work's response (outcome FIRST). Clear it after errors too.
 * Returns 0; IDEM_ELEASE when the lease was lost (nothing written); a store
 * error or the work's own error (nothing written; the claim stays PROCESSING
 * until idem_claim_abort or its lease runs out).
 */
IDEM_EXTERN int idem_claim_finish(idem_result *out, idem_claim *claim, idem_work_fn work,
                                  void *ctx);

/*
 * idem_claim_begin with business rows in the claim's own transaction: when
 * the claim is FIRST, prep runs in that transaction. prep leaving
 * resp->http_status 0 keeps the claim PROCESSING (with prep's rows) and
 * hands it out; prep setting an answer ends the request at once: stored and
 * the record completed (resp->persist 1) or, with persist 0, the claim and
 * prep's rows rolled back and the answer given once (out->stored 0). prep
 * NULL: idem_claim_begin. For
 * the two-phase call whose downstream number (a payment id sent to a
 * channel) must exist before the call and survive every retry.
 */
IDEM_EXTERN int idem_claim_begin_with(idem_claim **out_claim, idem_result *out, idem_store *store,
                                      const idem_request *req, idem_work_fn prep, void *ctx);

/*
 * Inside txn: complete the record of (scope, business_type, key) with this
 * answer when it is PROCESSING and its lease has run out (its owner died or
 * gave up); otherwise leave it. *settled 1 when it was completed (settled
 * is required; body may be NULL when len is 0). For a
 * sweeper that resolved the request's business outcome itself, so that a
 * later retry replays the answer instead of running again.
 */
IDEM_EXTERN int idem_record_settle(idem_txn *txn, const char *scope, const char *business_type,
                                   const char *key, size_t key_len, int http_status,
                                   const void *body, size_t len, int *settled);

/* Push the lease out to now + lease_ms. IDEM_ELEASE when it was lost. */
IDEM_EXTERN int idem_claim_extend(idem_claim *claim, int64_t lease_ms);

/*
 * Release a claim whose work failed before any effect: the record is deleted
 * so the next request runs afresh. IDEM_ELEASE when it was lost already.
 */
IDEM_EXTERN int idem_claim_abort(idem_claim *claim);

/* Free a claim handle. Does not complete or abort it. NULL is accepted. */
IDEM_EXTERN void idem_claim_free(idem_claim *claim);

/* A stored record, as idem_record_get reads it. */
typedef struct {
	char status[16]; /* "PROCESSING", "SUCCEEDED", "FAILED" */
	int http_status; /* 0 while PROCESSING */
	char fingerprint[IDEM_FINGERPRINT_LEN + 1];
	int64_t created_at_ms, expires_at_ms, lease_until_ms;
	unsigned char *body; /* owned; free with idem_record_info_clear */
	size_t body_len;
} idem_record_info;

/*
 * Read the record of (scope, business_type, key) from a read connection.
 * Returns 0, IDEM_ENOTFOUND, or a store error.
 */
IDEM_EXTERN int idem_record_get(idem_record_info *out, idem_store *store, const char *scope,
                                const char *business_type, const char *key, size_t key_len);

/* Free what info owns and zero it. NULL is accepted. */
IDEM_EXTERN void idem_record_info_clear(idem_record_info *info);

#ifdef __cplusplus
}
#endif
#endif
