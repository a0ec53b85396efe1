/*
 * bench/idem-bench.c: idem-bench's entry point: options, credentials, the
 * warm-up and timed phases, the report, and the exactly-once verdict.
 * Exit codes: 0 ran (and verified, unless --no-verify), 1 verification
 * failed, 2 bad usage, 3 could not run. It refuses any target that is not
 * a loopback address: this tool loads a local idemd, nothing else.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: idem-bench --url HOST:PORT [options]\n"
	           "\n"
	           "Closed-loop HTTP/1.1 keep-alive load for idemd on loopback, then an\n"
	           "exactly-once check against the database or the API.\n"
	           "\n"
	           "  --url HOST:PORT        target, loopback only (127.0.0.1:8080)\n"
	           "  --concurrency N        connections, one request in flight each (32)\n"
	           "  --threads N            load threads sharing the connections (2)\n"
	           "  --duration SEC         timed phase length (10), or\n"
	           "  --requests N           send N requests (stopping at --duration if given)\n"
	           "  --keys N               distinct keys per request type (unlimited); once\n"
	           "                         used up, every request repeats a key\n"
	           "  --dup-ratio F          share of requests repeating a used key (0)\n"
	           "  --hot-keys N           payment duplicates come from N hot keys, created\n"
	           "                         in an untimed warm-up (0: from every key sent)\n"
	           "  --mix P,N,R,T          weights of payments, notifications, refunds,\n"
	           "                         transfers (1,0,0,0); also payments=W,refunds=W,…\n"
	           "  --db URL               create merchants and a channel with idemctl on this\n"
	           "                         store; on sqlite:PATH also count rows afterwards\n"
	           "  --idemctl PATH         idemctl binary (next to idem-bench's build dir)\n"
	           "  --merchants N          merchants to create with --db (2)\n"
	           "  --api-key KEY          use an existing merchant (repeatable)\n"
	           "  --merchant ID:KEY      an existing merchant with its id (repeatable)\n"
	           "  --channel NAME         existing channel (mock) ...\n"
	           "  --channel-secret S     ... and its signing secret\n"
	           "  --seed N               PRNG seed for key choice (1)\n"
	           "  --run-id ID            key prefix, [a-z0-9]{1,12} (from time and pid)\n"
	           "  --no-verify            skip the exactly-once check (static baselines)\n"
	           "  --label TEXT           name of the run in the report\n"
	           "  --json                 print the result as one JSON object\n"
	           "  -h, --help             this text\n"
	           "\n"
	           "example:\n"
	           "  idem-bench --url 127.0.0.1:8080 --db sqlite:/tmp/b.db --duration 5 \\\n"
	           "             --dup-ratio 0.9 --hot-keys 1000\n");
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end = NULL;
	unsigned long long v;

	errno = 0;
	if (*s == '-')
		return -1;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static int parse_double(const char *s, double min, double max, double *out)
{
	char *end = NULL;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= min && v <= max))
		return -1;
	*out = v;
	return 0;
}

static int parse_url(bench_config *c, const char *s)
{
	const char *colon;
	struct in_addr a;
	uint64_t port;
	size_t hl;

	if (strncmp(s, "http://", 7) == 0)
		s += 7;
	if (!(colon = strrchr(s, ':')) || (hl = (size_t)(colon - s)) == 0 || hl >= sizeof(c->host))
		return -1;
	memcpy(c->host, s, hl);
	c->host[hl] = '\0';
	if (strcmp(c->host, "localhost") == 0)
		snprintf(c->host, sizeof(c->host), "127.0.0.1");
	if (parse_u64(colon + 1, 1, 65535, &port) < 0)
		return -1;
	c->port = (int)port;
	/* loopback only */
	if (inet_pton(AF_INET, c->host, &a) != 1 || (ntohl(a.s_addr) >> 24) != 127)
		return -2;
	return 0;
}

static int parse_mix(bench_config *c, const char *s)
{
	static const char *const names[] = {"payments", "notifications", "refunds", "transfers"};
	char buf[256], *save = NULL, *tok;
	int pos = 0;

	if (strlen(s) >= sizeof(buf))
		return -1;
	snprintf(buf, sizeof(buf), "%s", s);
	memset(c->mix, 0, sizeof(c->mix));
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), pos++) {
		char *eq = strchr(tok, '=');
		uint64_t w;
		int which = pos;

		if (eq) {
			*eq = '\0';
			which = -1;
			for (int i = 0; i < REQ_NTYPES; i++)
				if (strcmp(tok, names[i]) == 0)
					which = i;
			tok = eq + 1;
		}
		if (which < 0 || which >= REQ_NTYPES || parse_u64(tok, 0, 1000000, &w) < 0)
			return -1;
		c->mix[which] = (unsigned)w;
	}
	c->mix_total = 0;
	for (int i = 0; i < REQ_NTYPES; i++)
		c->mix_total += c->mix[i];
	return c->mix_total > 0 ? 0 : -1;
}

static int add_merchant(bench_config *c, const char *id, size_t idlen, const char *key)
{
	bench_merchant *m;

	if (c->nmerchants >= BENCH_MAX_MERCHANTS || idlen >= sizeof(m->id) ||
	    strlen(key) >= sizeof(m->key) || !*key)
		return -1;
	m = &c->merchants[c->nmerchants++];
	memcpy(m->id, id, idlen);
	m->id[idlen] = '\0';
	snprintf(m->key, sizeof(m->key), "%s", key);
	return 0;
}

/* Default idemctl: ../idemctl next to this binary's directory, else from PATH. */
static void default_idemctl(bench_config *c, const char *argv0)
{
	const char *slash = strrchr(argv0, '/');

	snprintf(c->idemctl, sizeof(c->idemctl), "idemctl");
	if (slash) {
		char path[1024];
		int n =
		    snprintf(path, sizeof(path), "%.*s/../idemctl", (int)(slash - argv0), argv0);

		if (n > 0 && (size_t)n < sizeof(path) && access(path, X_OK) == 0)
			snprintf(c->idemctl, sizeof(c->idemctl), "%s", path);
	}
}

enum {
	O_URL = 1000,
	O_CONC,
	O_THREADS,
	O_DURATION,
	O_REQUESTS,
	O_KEYS,
	O_DUP,
	O_HOT,
	O_MIX,
	O_DB,
	O_IDEMCTL,
	O_MERCHANTS,
	O_APIKEY,
	O_MERCHANT,
	O_CHANNEL,
	O_SECRET,
	O_SEED,
	O_RUNID,
	O_NOVERIFY,
	O_LABEL,
	O_JSON,
};

/* The built-in values, before the flags. */
static void set_defaults(bench_config *c, const char *argv0)
{
	memset(c, 0, sizeof(*c));
	parse_url(c, "127.0.0.1:8080");
	c->concurrency = 32;
	c->threads = 2;
	c->duration_s = 10;
	c->keys = UINT64_MAX;
	c->mix[REQ_PAYMENT] = c->mix_total = 1;
	c->seed = 1;
	c->verify = 1;
	snprintf(c->channel, sizeof(c->channel), "mock");
	snprintf(c->run_id, sizeof(c->run_id), "%llx%llx",
	         (unsigned long long)(time(NULL) & 0xffffff),
	         (unsigned long long)(getpid() & 0xffff));
	default_idemctl(c, argv0);
}

/* Copies v into a field of size bytes; -1 when it does not fit. */
static int set_text(char *field, size_t size, const char *v)
{
	return snprintf(field, size, "%s", v) >= (int)size ? -1 : 0;
}

/* One flag and its value: 0, 1 when --help was printed, 2 on bad usage
 * (reported). *create: merchants to create with --db. */
static int apply(bench_config *c, int opt, const char *v, uint64_t *create)
{
	const char *colon;
	uint64_t n = 0;
	int bad = 0, url_rc;

	switch (opt) {
	case 'h': usage(stdout); return 1;
	case O_URL:
		url_rc = parse_url(c, v);
		if (url_rc == -2) {
			fprintf(stderr, "idem-bench: %s is not a loopback address\n", v);
			return 2;
		}
		bad = url_rc < 0;
		break;
	case O_CONC:
		bad = parse_u64(v, 1, BENCH_MAX_CONNS, &n) < 0;
		c->concurrency = (int)n;
		break;
	case O_THREADS:
		bad = parse_u64(v, 1, 64, &n) < 0;
		c->threads = (int)n;
		break;
	case O_DURATION:
		bad = parse_double(v, 0.1, 86400, &c->duration_s) < 0;
		c->duration_set = 1;
		break;
	case O_REQUESTS: bad = parse_u64(v, 1, UINT64_MAX / 2, &c->requests) < 0; break;
	case O_KEYS: bad = parse_u64(v, 1, (uint64_t)SLOT_CHUNK * SLOT_CHUNKS, &c->keys) < 0; break;
	case O_DUP: bad = parse_double(v, 0, 1, &c->dup_ratio) < 0; break;
	case O_HOT: bad = parse_u64(v, 0, 100000000, &c->hot_keys) < 0; break;
	case O_MIX: bad = parse_mix(c, v) < 0; break;
	case O_DB: bad = set_text(c->db, sizeof(c->db), v) < 0; break;
	case O_IDEMCTL: bad = set_text(c->idemctl, sizeof(c->idemctl), v) < 0; break;
	case O_MERCHANTS: bad = parse_u64(v, 1, BENCH_MAX_MERCHANTS, create) < 0; break;
	case O_APIKEY: bad = add_merchant(c, "", 0, v) < 0; break;
	case O_MERCHANT:
		colon = strchr(v, ':');
		bad = !colon || add_merchant(c, v, (size_t)(colon - v), colon + 1) < 0;
		break;
	case O_CHANNEL: bad = set_text(c->channel, sizeof(c->channel), v) < 0; break;
	case O_SECRET: bad = set_text(c->channel_secret, sizeof(c->channel_secret), v) < 0; break;
	case O_SEED: bad = parse_u64(v, 1, UINT64_MAX, &c->seed) < 0; break;
	case O_RUNID:
		bad = strlen(v) < 1 || strlen(v) > 12 ||
		      strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789") != strlen(v);
		if (!bad)
			snprintf(c->run_id, sizeof(c->run_id), "%s", v);
		break;
	case O_NOVERIFY: c->verify = 0; break;
	case O_LABEL: snprintf(c->label, sizeof(c->label), "%s", v); break;
	case O_JSON: c->json = 1; break;
	default: fprintf(stderr, "idem-bench: see --help\n"); return 2;
	}
	if (bad) {
		fprintf(stderr, "idem-bench: invalid value '%s' (see --help)\n", v);
		return 2;
	}
	return 0;
}

/* What the flags imply together: the merchants to use or create, the
 * channel secret notifications need, no more threads than connections. */
static int settle(bench_config *c, uint64_t create)
{
	/* With merchants given, --db serves only the row counts on SQLite. */
	if (c->nmerchants == 0) {
		if (c->db[0]) {
			c->nmerchants = (int)create;
		} else if (c->verify) {
			fprintf(stderr, "idem-bench: give --db URL, --api-key or --merchant "
			                "(or --no-verify)\n");
			return 2;
		} else {
			add_merchant(c, "", 0, "sk_none");
		}
	}
	if (c->mix[REQ_NOTIFICATION] + c->mix[REQ_REFUND] > 0 && !c->channel_secret[0] &&
	    !c->db[0]) {
		fprintf(stderr, "idem-bench: notifications need --channel-secret (or --db)\n");
		return 2;
	}
	if (c->threads > c->concurrency)
		c->threads = c->concurrency;
	if (!c->label[0])
		snprintf(c->label, sizeof(c->label), "run %s", c->run_id);
	return 0;
}

/* 0, 1 when --help was printed, 2 on bad usage (reported). */
static int configure(bench_config *c, int argc, char **argv)
{
	static const struct option lo[] = {
	    {"url", required_argument, NULL, O_URL},
	    {"concurrency", required_argument, NULL, O_CONC},
	    {"threads", required_argument, NULL, O_THREADS},
	    {"duration", required_argument, NULL, O_DURATION},
	    {"requests", required_argument, NULL, O_REQUESTS},
	    {"keys", required_argument, NULL, O_KEYS},
	    {"dup-ratio", required_argument, NULL, O_DUP},
	    {"hot-keys", required_argument, NULL, O_HOT},
	    {"mix", required_argument, NULL, O_MIX},
	    {"db", required_argument, NULL, O_DB},
	    {"idemctl", required_argument, NULL, O_IDEMCTL},
	    {"merchants", required_argument, NULL, O_MERCHANTS},
	    {"api-key", required_argument, NULL, O_APIKEY},
	    {"merchant", required_argument, NULL, O_MERCHANT},
	    {"channel", required_argument, NULL, O_CHANNEL},
	    {"channel-secret", required_argument, NULL, O_SECRET},
	    {"seed", required_argument, NULL, O_SEED},
	    {"run-id", required_argument, NULL, O_RUNID},
	    {"no-verify", no_argument, NULL, O_NOVERIFY},
	    {"label", required_argument, NULL, O_LABEL},
	    {"json", no_argument, NULL, O_JSON},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	uint64_t create = 2;
	int opt, rc;

	set_defaults(c, argv[0]);
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1)
		if ((rc = apply(c, opt, optarg, &create)) != 0)
			return rc;
	if (optind < argc) {
		fprintf(stderr, "idem-bench: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	return settle(c, create);
}

static void report(bench *b, bench_thread *ts, int n, double secs, const char *verdict,
                   const char *detail)
{
	bench_hist h;
	uint64_t status[600] = {0}, errs = 0, dups = 0, total;
	double rps;

	memset(&h, 0, sizeof(h));
	for (int i = 0; i < n; i++) {
		hist_merge(&h, &ts[i].hist);
		for (int s = 0; s < 600; s++)
			status[s] += ts[i].status[s];
		errs += ts[i].transport_errors;
		dups += ts[i].dups;
	}
	total = h.total;
	rps = secs > 0 ? (double)total / secs : 0;
	if (b->cfg.json) {
		json_t *o = json_object(), *st = json_object();
		char *text;

		for (int s = 0; s < 600; s++)
			if (status[s]) {
				char k[8];

				snprintf(k, sizeof(k), "%d", s);
				json_object_set_new(st, k, json_integer((json_int_t)status[s]));
			}
		json_object_set_new(o, "label", json_string(b->cfg.label));
		json_object_set_new(o, "concurrency", json_integer(b->cfg.concurrency));
		json_object_set_new(o, "requests", json_integer((json_int_t)total));
		json_object_set_new(o, "duplicates", json_integer((json_int_t)dups));
		json_object_set_new(o, "seconds", json_real(secs));
		json_object_set_new(o, "rps", json_real(rps));
		json_object_set_new(o, "p50_ms", json_real((double)hist_quantile(&h, 0.5) / 1e6));
		json_object_set_new(o, "p99_ms", json_real((double)hist_quantile(&h, 0.99) / 1e6));
		json_object_set_new(o, "p999_ms",
		                    json_real((double)hist_quantile(&h, 0.999) / 1e6));
		json_object_set_new(o, "max_ms", json_real((double)h.max_ns / 1e6));
		json_object_set_new(o, "status", st);
		json_object_set_new(o, "transport_errors", json_integer((json_int_t)errs));
		json_object_set_new(o, "verify", json_string(verdict));
		json_object_set_new(o, "verify_detail", json_string(detail));
		text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
		printf("%s\n", text ? text : "{}");
		free(text);
		json_decref(o);
		return;
	}
	printf("idem-bench %s: %s:%d, %d connections on %d threads\n", b->cfg.label, b->cfg.host,
	       b->cfg.port, b->cfg.concurrency, n);
	printf("  %llu requests (%llu duplicates) in %.2f s: %.0f req/s\n",
	       (unsigned long long)total, (unsigned long long)dups, secs, rps);
	printf("  latency p50 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms\n",
	       (double)hist_quantile(&h, 0.5) / 1e6, (double)hist_quantile(&h, 0.99) / 1e6,
	       (double)hist_quantile(&h, 0.999) / 1e6, (double)h.max_ns / 1e6);
	printf("  status:");
	for (int s = 0; s < 600; s++)
		if (status[s])
			printf(" %d x %llu", s, (unsigned long long)status[s]);
	printf("\n  transport errors: %llu\n", (unsigned long long)errs);
	printf("  exactly-once: %s%s%s\n", verdict, detail[0] ? ": " : "", detail);
}

int main(int argc, char **argv)
{
	static bench b;
	bench_thread *ts = NULL;
	char err[512] = "", detail[2048] = "";
	const char *verdict = "skipped";
	uint64_t last = 0;
	double secs;
	int rc, exit_code = 3;

	signal(SIGPIPE, SIG_IGN);
	if ((rc = configure(&b.cfg, argc, argv)) != 0)
		return rc == 1 ? 0 : rc;
	if (slot_table_init(&b.pays, sizeof(pay_slot)) < 0 ||
	    slot_table_init(&b.refunds, sizeof(key_slot)) < 0 ||
	    slot_table_init(&b.transfers, sizeof(key_slot)) < 0 ||
	    !(ts = calloc((size_t)b.cfg.threads, sizeof(*ts)))) {
		fprintf(stderr, "idem-bench: out of memory\n");
		goto done;
	}
	if (b.cfg.db[0] && b.cfg.nmerchants > 0 && !b.cfg.merchants[0].key[0] &&
	    creds_create(&b.cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "idem-bench: %s\n", err);
		goto done;
	}
	if (b.cfg.verify && verify_balances_before(&b, err, sizeof(err)) < 0) {
		fprintf(stderr, "idem-bench: %s (is idemd at %s:%d?)\n", err, b.cfg.host,
		        b.cfg.port);
		goto done;
	}
	for (int i = 0; i < b.cfg.threads; i++) {
		ts[i].index = i;
		ts[i].rng =
		    b.cfg.seed * 0x9E3779B97F4A7C15ULL + (uint64_t)i * 0xBF58476D1CE4E5B9ULL;
		if (!ts[i].rng)
			ts[i].rng = 1;
	}
	if (b.cfg.hot_keys > 0) {
		b.phase = PHASE_WARM;
		if (engine_run(&b, ts, b.cfg.threads, err, sizeof(err)) < 0) {
			fprintf(stderr, "idem-bench: warm-up: %s\n", err);
			goto done;
		}
		/* the warm-up is not part of the result */
		for (int i = 0; i < b.cfg.threads; i++) {
			uint64_t rng = ts[i].rng;

			memset(&ts[i], 0, sizeof(ts[i]));
			ts[i].index = i;
			ts[i].rng = rng;
		}
	}
	b.phase = PHASE_MAIN;
	if (engine_run(&b, ts, b.cfg.threads, err, sizeof(err)) < 0) {
		fprintf(stderr, "idem-bench: %s\n", err);
		goto done;
	}
	for (int i = 0; i < b.cfg.threads; i++)
		if (ts[i].last_done_ns > last)
			last = ts[i].last_done_ns;
	secs = last > b.phase_start_ns ? (double)(last - b.phase_start_ns) / 1e9 : 0;
	exit_code = 0;
	if (b.cfg.verify) {
		rc = verify_run(&b, detail, sizeof(detail));
		verdict = rc == 0 ? "ok" : rc > 0 ? "failed" : "error";
		exit_code = rc == 0 ? 0 : rc > 0 ? 1 : 3;
	}
	report(&b, ts, b.cfg.threads, secs, verdict, detail);
done:
	free(ts);
	return exit_code;
}
