/*
 * core/claim_internal.h: the pieces of the claim protocol that the group
 * commit writer (batch.c) shares with the direct path (claim.c).
 */
#ifndef IDEM_CORE_CLAIM_INTERNAL_H
#define IDEM_CORE_CLAIM_INTERNAL_H

#include "core/engine.h"

/* Validate req and point k at its parts. */
int idem__request_key(idem__key *k, const idem_request *req);

/* Cache, then read connection: 1 when out is answered, 0 to go on, <0 error. */
int idem__fast_path(idem_store *s, const idem__key *k, const char *fp, idem_result *out);

/*
 * Whether the read before the write pays (DESIGN.md §3). It answers a
 * duplicate whose record is stored but not in the front cache (evicted,
 * written before a restart or by another instance) without a write; for a
 * new key it finds nothing and costs a read, and, for a caller that must
 * not wait, a hand-over to a thread that may. idem__miss_note counts what
 * each request that missed the cache turned out to be, from the read (a
 * record found) or from the claim of a unit queued without it (not FIRST);
 * idem__miss_read_pays is 1 while, lately, about one miss in four or more
 * was a duplicate.
 */
void idem__miss_note(idem_store *s, int duplicate);
int idem__miss_read_pays(const idem_store *s);

/* Claim, work and complete one unit under its own savepoint inside txn. */
int idem__run_unit(idem_txn *txn, const idem__key *k, const idem_request *req, const char *owner,
                   idem_work_fn work, void *ctx, idem_result *out);

/* One unit in a transaction of its own, with retries; caches the answer. */
int idem__execute_direct(idem_store *store, const idem__key *k, const idem_request *req,
                         idem_work_fn work, void *ctx, idem_result *out);

/* After a COMMIT returned: remember a completed answer in the front cache. */
void idem__cache_after_commit(idem_store *s, const idem__key *k, const idem_request *req,
                              const idem_result *res);

/*
 * The replay shortcut of src/pay: raw is the request's raw bytes as
 * pay frames them (core/cache.h). replay_raw: 1 and out a REPLAY when the
 * cached entry of req's key holds exactly these bytes, else 0 (go the
 * canonical way; req->fingerprint is not read), <0 on ENOMEM. note_raw:
 * keep raw with the cached entry of req's key when its fingerprint is
 * req->fingerprint (the canonical one, just computed from these bytes).
 */
int idem__replay_raw(idem_store *s, const idem_request *req, const void *raw, size_t len,
                     idem_result *out);
void idem__replay_note_raw(idem_store *s, const idem_request *req, const void *raw, size_t len);

/* Count one claim's outcome (or error) in the store's metrics. */
void idem__count(idem_store *s, const char *type, int rc, const idem_result *out);

/* Group commit writers: started by idem_store_open when opts.batch_max > 1. */
typedef struct idem__batch idem__batch;
int idem__batch_start(idem__batch **out, idem_store *store);
/* The same with exactly nwriters writers (tests). On failure *out is NULL. */
int idem__batch_start_n(idem__batch **out, idem_store *store, int nwriters);
/* How many writer threads b runs (0 for NULL). */
int idem__batch_writers(const idem__batch *b);
/* The writer scope is bound to while it has units in flight; -1 when none (tests). */
int idem__batch_writer_of(idem__batch *b, const char *scope);
/* Drain the queues, then stop and free the writers. NULL is accepted. */
void idem__batch_stop(idem__batch *b);
/*
 * Queue req for its scope's writer: done is called on the writer thread
 * after the COMMIT of its batch. 0 when queued; an error (nothing queued,
 * done not called) otherwise. req's strings must outlive done. unread: no
 * read before the write was made, so the claim's outcome is noted
 * (idem__miss_note).
 */
int idem__batch_submit(idem__batch *b, const idem_request *req, idem_work_fn work, void *ctx,
                       idem_done_fn done, void *done_ctx, int unread);

#endif
