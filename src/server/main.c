/*
 * server/main.c: idemd's entry point. Reads flags (with IDEM_* environment
 * fallbacks), opens the store and the payment domain, serves HTTP until
 * SIGINT or SIGTERM, then lets in-flight requests finish and closes the
 * store. Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idem/admin.h"
#include "server/server.h"

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: idemd [options]\n"
	    "\n"
	    "Serves the idem payment API (API.md v1) over HTTP.\n"
	    "\n"
	    "options (environment fallback in brackets):\n"
	    "  --listen HOST:PORT        address to listen on [IDEM_LISTEN] (127.0.0.1:8080)\n"
	    "  --db URL                  store URL [IDEM_DB] (sqlite:idem.db); given again,\n"
	    "                            one shard each, in order (docs/scaling.md)\n"
	    "  --threads N               HTTP event threads (epoll); what may wait runs on\n"
	    "                            worker threads [IDEM_THREADS] (8)\n"
	    "  --idempotency-ttl DUR     record retention, e.g. 24h, 30m, 90s "
	    "[IDEM_IDEMPOTENCY_TTL] (24h)\n"
	    "                            (notifications keep at least 72h)\n"
	    "  --log-format text|json    log line format [IDEM_LOG_FORMAT] (text)\n"
	    "  --max-connections N       concurrent connections, and the most worker threads\n"
	    "                            (1 MiB stack each) [IDEM_MAX_CONNECTIONS] (1024)\n"
	    "  --connection-timeout SEC  idle/slow connection timeout [IDEM_CONNECTION_TIMEOUT] "
	    "(30)\n"
	    "  --request-timeout SEC     a request's head and body must be in within SEC of the\n"
	    "                            connection's opening or previous answer, however slowly\n"
	    "                            they drip [IDEM_REQUEST_TIMEOUT] (30)\n"
	    "  --max-connections-per-ip N\n"
	    "                            concurrent connections from one address, 0 = no cap\n"
	    "                            [IDEM_MAX_CONNECTIONS_PER_IP] (256)\n"
	    "  --sqlite-synchronous full|normal\n"
	    "                            SQLite durability [IDEM_SQLITE_SYNCHRONOUS] (full)\n"
	    "  --batch-max N             group commit: units per transaction, 1 = off "
	    "[IDEM_BATCH_MAX] (64)\n"
	    "  --batch-wait-us US        wait this long for a fuller batch [IDEM_BATCH_WAIT_US] "
	    "(0)\n"
	    "  --writers K               writer connections, PostgreSQL/MariaDB [IDEM_WRITERS] "
	    "(4)\n"
	    "  --queue-timeout-ms MS     a write queued longer is answered 503 unrun\n"
	    "                            [IDEM_QUEUE_TIMEOUT_MS] (5000; 0 = no limit)\n"
	    "  --request-timeout-ms MS   a request's deadline in the store: 503 unrun or rolled\n"
	    "                            back, never 2xx after [IDEM_REQUEST_TIMEOUT_MS] (10000)\n"
	    "  --cache-mb MB             front cache of completed answers, 0 = off [IDEM_CACHE_MB] "
	    "(64)\n"
	    "  --cache-entries N         front cache entry cap [IDEM_CACHE_ENTRIES] (200000)\n"
	    "  --mock-channel-delay-ms N the mock channel answers after N ms; payments on it\n"
	    "                            then run in two phases [IDEM_MOCK_CHANNEL_DELAY_MS] (0)\n"
	    "  --public-url URL          this service as channels reach it; notify_url is\n"
	    "                            URL/v1/notifications/NAME [IDEM_PUBLIC_URL]\n"
	    "                            (http://LISTEN)\n"
	    "  --channel-workers N       threads calling connected channels\n"
	    "                            [IDEM_CHANNEL_WORKERS] (8)\n"
	    "  --channel-queue N         channel calls that may wait for a worker; more\n"
	    "                            are answered 503 channel_busy [IDEM_CHANNEL_QUEUE] "
	    "(1024)\n"
	    "  --sweep-interval-ms MS    how often the sweeper resolves payments left\n"
	    "                            'creating', 0 = never [IDEM_SWEEP_INTERVAL_MS] (10000)\n"
	    "  --sweep-age-ms MS         how old such a payment must be first\n"
	    "                            [IDEM_SWEEP_AGE_MS] (30000)\n"
	    "  --transfer-drive-ms MS    sharded: how often transfers between shards are\n"
	    "                            driven on (0 = never) [IDEM_TRANSFER_DRIVE_MS] (200)\n"
	    "  --transfer-step-delay-ms MS  tests: pause between a transfer's credit and\n"
	    "                            its outbox row settling [IDEM_TRANSFER_STEP_DELAY_MS] "
	    "(0)\n"
	    "  --secret-key-file PATH    seal channel secrets at rest with this key (32 bytes\n"
	    "                            or 64 hex digits, mode 600) [IDEM_SECRET_KEY_FILE]\n"
	    "  -h, --help                this text\n"
	    "\n"
	    "example:\n"
	    "  idemd --listen 127.0.0.1:8080 --db sqlite:var/idem.db\n");
}

/* A duration: a number with an optional unit ms, s, m, h, d (plain: seconds). */
static int parse_duration_ms(const char *s, int64_t *out)
{
	char *end = NULL;
	long long v;
	int64_t mult = 1000;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || v <= 0)
		return -1;
	if (strcmp(end, "ms") == 0)
		mult = 1;
	else if (*end == '\0' || strcmp(end, "s") == 0)
		mult = 1000;
	else if (strcmp(end, "m") == 0)
		mult = 60 * 1000;
	else if (strcmp(end, "h") == 0)
		mult = 3600 * 1000;
	else if (strcmp(end, "d") == 0)
		mult = 24 * 3600 * 1000;
	else
		return -1;
	if (v > INT64_MAX / mult)
		return -1;
	*out = v * mult;
	return 0;
}

static int parse_int(const char *s, long min, long max, int *out)
{
	char *end = NULL;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = (int)v;
	return 0;
}

typedef enum {
	OPT_LISTEN = 1000,
	OPT_DB,
	OPT_THREADS,
	OPT_TTL,
	OPT_LOG_FORMAT,
	OPT_MAX_CONN,
	OPT_CONN_TIMEOUT,
	OPT_SYNC,
	OPT_MOCK_DELAY,
	OPT_BATCH_MAX,
	OPT_BATCH_WAIT,
	OPT_WRITERS,
	OPT_QUEUE_TIMEOUT,
	OPT_CACHE_MB,
	OPT_CACHE_ENTRIES,
	OPT_SECRET_KEY_FILE,
	OPT_REQUEST_TIMEOUT,
	OPT_MAX_CONN_PER_IP,
	OPT_PUBLIC_URL,
	OPT_CHANNEL_WORKERS,
	OPT_CHANNEL_QUEUE,
	OPT_SWEEP_INTERVAL,
	OPT_SWEEP_AGE,
	OPT_REQUEST_DEADLINE,
	OPT_TRANSFER_DRIVE,
	OPT_TRANSFER_STEP_DELAY,
} opt_id;

/* --db given again: shards 1.. (cfg.db is shard 0), docs/scaling.md "Sharding". */
#define MAX_SHARDS 64
static char shard_db[MAX_SHARDS][1024];
static int nshard_db; /* --db flags seen: the first replaces IDEM_DB, the next add shards */
/* Transfers between shards: how often the driver looks for pending ones, and
 * (tests) a pause between a credit and the settling of its outbox row. */
static int transfer_drive_ms = 200;
static int transfer_step_delay_ms;

/* --secret-key-file: kept here, read once the store is open. */
static char secret_key_file[4096];
/* --request-timeout-ms: the store's per-request deadline (idem_store_opts). */
static int request_deadline_ms = 10000;

static const struct {
	opt_id id;
	const char *env;
} env_names[] = {
    {OPT_LISTEN, "IDEM_LISTEN"},
    {OPT_DB, "IDEM_DB"},
    {OPT_THREADS, "IDEM_THREADS"},
    {OPT_TTL, "IDEM_IDEMPOTENCY_TTL"},
    {OPT_LOG_FORMAT, "IDEM_LOG_FORMAT"},
    {OPT_MAX_CONN, "IDEM_MAX_CONNECTIONS"},
    {OPT_CONN_TIMEOUT, "IDEM_CONNECTION_TIMEOUT"},
    {OPT_SYNC, "IDEM_SQLITE_SYNCHRONOUS"},
    {OPT_MOCK_DELAY, "IDEM_MOCK_CHANNEL_DELAY_MS"},
    {OPT_BATCH_MAX, "IDEM_BATCH_MAX"},
    {OPT_BATCH_WAIT, "IDEM_BATCH_WAIT_US"},
    {OPT_WRITERS, "IDEM_WRITERS"},
    {OPT_QUEUE_TIMEOUT, "IDEM_QUEUE_TIMEOUT_MS"},
    {OPT_CACHE_MB, "IDEM_CACHE_MB"},
    {OPT_CACHE_ENTRIES, "IDEM_CACHE_ENTRIES"},
    {OPT_SECRET_KEY_FILE, "IDEM_SECRET_KEY_FILE"},
    {OPT_REQUEST_TIMEOUT, "IDEM_REQUEST_TIMEOUT"},
    {OPT_MAX_CONN_PER_IP, "IDEM_MAX_CONNECTIONS_PER_IP"},
    {OPT_PUBLIC_URL, "IDEM_PUBLIC_URL"},
    {OPT_CHANNEL_WORKERS, "IDEM_CHANNEL_WORKERS"},
    {OPT_CHANNEL_QUEUE, "IDEM_CHANNEL_QUEUE"},
    {OPT_SWEEP_INTERVAL, "IDEM_SWEEP_INTERVAL_MS"},
    {OPT_SWEEP_AGE, "IDEM_SWEEP_AGE_MS"},
    {OPT_REQUEST_DEADLINE, "IDEM_REQUEST_TIMEOUT_MS"},
    {OPT_TRANSFER_DRIVE, "IDEM_TRANSFER_DRIVE_MS"},
    {OPT_TRANSFER_STEP_DELAY, "IDEM_TRANSFER_STEP_DELAY_MS"},
};

static int apply(server_config *c, opt_id id, const char *v, const char *from)
{
	int bad = 0;

	switch (id) {
	case OPT_LISTEN:
		bad = snprintf(c->listen, sizeof(c->listen), "%s", v) >= (int)sizeof(c->listen);
		break;
	case OPT_DB:
		if (strcmp(from, "IDEM_DB") == 0 || nshard_db == 0)
			bad = snprintf(c->db, sizeof(c->db), "%s", v) >= (int)sizeof(c->db);
		else if (nshard_db >= MAX_SHARDS)
			bad = 1;
		else
			bad = snprintf(shard_db[nshard_db], sizeof(shard_db[0]), "%s", v) >=
			      (int)sizeof(shard_db[0]);
		if (strcmp(from, "IDEM_DB") != 0)
			nshard_db++;
		break;
	case OPT_THREADS: bad = parse_int(v, 1, 256, &c->threads); break;
	case OPT_TTL: bad = parse_duration_ms(v, &c->ttl_ms); break;
	case OPT_LOG_FORMAT:
		if (strcmp(v, "text") == 0)
			c->log_format = LOG_TEXT;
		else if (strcmp(v, "json") == 0)
			c->log_format = LOG_JSON;
		else
			bad = 1;
		break;
	case OPT_MAX_CONN: bad = parse_int(v, 1, 100000, &c->max_connections); break;
	case OPT_CONN_TIMEOUT: bad = parse_int(v, 1, 3600, &c->conn_timeout_s); break;
	case OPT_SYNC:
		if (strcmp(v, "full") == 0)
			c->synchronous_full = 1;
		else if (strcmp(v, "normal") == 0)
			c->synchronous_full = 0;
		else
			bad = 1;
		break;
	case OPT_MOCK_DELAY: bad = parse_int(v, 0, 600000, &c->mock_channel_delay_ms); break;
	case OPT_BATCH_MAX: bad = parse_int(v, 1, 10000, &c->batch_max); break;
	case OPT_BATCH_WAIT: bad = parse_int(v, 0, 1000000, &c->batch_wait_us); break;
	case OPT_WRITERS: bad = parse_int(v, 1, 64, &c->writers); break;
	case OPT_QUEUE_TIMEOUT: bad = parse_int(v, 0, 600000, &c->queue_timeout_ms); break;
	case OPT_REQUEST_DEADLINE: bad = parse_int(v, 0, 600000, &request_deadline_ms); break;
	case OPT_TRANSFER_DRIVE: bad = parse_int(v, 0, 3600000, &transfer_drive_ms); break;
	case OPT_TRANSFER_STEP_DELAY: bad = parse_int(v, 0, 600000, &transfer_step_delay_ms); break;
	case OPT_CACHE_MB: bad = parse_int(v, 0, 65536, &c->cache_mb); break;
	case OPT_CACHE_ENTRIES: bad = parse_int(v, 0, 100000000, &c->cache_entries); break;
	case OPT_SECRET_KEY_FILE:
		bad = !*v || snprintf(secret_key_file, sizeof(secret_key_file), "%s", v) >=
		                 (int)sizeof(secret_key_file);
		break;
	case OPT_REQUEST_TIMEOUT: bad = parse_int(v, 1, 3600, &c->request_timeout_s); break;
	case OPT_MAX_CONN_PER_IP: bad = parse_int(v, 0, 100000, &c->max_connections_per_ip); break;
	case OPT_PUBLIC_URL:
		bad = (strncmp(v, "http://", 7) != 0 && strncmp(v, "https://", 8) != 0) ||
		      snprintf(c->public_url, sizeof(c->public_url), "%s", v) >=
		          (int)sizeof(c->public_url);
		break;
	case OPT_CHANNEL_WORKERS: bad = parse_int(v, 1, 1024, &c->channel_workers); break;
	case OPT_CHANNEL_QUEUE: bad = parse_int(v, 1, 1000000, &c->channel_queue); break;
	case OPT_SWEEP_INTERVAL: bad = parse_int(v, 0, 86400000, &c->sweep_interval_ms); break;
	case OPT_SWEEP_AGE: bad = parse_int(v, 0, 86400000, &c->sweep_age_ms); break;
	}
	if (bad)
		fprintf(stderr, "idemd: invalid value '%s' for %s (see --help)\n", v, from);
	return bad ? -1 : 0;
}

/* The built-in values, before the environment and the flags. */
static void set_defaults(server_config *c)
{
	snprintf(c->listen, sizeof(c->listen), "127.0.0.1:8080");
	snprintf(c->db, sizeof(c->db), "sqlite:idem.db");
	c->threads = 8;
	c->ttl_ms = 24LL * 3600 * 1000;
	c->log_format = LOG_TEXT;
	c->max_connections = 1024;
	c->conn_timeout_s = 30;
	c->request_timeout_s = 30;
	c->max_connections_per_ip = 256;
	c->synchronous_full = 1;
	/* A locked store must become a 503 within seconds, not minutes: each
	 * attempt waits up to the busy timeout, and there are 1 + retries. */
	c->busy_timeout_ms = 2000;
	c->max_retries = 3;
	c->batch_max = 64;
	c->batch_wait_us = 0;
	c->writers = 4;
	c->queue_timeout_ms = 5000;
	c->cache_mb = 64;
	c->cache_entries = 200000;
	c->channel_workers = 8;
	c->channel_queue = 1024;
	c->sweep_interval_ms = 10000;
	c->sweep_age_ms = 30000;
}

/* The IDEM_* variables that are set and not empty; 2 on a bad value. */
static int read_environment(server_config *c)
{
	for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++) {
		const char *v = getenv(env_names[i].env);

		if (v && *v && apply(c, env_names[i].id, v, env_names[i].env) < 0)
			return 2;
	}
	return 0;
}

/* The command line: 0, 1 when --help was printed, 2 on bad usage. */
static int read_flags(server_config *c, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"listen", required_argument, NULL, OPT_LISTEN},
	    {"db", required_argument, NULL, OPT_DB},
	    {"threads", required_argument, NULL, OPT_THREADS},
	    {"idempotency-ttl", required_argument, NULL, OPT_TTL},
	    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
	    {"max-connections", required_argument, NULL, OPT_MAX_CONN},
	    {"connection-timeout", required_argument, NULL, OPT_CONN_TIMEOUT},
	    {"sqlite-synchronous", required_argument, NULL, OPT_SYNC},
	    {"mock-channel-delay-ms", required_argument, NULL, OPT_MOCK_DELAY},
	    {"batch-max", required_argument, NULL, OPT_BATCH_MAX},
	    {"batch-wait-us", required_argument, NULL, OPT_BATCH_WAIT},
	    {"writers", required_argument, NULL, OPT_WRITERS},
	    {"queue-timeout-ms", required_argument, NULL, OPT_QUEUE_TIMEOUT},
	    {"request-timeout-ms", required_argument, NULL, OPT_REQUEST_DEADLINE},
	    {"transfer-drive-ms", required_argument, NULL, OPT_TRANSFER_DRIVE},
	    {"transfer-step-delay-ms", required_argument, NULL, OPT_TRANSFER_STEP_DELAY},
	    {"cache-mb", required_argument, NULL, OPT_CACHE_MB},
	    {"cache-entries", required_argument, NULL, OPT_CACHE_ENTRIES},
	    {"secret-key-file", required_argument, NULL, OPT_SECRET_KEY_FILE},
	    {"request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT},
	    {"max-connections-per-ip", required_argument, NULL, OPT_MAX_CONN_PER_IP},
	    {"public-url", required_argument, NULL, OPT_PUBLIC_URL},
	    {"channel-workers", required_argument, NULL, OPT_CHANNEL_WORKERS},
	    {"channel-queue", required_argument, NULL, OPT_CHANNEL_QUEUE},
	    {"sweep-interval-ms", required_argument, NULL, OPT_SWEEP_INTERVAL},
	    {"sweep-age-ms", required_argument, NULL, OPT_SWEEP_AGE},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int opt;

	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (opt == 'h') {
			usage(stdout);
			return 1;
		}
		if (opt == '?') {
			fprintf(stderr, "idemd: see --help\n");
			return 2;
		}
		for (size_t i = 0; i < sizeof(longopts) / sizeof(longopts[0]); i++)
			if (longopts[i].val == opt &&
			    apply(c, (opt_id)opt, optarg, longopts[i].name) < 0)
				return 2;
	}
	if (optind < argc) {
		fprintf(stderr, "idemd: unexpected argument '%s' (see --help)\n", argv[optind]);
		return 2;
	}
	return 0;
}

/* The defaults, then the environment, then the flags, so flags override it.
 * 0, 1 when --help was printed, 2 on bad usage. */
static int configure(server_config *c, int argc, char **argv)
{
	int rc;

	set_defaults(c);
	if ((rc = read_environment(c)) != 0)
		return rc;
	return read_flags(c, argc, argv);
}

/* The channel secrets' key: from --secret-key-file, checked against the store. */
static int use_secret_key(idem_pay *pay)
{
	unsigned char key[32];
	int rc;

	if (!secret_key_file[0]) {
		if ((rc = idem_pay_set_secret_key(pay, NULL)) < 0)
			log_msg("error", "cannot start: %s", idem_error_last()->message);
		return rc;
	}
	if ((rc = idem_pay_secret_key_read(secret_key_file, key)) == 0)
		rc = idem_pay_set_secret_key(pay, key);
	OPENSSL_cleanse(key, sizeof(key));
	if (rc < 0)
		log_msg("error", "cannot start: %s", idem_error_last()->message);
	else
		log_msg("info", "channel secrets are sealed at rest (AES-256-GCM)");
	return rc;
}

/* What idemd holds while it runs: opened in main's order, closed by
 * close_all in reverse. */
typedef struct {
	server_config cfg;
	server_state st; /* borrowed by the HTTP server until it stops */
	idem_store *stores[MAX_SHARDS];
	idem_stats_flusher *stats[MAX_SHARDS];
	int nstores;
	http_server *http;
	sigset_t sigs; /* SIGINT and SIGTERM, taken by sigwait */
} idemd;

/*
 * glibc gives a thread arena's free top back to the kernel as soon as it
 * passes 128 KiB. SQLite frees pages at every SAVEPOINT/RELEASE, so the
 * group-commit writer paid an madvise and a TLB shootdown on both cores
 * several times per unit: perf put 16 % of idemd's time there and first
 * requests ran 1.7x faster without it (docs/benchmarks.md). Keep up to
 * 64 MiB per arena instead; a service's memory is meant to be reused.
 */
static void keep_freed_memory(void)
{
	mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

/* Signals are taken by sigwait in the main thread only. They are blocked
 * before the stores, the payment domain and the listener start threads of
 * their own, which inherit the mask (the log's flusher blocks all itself). */
static void block_signals(sigset_t *sigs)
{
	sigemptyset(sigs);
	sigaddset(sigs, SIGINT);
	sigaddset(sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* Shard i is the i-th --db; a store of its own each (schema migrated). */
static int open_stores(idemd *d)
{
	const server_config *c = &d->cfg;
	idem_store_opts so = IDEM_STORE_OPTS_INIT;
	int rc;

	so.synchronous_full = c->synchronous_full;
	so.busy_timeout_ms = c->busy_timeout_ms;
	so.max_retries = c->max_retries;
	so.batch_max = c->batch_max;
	so.batch_wait_us = c->batch_wait_us;
	so.writers = c->writers;
	so.queue_timeout_ms = c->queue_timeout_ms;
	so.request_timeout_ms = request_deadline_ms;
	so.cache_bytes = (size_t)c->cache_mb << 20;
	so.cache_entries = (size_t)c->cache_entries;
	so.default_ttl_ms = c->ttl_ms;
	d->nstores = nshard_db > 1 ? nshard_db : 1;
	for (int i = 0; i < d->nstores; i++) {
		const char *url = i == 0 ? c->db : shard_db[i];

		if ((rc = idem_store_open(&d->stores[i], url, &so)) < 0) {
			log_msg("error", "cannot open store%s: %s: %s", i ? " (shard)" : "",
			        idem_strerror(rc), idem_error_last()->message);
			return rc;
		}
	}
	d->st.store = d->stores[0]; /* /healthz and /metrics read shard 0's */
	return 0;
}

/* The payment domain over every shard, with the channel secrets' key. */
static int open_payments(idemd *d)
{
	server_config *c = &d->cfg;
	idem_pay_opts po = IDEM_PAY_OPTS_INIT;
	int rc;

	po.ttl_ms = c->ttl_ms;
	po.mock_channel_delay_ms = c->mock_channel_delay_ms;
	po.channel_workers = c->channel_workers;
	po.channel_queue = c->channel_queue;
	if (!c->public_url[0])
		snprintf(c->public_url, sizeof(c->public_url), "http://%s", c->listen);
	po.public_url = c->public_url;
	if ((rc = idem_pay_open_shards(&d->st.pay, d->stores, d->nstores, &po)) < 0) {
		log_msg("error", "cannot start: %s", idem_error_last()->message);
		return rc;
	}
	return use_secret_key(d->st.pay);
}

/* The sweeper, the transfer driver and the stats flushers. */
static int start_background_threads(idemd *d)
{
	const server_config *c = &d->cfg;
	idem_pay *pay = d->st.pay;

	/* Payments left 'creating' by lost channel answers or dead instances. */
	if (c->sweep_interval_ms > 0 &&
	    idem_pay_sweeper_start(pay, c->sweep_interval_ms, c->sweep_age_ms) < 0) {
		log_msg("error", "cannot start the sweeper: %s", idem_error_last()->message);
		return -1;
	}
	/* Transfers between shards: pending outbox rows, from any instance. */
	if (d->nstores > 1 && transfer_drive_ms > 0 &&
	    idem_pay_transfer_driver_start(pay, transfer_drive_ms, transfer_step_delay_ms) < 0) {
		log_msg("error", "cannot start the transfer driver: %s",
		        idem_error_last()->message);
		return -1;
	}
	/* Outcome counters go to the store every few seconds, so that
	 * `idemctl stats` sees every instance (never a write per request). */
	for (int i = 0; i < d->nstores; i++)
		if (idem_stats_flusher_start(&d->stats[i], d->stores[i], NULL) < 0)
			log_msg("warn", "stats flusher not started: %s",
			        idem_error_last()->message);
	return 0;
}

/* The listener, last: requests arrive only once everything they use runs. */
static int start_http(idemd *d)
{
	const server_config *c = &d->cfg;
	char err[256];

	d->st.cfg = c;
	if (http_start(&d->http, &d->st, err, sizeof(err)) < 0) {
		log_msg("error", "%s", err);
		return -1;
	}
	log_msg("info",
	        "idemd %s listening on %s (port %d), store %s, <= %d connections, ttl %llds, "
	        "batch %d, cache %d MiB%s%s",
	        IDEM_VERSION, c->listen, http_port(d->http), idem_store_backend(d->st.store),
	        c->max_connections, (long long)(c->ttl_ms / 1000), c->batch_max, c->cache_mb,
	        c->synchronous_full ? "" : ", synchronous=NORMAL",
	        d->nstores > 1 ? ", sharded" : "");
	if (d->nstores > 1)
		log_msg("info", "%d shards by merchant (docs/scaling.md)", d->nstores);
	return 0;
}

/* Until SIGINT or SIGTERM; then the requests in flight finish, or the
 * process exits at once without cleaning up. */
static void serve_until_signal(idemd *d)
{
	int rc, sig = 0;

	if (sigwait(&d->sigs, &sig) != 0)
		sig = 0;
	log_msg("info", "signal %d: finishing in-flight requests", sig);
	/* Store calls are bounded (busy timeout, then the connection is given up),
	 * so in-flight requests end well within this. */
	if ((rc = http_stop(d->http, 60000)) > 0) {
		log_msg("error",
		        "%d request(s) still in flight after 60 s; exiting without "
		        "cleanup (nothing unanswered was acknowledged)",
		        rc);
		_exit(1);
	}
	d->http = NULL;
}

/* Whatever was opened, in reverse; what was not is NULL, which is fine. */
static void close_all(idemd *d)
{
	http_stop(d->http, 0);
	for (int i = 0; i < d->nstores; i++) /* a last flush after the last request */
		idem_stats_flusher_stop(d->stats[i]);
	idem_pay_close(d->st.pay);
	for (int i = 0; i < d->nstores; i++)
		idem_store_close(d->stores[i]);
}

int main(int argc, char **argv)
{
	idemd d;
	int rc, exit_code = 1;

	memset(&d, 0, sizeof(d));
	if ((rc = configure(&d.cfg, argc, argv)) != 0)
		return rc == 1 ? 0 : rc;
	keep_freed_memory();
	log_init(d.cfg.log_format);
	block_signals(&d.sigs);
	/* The stores before the listener: nothing is served from a store that
	 * could not be opened or migrated. */
	if (open_stores(&d) < 0)
		goto done;
	if (open_payments(&d) < 0)
		goto done;
	if (start_background_threads(&d) < 0)
		goto done;
	if (start_http(&d) < 0)
		goto done;
	serve_until_signal(&d);
	exit_code = 0;
done:
	close_all(&d);
	if (exit_code == 0)
		log_msg("info", "stopped");
	return exit_code;
}
