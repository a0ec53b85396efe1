/*
 * tests/core/test_init_fail.c: construction that fails half way must undo
 * exactly what it did (issue 13): the front cache and the group-commit
 * writers used to destroy mutexes and condition variables they had never
 * initialised when an allocation or a thread start failed part way.
 *
 * The failures are injected by interposing calloc and pthread_create in this
 * executable (the library is linked in statically, so its calls bind here),
 * and every pthread_mutex_init/destroy is tracked: destroying a mutex that
 * was never initialised is counted. glibc would let that pass silently,
 * which is why the defect went unseen. Not built under AddressSanitizer,
 * which owns calloc itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "core/claim_internal.h"
#include "support.h"

extern void *__libc_calloc(size_t n, size_t size);

static _Atomic int calloc_fail_in; /* > 0: the n-th calloc from now fails */
static _Atomic int create_fail_in; /* > 0: the n-th pthread_create from now fails */
static _Atomic int tracking;
static pthread_mutex_t *live[4096];
static int nlive;
static _Atomic int bad_destroys;
static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;

void *calloc(size_t n, size_t size)
{
	if (atomic_load(&calloc_fail_in) > 0 && atomic_fetch_sub(&calloc_fail_in, 1) == 1) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_calloc(n, size);
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

	if (atomic_load(&create_fail_in) > 0 && atomic_fetch_sub(&create_fail_in, 1) == 1)
		return EAGAIN;
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
	return real(t, attr, fn, arg);
}

int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr)
{
	static int (*real)(pthread_mutex_t *, const pthread_mutexattr_t *);

	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "pthread_mutex_init");
	if (atomic_load(&tracking)) {
		pthread_mutex_lock(&track_lock);
		if (nlive < (int)(sizeof(live) / sizeof(live[0])))
			live[nlive++] = m;
		pthread_mutex_unlock(&track_lock);
	}
	return real(m, attr);
}

int pthread_mutex_destroy(pthread_mutex_t *m)
{
	static int (*real)(pthread_mutex_t *);

	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "pthread_mutex_destroy");
	if (atomic_load(&tracking)) {
		int found = 0;

		pthread_mutex_lock(&track_lock);
		for (int i = 0; i < nlive; i++)
			if (live[i] == m) {
				live[i] = live[--nlive];
				found = 1;
				break;
			}
		pthread_mutex_unlock(&track_lock);
		if (!found) {
			atomic_fetch_add(&bad_destroys, 1);
			return 0; /* never hand glibc a mutex it never saw */
		}
	}
	return real(m);
}

static void track_start(void)
{
	nlive = 0;
	atomic_store(&bad_destroys, 0);
	atomic_store(&tracking, 1);
}

static void track_stop(void)
{
	atomic_store(&tracking, 0);
	atomic_store(&calloc_fail_in, 0);
	atomic_store(&create_fail_in, 0);
}

/* Fail the table allocation of every shard in turn (calloc 1 is the cache). */
static void cache_partial_init(void **state)
{
	(void)state;
	for (int fail_at = 2; fail_at <= 17; fail_at++) {
		track_start();
		atomic_store(&calloc_fail_in, fail_at);
		assert_null(idem__cache_new(1 << 20, 1000));
		track_stop();
		assert_int_equal(atomic_load(&bad_destroys), 0);
		assert_int_equal(nlive, 0); /* and everything initialised was destroyed */
	}
	/* Unhindered it still works. */
	idem__cache *c = idem__cache_new(1 << 20, 1000);

	assert_non_null(c);
	idem__cache_free(c);
}

/* A writer thread that cannot start: the writers after it were never set up. */
static void batch_partial_start(void **state)
{
	char *url = test_db_url();
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;

	(void)state;
	assert_int_equal(idem_store_open(&store, url, &opts), 0);
	for (int fail_at = 1; fail_at <= 4; fail_at++) {
		idem__batch *b = NULL;

		track_start();
		atomic_store(&create_fail_in, fail_at);
		assert_true(idem__batch_start_n(&b, store, 4) < 0);
		assert_null(b);
		track_stop();
		assert_int_equal(atomic_load(&bad_destroys), 0);
		assert_int_equal(nlive, 0);
	}
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(cache_partial_init),
	    cmocka_unit_test(batch_partial_start),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
