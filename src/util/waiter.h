/*
 * util/waiter.h: turning an idem_done_fn callback back into a blocking
 * call. The answer and the error detail (thread-local on the thread that
 * produced it) are carried over to the waiting thread.
 */
#ifndef IDEM_UTIL_WAITER_H
#define IDEM_UTIL_WAITER_H

#include <pthread.h>

#include "idem/claim.h"

typedef struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done, rc;
	idem_result res;
	idem_error err;
} idem__waiter;

void idem__waiter_init(idem__waiter *w);
/* An idem_done_fn: ctx is the waiter. */
void idem__waiter_done(void *ctx, int rc, idem_result *res);
/* Block until done ran; move the answer into out, restore the error, clean up. */
int idem__waiter_wait(idem__waiter *w, idem_result *out);

#endif
