/*
 * pay/pay.c: the idem_pay handle's lifecycle, at the top of src/pay. Opening
 * checks the options and sets up what every request shares (the API key
 * cache, the channel state); a sharded handle opens one plain handle per
 * store under a router (docs/scaling.md). Closing stops what the handle
 * started, in order: the transfer driver, the shards, the two-phase requests
 * still running, the sweeper, the channel pool. This file calls everything
 * it starts and nothing in src/pay calls it back: it never holds a business
 * rule, a statement or a channel call of its own.
 */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "pay/channel.h"
#include "pay/internal.h"
#include "util/error.h"

int idem_pay_open(idem_pay **out, idem_store *store, const idem_pay_opts *opts)
{
	idem_pay_opts defaults = IDEM_PAY_OPTS_INIT;
	idem_pay *pay;

	IDEM__ASSERT_ARG(out);
	*out = NULL;
	if (!store)
		return idem__error(IDEM_EINVAL, "idem_pay_open: store is required");
	if (!opts)
		opts = &defaults;
	if (opts->version != IDEM_PAY_OPTS_VERSION || opts->ttl_ms <= 0 ||
	    opts->notification_ttl_ms <= 0 || opts->mock_channel_delay_ms < 0 ||
	    opts->channel_workers < 1 || opts->channel_workers > 1024 || opts->channel_queue < 1 ||
	    (opts->public_url && strlen(opts->public_url) >= sizeof(pay->public_url)))
		return idem__error(IDEM_EINVAL, "idem_pay_opts out of range");
	if (!(pay = calloc(1, sizeof(*pay))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	if (!(pay->chans = pay__chanstate_new())) {
		free(pay);
		return idem__error(IDEM_ENOMEM, "out of memory");
	}
	pay->store = store;
	pay->opts = *opts;
	if (opts->public_url) {
		/* notify_url is public_url + "/v1/notifications/<channel>" */
		size_t n = strlen(opts->public_url);

		memcpy(pay->public_url, opts->public_url, n + 1);
		while (n > 0 && pay->public_url[n - 1] == '/')
			pay->public_url[--n] = '\0';
	}
	pay->opts.public_url = NULL;
	pay->auth = pay__authcache_new(); /* without it, every request reads the store */
	pthread_mutex_init(&pay->pool_lock, NULL);
	pthread_mutex_init(&pay->channels_lock, NULL);
	pthread_cond_init(&pay->idle, NULL);
	/* Channels retry callbacks for more than a day (DESIGN.md §7). */
	if (pay->opts.notification_ttl_ms < 72LL * 3600 * 1000)
		pay->opts.notification_ttl_ms = 72LL * 3600 * 1000;
	if (pay->opts.notification_ttl_ms < pay->opts.ttl_ms)
		pay->opts.notification_ttl_ms = pay->opts.ttl_ms;
	*out = pay;
	return 0;
}

void idem_pay_close(idem_pay *pay)
{
	if (!pay)
		return;
	pay__saga_stop(pay);
	for (int i = 0; i < pay->nshards; i++)
		idem_pay_close(pay->shards[i]);
	free(pay->shards);
	pay__dir_free(pay->dir);
	/* Two-phase requests hold the store: let them answer first. */
	pthread_mutex_lock(&pay->channels_lock);
	while (pay->two_phase > 0)
		pthread_cond_wait(&pay->idle, &pay->channels_lock);
	pthread_mutex_unlock(&pay->channels_lock);
	pay__sweeper_stop(pay);
	pay__pool_stop(pay->pool); /* runs what is queued: each call answers */
	if (!pay->router)          /* a shard shares its router's */
		pay__chanstate_free(pay->chans);
	pthread_mutex_destroy(&pay->pool_lock);
	pay__authcache_free(pay->auth);
	OPENSSL_cleanse(pay->secret_key, sizeof(pay->secret_key));
	pthread_cond_destroy(&pay->idle);
	pthread_mutex_destroy(&pay->channels_lock);
	free(pay);
}

int idem_pay_open_shards(idem_pay **out, idem_store *const *stores, int n,
                         const idem_pay_opts *opts)
{
	idem_pay *r = NULL;
	int rc, version = 0, current = 1;

	IDEM__ASSERT_ARG(out);
	*out = NULL;
	if (!stores || n < 1 || n > 1000)
		return idem__error(IDEM_EINVAL, "idem_pay_open_shards: 1..1000 stores");
	for (int i = 0; i < n; i++)
		if (!stores[i])
			return idem__error(IDEM_EINVAL, "idem_pay_open_shards: store %d is NULL",
			                   i);
	if (n == 1)
		return idem_pay_open(out, stores[0], opts);
	if ((rc = idem_pay_open(&r, stores[0], opts)) < 0)
		return rc;
	if (!(r->shards = calloc((size_t)n, sizeof(*r->shards))) || !(r->dir = pay__dir_new())) {
		idem_pay_close(r);
		return idem__error(IDEM_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		idem_pay *s;

		if ((rc = idem_pay_open(&s, stores[i], opts)) < 0) {
			idem_pay_close(r);
			return rc;
		}
		/* One set of channel counters and one worker pool for all shards. */
		pay__chanstate_free(s->chans);
		s->chans = r->chans;
		s->router = r;
		s->shard = i;
		r->shards[r->nshards++] = s;
	}
	/* Channels to a shard added since (not before the stores are migrated:
	 * `idemctl migrate` opens them as they are). */
	for (int i = 0; i < n && current; i++)
		current = idem_store_schema_version(stores[i], &version) == 0 &&
		          version >= idem_store_schema_latest(stores[i]);
	if (current && (rc = pay__channels_sync(r, NULL)) < 0) {
		idem_pay_close(r);
		return rc;
	}
	*out = r;
	return 0;
}
