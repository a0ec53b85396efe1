/*
 * core/engine.h: the engine handle (the public idem_store) as the library
 * sees it inside: the backend it drives (ops and state), the options in
 * force, the counters, the front cache and the group-commit writers. Only
 * src/core looks inside it; a backend sees idem_store as an opaque pointer
 * and is driven through its ops (store/backend.h), never the other way.
 */
#ifndef IDEM_CORE_ENGINE_H
#define IDEM_CORE_ENGINE_H

#include <stdatomic.h>

#include "core/metrics.h"
#include "store/backend.h"

#include "util/error.h"

struct idem__cache;
struct idem__batch;

struct idem_store {
	const idem__backend_ops *ops;
	idem__backend *be;
	idem_store_opts opts; /* opts.clock is never NULL here */
	idem__metrics metrics;
	struct idem__cache *cache; /* NULL: no front cache */
	struct idem__batch *batch; /* NULL: no group commit */
	/* Whether the read before the write pays (idem__miss_note): relaxed,
	 * approximate by design; a lost update costs nothing but a read. */
	atomic_int miss_score;
};

/*
 * Build an engine around the backend ops, opened on target (the URL without
 * its scheme). IDEM_EINVAL, and ops never called, when ops->version is not
 * IDEM__BACKEND_OPS_VERSION. idem_store_open is this after the scheme lookup.
 */
int idem__engine_open(idem_store **out, const idem__backend_ops *ops, const char *target,
                      const idem_store_opts *opts);

/* Sleep a jittered, growing interval before retry number attempt (0-based). */
void idem__retry_backoff(int attempt);

/*
 * Run fn in a write transaction of its own: COMMIT when it returns >= 0,
 * ROLLBACK otherwise. IDEM_ERETRY from fn or from the COMMIT reruns it, up
 * to opts.max_retries times with jittered backoff. out (may be NULL) is
 * cleared before each rerun and after a failure: nothing committed, nothing
 * answered. Returns fn's value or the error.
 */
int idem__with_txn(idem_store *s, idem_txn_fn fn, void *ctx, idem_result *out);

/*
 * The same for fn that may set *undo: its transaction is then rolled back
 * and fn's value (>= 0) returned, as if committed with nothing in it. A
 * unit in a transaction of its own needs no savepoint for that.
 */
typedef int (*idem__txn_undo_fn)(idem_txn *txn, void *ctx, int *undo);
int idem__with_txn_undo(idem_store *s, idem__txn_undo_fn fn, void *ctx, idem_result *out);

/* Note a store error of code in the store's metrics (core/metrics.c). */
void idem__store_count_error(idem_store *store, int code);

#endif
