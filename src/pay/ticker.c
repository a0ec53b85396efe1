/*
 * pay/ticker.c: a background thread that runs one pass of work every
 * interval: the sweeper's (sweeper.c) and the transfer driver's (saga.c).
 * A kick runs the next pass at once; stopping waits for a pass under way.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "pay/internal.h"
#include "util/error.h"

struct pay__ticker {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	int stopping, kicked, run_first;
	int64_t interval_ms;
	pay__tick_fn fn;
	void *arg;
};

/* Wait, lock held, until the interval passed, a kick or a stop. */
static void wait_interval(pay__ticker *t)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += t->interval_ms / 1000;
	ts.tv_nsec += (long)(t->interval_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (!t->stopping && !t->kicked &&
	       pthread_cond_timedwait(&t->wake, &t->lock, &ts) != ETIMEDOUT)
		;
	t->kicked = 0;
}

static void *ticker_main(void *arg)
{
	pay__ticker *t = arg;
	int run = t->run_first;

	pthread_mutex_lock(&t->lock);
	while (!t->stopping) {
		if (run) {
			pthread_mutex_unlock(&t->lock);
			t->fn(t->arg); /* its errors: the next pass tries again */
			pthread_mutex_lock(&t->lock);
			if (t->stopping)
				break;
		}
		run = 1;
		wait_interval(t);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

int pay__ticker_start(pay__ticker **out, int64_t interval_ms, int run_first, pay__tick_fn fn,
                      void *arg)
{
	pay__ticker *t;

	*out = NULL;
	if (!(t = calloc(1, sizeof(*t))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->wake, NULL);
	t->interval_ms = interval_ms;
	t->run_first = run_first;
	t->fn = fn;
	t->arg = arg;
	if (pthread_create(&t->thread, NULL, ticker_main, t) != 0) {
		pthread_cond_destroy(&t->wake);
		pthread_mutex_destroy(&t->lock);
		free(t);
		return idem__error(IDEM_ENOMEM, "cannot start a background thread");
	}
	*out = t;
	return 0;
}

void pay__ticker_kick(pay__ticker *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->kicked = 1;
	pthread_cond_signal(&t->wake);
	pthread_mutex_unlock(&t->lock);
}

void pay__ticker_stop(pay__ticker *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->stopping = 1;
	pthread_cond_signal(&t->wake);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->thread, NULL);
	pthread_cond_destroy(&t->wake);
	pthread_mutex_destroy(&t->lock);
	free(t);
}
