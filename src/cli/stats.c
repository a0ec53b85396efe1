/*
 * cli/stats.c: `idemctl stats`: requests by business type and outcome over
 * a window, summed over every idemd instance's flushed counters, the stored
 * records by status, and the duplicate ratio with DESIGN.md §8's warning
 * above 5 % (exit 3, so a cron job or a probe can alert on it).
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define WARN_RATIO 0.05

static int by_type(const void *a, const void *b)
{
	return strcmp(((const idem_stats_type *)a)->business_type,
	              ((const idem_stats_type *)b)->business_type);
}

/* Add shard report s into r (counts summed; instances: the most any shard saw,
 * since one idemd flushes to every shard). 1 when out of memory. */
static int merge(idem_stats_report *r, const idem_stats_report *s)
{
	r->requests += s->requests;
	r->duplicates += s->duplicates;
	r->errors += s->errors;
	if (s->instances > r->instances)
		r->instances = s->instances;
	for (size_t i = 0; i < s->ntypes; i++) {
		const idem_stats_type *t = &s->types[i];
		idem_stats_type *into = NULL;

		for (size_t k = 0; k < r->ntypes && !into; k++)
			if (strcmp(r->types[k].business_type, t->business_type) == 0)
				into = &r->types[k];
		if (!into) {
			idem_stats_type *types =
			    realloc(r->types, (r->ntypes + 1) * sizeof(*types));

			if (!types)
				return 1;
			r->types = types;
			into = &r->types[r->ntypes++];
			memset(into, 0, sizeof(*into));
			memcpy(into->business_type, t->business_type, sizeof(into->business_type));
		}
		for (int o = 0; o <= IDEM_OUTCOME_COUNT; o++)
			into->outcomes[o] += t->outcomes[o];
		into->processing += t->processing;
		into->succeeded += t->succeeded;
		into->failed += t->failed;
	}
	if (r->ntypes > 1)
		qsort(r->types, r->ntypes, sizeof(*r->types), by_type);
	return 0;
}

/* --window into *window_ms; 0, or the usage error's exit code. */
static int parse_args(int64_t *window_ms, int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		const char *v;
		int missing = 0;

		if ((v = cli_opt_value(argc, argv, &i, "--window", &missing)) || missing) {
			if (missing || cli_parse_duration_ms(v, window_ms) < 0 ||
			    *window_ms > 366LL * 86400 * 1000)
				return cli_usage_error(
				    "--window needs a duration such as 90s, 5m, 1h");
		} else {
			return cli_usage_error("stats: unexpected argument '%s'", argv[i]);
		}
	}
	return 0;
}

/* Shard 0's report (store) into r, every other shard's merged in; the exit
 * code. */
static int read_all(idem_stats_report *r, idem_store *store, int64_t window_ms)
{
	int rc;

	if ((rc = idem_stats_read(r, store, window_ms)) < 0)
		return cli_fail("cannot read stats", rc);
	/* Sharded: every shard's counters and records, summed. */
	for (int i = 1; i < cli_nstores; i++) {
		idem_stats_report s;

		memset(&s, 0, sizeof(s));
		if ((rc = idem_stats_read(&s, cli_stores[i], window_ms)) < 0) {
			idem_stats_report_clear(&s);
			return cli_fail("cannot read stats", rc);
		}
		rc = merge(r, &s);
		idem_stats_report_clear(&s);
		if (rc) {
			fprintf(stderr, "idemctl: out of memory\n");
			return rc;
		}
	}
	return rc;
}

static int print_json(const idem_stats_report *r, int64_t window_ms, double ratio)
{
	json_t *types = json_object();

	for (size_t i = 0; types && i < r->ntypes; i++) {
		const idem_stats_type *t = &r->types[i];

		json_object_set_new(
		    types, t->business_type,
		    json_pack("{s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:I}}", "first",
		              (json_int_t)t->outcomes[IDEM_FIRST], "replay",
		              (json_int_t)t->outcomes[IDEM_REPLAY], "in_progress",
		              (json_int_t)t->outcomes[IDEM_IN_PROGRESS], "mismatch",
		              (json_int_t)t->outcomes[IDEM_MISMATCH], "error",
		              (json_int_t)t->outcomes[IDEM_COUNT_ERROR], "records", "processing",
		              (json_int_t)t->processing, "succeeded", (json_int_t)t->succeeded,
		              "failed", (json_int_t)t->failed));
	}
	return cli_print_json(
	    json_pack("{s:I, s:I, s:I, s:f, s:I, s:i, s:o}", "window_seconds",
	              (json_int_t)(window_ms / 1000), "requests", (json_int_t)r->requests,
	              "duplicates", (json_int_t)r->duplicates, "duplicate_ratio", ratio, "errors",
	              (json_int_t)r->errors, "instances", r->instances, "by_type", types));
}

static void print_text(const idem_stats_report *r, int64_t window_ms, double ratio)
{
	printf("window %llds, %d idemd instance%s reporting\n", (long long)(window_ms / 1000),
	       r->instances, r->instances == 1 ? "" : "s");
	printf("requests %lld, duplicates %lld (%.2f %%), errors %lld\n\n", (long long)r->requests,
	       (long long)r->duplicates, ratio * 100, (long long)r->errors);
	printf("%-14s %10s %10s %11s %10s %8s | %10s %10s %10s\n", "TYPE", "FIRST", "REPLAY",
	       "IN_PROGRESS", "MISMATCH", "ERROR", "PROCESSING", "SUCCEEDED", "FAILED");
	for (size_t i = 0; i < r->ntypes; i++) {
		const idem_stats_type *t = &r->types[i];

		printf(
		    "%-14s %10lld %10lld %11lld %10lld %8lld | %10lld %10lld %10lld\n",
		    t->business_type, (long long)t->outcomes[IDEM_FIRST],
		    (long long)t->outcomes[IDEM_REPLAY], (long long)t->outcomes[IDEM_IN_PROGRESS],
		    (long long)t->outcomes[IDEM_MISMATCH], (long long)t->outcomes[IDEM_COUNT_ERROR],
		    (long long)t->processing, (long long)t->succeeded, (long long)t->failed);
	}
	printf("(outcomes: requests in the window; records: stored now)\n");
}

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	idem_stats_report r;
	int64_t window_ms = 5 * 60 * 1000;
	double ratio;
	int rc;

	memset(&r, 0, sizeof(r));
	if ((rc = parse_args(&window_ms, argc, argv)) != 0)
		return rc;
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	if ((rc = read_all(&r, store, window_ms)) != 0)
		goto done;
	ratio = r.requests > 0 ? (double)r.duplicates / (double)r.requests : 0.0;
	if (g->json)
		rc = print_json(&r, window_ms, ratio);
	else
		print_text(&r, window_ms, ratio);
	if (rc == 0 && ratio > WARN_RATIO) {
		fprintf(
		    stderr,
		    "idemctl: warning: duplicate ratio %.2f %% (%lld of %lld requests in the last "
		    "%llds) is above 5 %%: check clients' retry behaviour\n",
		    ratio * 100, (long long)r.duplicates, (long long)r.requests,
		    (long long)(window_ms / 1000));
		rc = EXIT_CHECK;
	}
done:
	idem_stats_report_clear(&r);
	cli_close(store, pay);
	return rc;
}

const cli_command cli_stats = {
    "stats",
    "requests by type and outcome, duplicate ratio (exit 3 above 5 %)",
    "stats [--window DUR] [--json]\n\n"
    "Sums the outcome counters every idemd instance flushes to the store (every few\n"
    "seconds) over the last DUR (default 5m; 90s, 5m, 1h, 1d), and counts stored\n"
    "records by business type and status. Prints a warning and exits 3 when the\n"
    "duplicate ratio (replays, in-progress and mismatches over all requests) is\n"
    "above 5 %. With several --db (shards), every shard's counters are summed.\n"
    "--json prints {\"window_seconds\", \"requests\", \"duplicates\", \"duplicate_ratio\",\n"
    "\"errors\", \"instances\", \"by_type\": {TYPE: {\"first\", \"replay\", \"in_progress\",\n"
    "\"mismatch\", \"error\", \"records\": {\"processing\", \"succeeded\", \"failed\"}}}}.\n\n"
    "example:\n  idemctl --db postgresql://idem@127.0.0.1/idem stats --window 15m --json\n",
    run,
};
