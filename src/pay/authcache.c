/*
 * pay/authcache.c: recently verified API keys, so that a request does not
 * cost a database read to authenticate. An entry maps the SHA-256 digest of
 * a key that the database confirmed to its merchant, for AUTH_TTL_MS; a
 * rotated or removed key therefore stops working everywhere within that
 * time (at once in the process that rotated it, which forgets the merchant).
 * Digests are compared in constant time; keys themselves are never kept.
 */
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"

#define SLOTS       1024
#define STRIPES     16
#define AUTH_TTL_MS 10000

typedef struct {
	char digest[65];
	char merchant[IDEM_PAY_ID_SIZE];
	int64_t until;
} slot;

struct pay__authcache {
	pthread_mutex_t locks[STRIPES];
	slot slots[SLOTS];
};

pay__authcache *pay__authcache_new(void)
{
	pay__authcache *c = calloc(1, sizeof(*c));

	if (c)
		for (int i = 0; i < STRIPES; i++)
			pthread_mutex_init(&c->locks[i], NULL);
	return c;
}

void pay__authcache_free(pay__authcache *c)
{
	if (!c)
		return;
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_destroy(&c->locks[i]);
	OPENSSL_cleanse(c->slots, sizeof(c->slots));
	free(c);
}

int pay__digest_equal(const char a[64], const char b[64])
{
	return CRYPTO_memcmp(a, b, 64) == 0;
}

static unsigned slot_of(const char *digest)
{
	unsigned v = 0;

	/* The digest is uniformly distributed: its first hex digits will do. */
	for (int i = 0; i < 4; i++)
		v = v << 4 | (unsigned)(digest[i] <= '9' ? digest[i] - '0' : digest[i] - 'a' + 10);
	return v % SLOTS;
}

int pay__authcache_get(pay__authcache *c, const char digest[65], int64_t now,
                       char merchant[IDEM_PAY_ID_SIZE])
{
	unsigned i = slot_of(digest);
	pthread_mutex_t *lock = &c->locks[i % STRIPES];
	slot *s = &c->slots[i];
	int hit;

	pthread_mutex_lock(lock);
	hit = s->until > now && pay__digest_equal(s->digest, digest);
	if (hit)
		memcpy(merchant, s->merchant, IDEM_PAY_ID_SIZE);
	pthread_mutex_unlock(lock);
	return hit;
}

void pay__authcache_put(pay__authcache *c, const char digest[65], int64_t now, const char *merchant)
{
	unsigned i = slot_of(digest);
	pthread_mutex_t *lock = &c->locks[i % STRIPES];
	slot *s = &c->slots[i];

	pthread_mutex_lock(lock);
	memcpy(s->digest, digest, 65);
	snprintf(s->merchant, sizeof(s->merchant), "%s", merchant);
	s->until = now + AUTH_TTL_MS;
	pthread_mutex_unlock(lock);
}

void pay__authcache_forget(pay__authcache *c, const char *merchant)
{
	for (int i = 0; i < SLOTS; i++) {
		pthread_mutex_lock(&c->locks[i % STRIPES]);
		if (strcmp(c->slots[i].merchant, merchant) == 0)
			c->slots[i].until = 0;
		pthread_mutex_unlock(&c->locks[i % STRIPES]);
	}
}
