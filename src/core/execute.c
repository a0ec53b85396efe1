/*
 * core/execute.c: the atomic-mode entry points, idem_execute and
 * idem_execute_async, side by side so the two paths are read together.
 * Both validate the request, try the fast path (front cache, then a read
 * connection: only ever REPLAY, MISMATCH or IN_PROGRESS), and then run the
 * unit either here in a transaction of its own (idem__execute_direct,
 * claim.c) or,
 * with group commit on, on the writer of its scope (batch.c), where its
 * answer is given only after the COMMIT that makes it durable returned.
 * idem_execute with group commit queues like everyone else and waits.
 */
#include <string.h>

#include "core/cache.h"
#include "core/claim_internal.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/waiter.h"

/*
 * The request's deadline (opts.request_timeout_ms) on this thread, unless a
 * caller set one: every store wait from here on ends by it (batch.c takes it
 * into the queued unit). 1 when it was set here, to be cleared by the caller.
 */
static int deadline_begin(const idem_store *store)
{
	if (store->opts.request_timeout_ms <= 0 || idem__backend_deadline())
		return 0;
	idem__backend_deadline_set(idem__clock_monotonic_us() +
	                           (int64_t)store->opts.request_timeout_ms * 1000);
	return 1;
}

static void deadline_end(int own)
{
	if (own)
		idem__backend_deadline_set(0);
}

/* An answer given on the calling thread (a duplicate, an error): counted, then done. */
static void answer_now(idem_store *store, const idem_request *req, int rc, idem_result *res,
                       idem_done_fn done, void *done_ctx)
{
	if (rc > 0)
		rc = 0;
	idem__count(store, req->business_type, rc, res);
	done(done_ctx, rc, res);
}

int idem_execute(idem_result *out, idem_store *store, const idem_request *req, idem_work_fn work,
                 void *ctx)
{
	idem__key k;
	int rc, own;

	if (!out)
		return idem__error(IDEM_EINVAL, "idem_execute: out is required");
	memset(out, 0, sizeof(*out));
	if (!store || !req)
		return idem__error(IDEM_EINVAL, "idem_execute: store and req are required");
	if (store->batch) {
		/* Group commit: queue like everyone else and wait for the COMMIT. */
		idem__waiter w;

		idem__waiter_init(&w);
		idem_execute_async(store, req, work, ctx, idem__waiter_done, &w);
		return idem__waiter_wait(&w, out);
	}
	if ((rc = idem__request_key(&k, req)) < 0)
		return rc;
	if (!work)
		return idem__error(IDEM_EINVAL, "idem_execute: work is required");
	own = deadline_begin(store);
	if ((rc = idem__fast_path(store, &k, req->fingerprint, out)) == 0)
		rc = idem__execute_direct(store, &k, req, work, ctx, out);
	deadline_end(own);
	if (rc > 0)
		rc = 0;
	idem__count(store, req->business_type, rc, out);
	return rc;
}

void idem_execute_async(idem_store *store, const idem_request *req, idem_work_fn work, void *ctx,
                        idem_done_fn done, void *done_ctx)
{
	idem_result res = {0};
	idem__key k;
	int rc, own_deadline = 0;

	if (!done)
		return; /* nobody to answer: nothing may run unseen */
	if (!store || !req) {
		done(done_ctx,
		     idem__error(IDEM_EINVAL, "idem_execute_async: store and req are required"),
		     &res);
		return;
	}
	if ((rc = idem__request_key(&k, req)) < 0) {
		done(done_ctx, rc, &res);
		return;
	}
	if (!work) {
		rc = idem__error(IDEM_EINVAL, "idem_execute_async: work is required");
		goto answer;
	}
	own_deadline = deadline_begin(store);
	if ((rc = idem__fast_path(store, &k, req->fingerprint, &res)) != 0)
		goto answer;
	if (!store->batch) {
		rc = idem__execute_direct(store, &k, req, work, ctx, &res);
		goto answer;
	}
	rc = idem__batch_submit(store->batch, req, work, ctx, done, done_ctx, 0);
	deadline_end(own_deadline);
	own_deadline = 0;
	if (rc == 0)
		return; /* the writer answers after its COMMIT */
answer:
	deadline_end(own_deadline);
	answer_now(store, req, rc, &res, done, done_ctx);
}

/*
 * The front cache, or the writer's queue without the read before the write:
 * never a wait (the cache's and the queue's locks are held for a lookup or
 * a link). Only when the store runs group commit and a front cache (without
 * one, the read is the only answer to a duplicate short of the writer), and
 * while the read does not pay (idem__miss_read_pays).
 */
int idem_execute_async_nowait(idem_store *store, const idem_request *req, idem_work_fn work,
                              void *ctx, idem_done_fn done, void *done_ctx)
{
	idem_result res = {0};
	idem__key k;
	int rc, own_deadline;

	if (!store || !req || !work || !done || !store->batch || !store->cache ||
	    idem__miss_read_pays(store) || idem__request_key(&k, req) < 0)
		return IDEM_EWOULDBLOCK; /* idem_execute_async answers these */
	rc = idem__cache_get(store->cache, &k, req->fingerprint, idem_store_now(store), &res);
	if (rc == 0) {
		own_deadline = deadline_begin(store); /* the unit takes it along */
		rc = idem__batch_submit(store->batch, req, work, ctx, done, done_ctx, 1);
		deadline_end(own_deadline);
		if (rc == 0)
			return 0; /* the writer answers after its COMMIT */
	}
	answer_now(store, req, rc, &res, done, done_ctx);
	return 0;
}
