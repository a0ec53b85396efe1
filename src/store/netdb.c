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

#include "util/error.h"

int idem__pool_init(idem__pool *p, int n)
{
	memset(p, 0, sizeof(*p));
	if (!(p->free_slots = calloc((size_t)(n > 0 ? n : 1), sizeof(int))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
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

int idem__pool_take(idem__pool *p)
{
	int slot;

	pthread_mutex_lock(&p->mu);
	while (p->nfree == 0)
		pthread_cond_wait(&p->cv, &p->mu);
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
