/*
 * store/netdb.c: the connection-slot pool and the record-row decoder shared
 * by the PostgreSQL and MariaDB backends. The pool only hands out indexes;
 * opening, checking and dropping connections stays with each backend, which
 * knows its driver. Nothing here may block while holding the pool mutex
 * except on the condition variable.
 */
#include "store/netdb.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/error.h"

static _Thread_local int64_t thread_deadline_us;

void idem__backend_deadline_set(int64_t mono_us)
{
	thread_deadline_us = mono_us > 0 ? mono_us : 0;
}

int64_t idem__backend_deadline(void)
{
	return thread_deadline_us;
}

int64_t idem__net_deadline(int timeout_ms)
{
	int64_t d = thread_deadline_us;

	if (timeout_ms > 0) {
		int64_t own = idem__clock_monotonic_us() + (int64_t)timeout_ms * 1000;

		if (d == 0 || own < d)
			d = own;
	}
	return d;
}

int idem__net_wait_ms(int64_t deadline_us, int cap_ms)
{
	int64_t now, left = -1;

	if (deadline_us > 0) {
		now = idem__clock_monotonic_us();
		left = deadline_us > now ? (deadline_us - now + 999) / 1000 : 0;
	}
	if (cap_ms > 0 && (left < 0 || cap_ms < left))
		left = cap_ms;
	return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

int idem__pool_init(idem__pool *p, int n)
{
	pthread_condattr_t ca;

	memset(p, 0, sizeof(*p));
	if (!(p->free_slots = calloc((size_t)(n > 0 ? n : 1), sizeof(int))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	pthread_mutex_init(&p->mu, NULL);
	/* Deadlines are monotonic: so is the clock the pool waits on. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cv, &ca);
	pthread_condattr_destroy(&ca);
	p->n = n;
	/* Pop order 0, 1, 2...: a lightly used store keeps to its first slots. */
	for (int i = n - 1; i >= 0; i--)
		p->free_slots[p->nfree++] = i;
	return 0;
}

void idem__pool_destroy(idem__pool *p)
{
	if (!p->free_slots)
		return;
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->free_slots);
	memset(p, 0, sizeof(*p));
}

int idem__pool_take(idem__pool *p, int64_t deadline_us)
{
	struct timespec until = {(time_t)(deadline_us / 1000000), (long)(deadline_us % 1000000) * 1000};
	int slot;

	pthread_mutex_lock(&p->mu);
	while (p->nfree == 0) {
		if (deadline_us <= 0) {
			pthread_cond_wait(&p->cv, &p->mu);
		} else if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT &&
			   p->nfree == 0) {
			pthread_mutex_unlock(&p->mu);
			return idem__error(IDEM_EUNAVAIL,
					   "no database connection free before the deadline");
		}
	}
	slot = p->free_slots[--p->nfree];
	pthread_mutex_unlock(&p->mu);
	return slot;
}

void idem__pool_give(idem__pool *p, int slot)
{
	pthread_mutex_lock(&p->mu);
	p->free_slots[p->nfree++] = slot;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int idem__parse_int64(const char *s, size_t len, int64_t *out)
{
	char buf[32], *end = NULL;
	long long v;

	if (len == 0 || len >= sizeof(buf))
		return -1;
	memcpy(buf, s, len);
	buf[len] = '\0';
	errno = 0;
	v = strtoll(buf, &end, 10);
	if (errno != 0 || end != buf + len)
		return -1;
	*out = (int64_t)v;
	return 0;
}
