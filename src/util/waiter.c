/* util/waiter.c: see waiter.h. */
#include "util/waiter.h"

#include <string.h>

#include "util/error.h"

void idem__waiter_init(idem__waiter *w)
{
	memset(w, 0, sizeof(*w));
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
}

void idem__waiter_done(void *ctx, int rc, idem_result *res)
{
	idem__waiter *w = ctx;

	pthread_mutex_lock(&w->lock);
	w->res = *res;
	memset(res, 0, sizeof(*res));
	w->rc = rc;
	w->err = *idem_error_last();
	w->done = 1;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

int idem__waiter_wait(idem__waiter *w, idem_result *out)
{
	pthread_mutex_lock(&w->lock);
	while (!w->done)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	*out = w->res;
	if (w->rc < 0)
		idem__error_restore(&w->err);
	return w->rc;
}
