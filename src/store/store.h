/*
 * store/store.h: the store handle as the library sees it inside: the
 * backend's ops and state, the options in force, and the counters.
 */
#ifndef IDEM_STORE_STORE_H
#define IDEM_STORE_STORE_H

#include "core/metrics.h"
#include "store/backend.h"

struct idem__cache;
struct idem__batch;

struct idem_store {
	const idem__backend_ops *ops;
	idem__backend *be;
	idem_store_opts opts;
	idem__metrics metrics;
	struct idem__cache *cache; /* NULL: no front cache */
	struct idem__batch *batch; /* NULL: no group commit */
};

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

#endif
