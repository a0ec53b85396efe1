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

int idem__record_row(void *ctx, const idem_value *c, int n)
{
	idem__record *r = ctx;
	int rc;

	if (n != 10 || c[0].type != IDEM_VAL_INT || c[1].type != IDEM_VAL_INT ||
	    c[2].type != IDEM_VAL_TEXT || c[3].type != IDEM_VAL_TEXT ||
	    c[8].type != IDEM_VAL_INT || c[9].type != IDEM_VAL_INT)
		return idem__error(IDEM_ESTORE, "record row malformed (%d columns)", n);
	r->id = c[0].i;
	r->version = c[1].i;
	if ((rc = idem__status_parse(c[2].p, c[2].len, &r->status)) < 0)
		return rc;
	if (c[3].len != IDEM_FINGERPRINT_LEN)
		return idem__error(IDEM_ESTORE, "record fingerprint malformed");
	memcpy(r->fingerprint, c[3].p, IDEM_FINGERPRINT_LEN);
	r->fingerprint[IDEM_FINGERPRINT_LEN] = '\0';
	if (c[4].type == IDEM_VAL_TEXT && c[4].len < sizeof(r->owner)) {
		memcpy(r->owner, c[4].p, c[4].len);
		r->owner[c[4].len] = '\0';
	}
	r->http_status = c[5].type == IDEM_VAL_INT ? (int)c[5].i : 0;
	if (c[6].type == IDEM_VAL_BLOB || c[6].type == IDEM_VAL_TEXT) {
		if (!(r->body = malloc(c[6].len ? c[6].len : 1)))
			return idem__error(IDEM_ENOMEM, "out of memory");
		if (c[6].len)
			memcpy(r->body, c[6].p, c[6].len);
		r->body_len = c[6].len;
	}
	r->lease_until = c[7].type == IDEM_VAL_INT ? c[7].i : 0;
	r->created_at = c[8].i;
	r->expires_at = c[9].i;
	return 1;
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
