/*
 * cli/purge.c: `idemctl purge`: delete expired idempotency records in small
 * batches through the expiry index (idem_store_purge, one batch per call),
 * so idemd keeps serving between them. Never a PROCESSING record under a
 * live lease, never a business row: that is the library's promise; this
 * file only paces it, stops on --max-seconds and reports.
 */
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "idem/admin.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct {
	long batch, max_seconds;
	int dry_run;
	int64_t stats_keep;
} purge_args;

/* What the purge did so far, over every shard. */
typedef struct {
	int64_t total, batches, pruned;
	int complete; /* the last shard purged had no expired record left */
	double start;
	cli_progress prog;
} purge_tally;

/* The command's options into a; 0, or the usage error's exit code. */
static int parse_args(purge_args *a, int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		const char *v;
		int missing = 0;

		if (strcmp(argv[i], "--dry-run") == 0) {
			a->dry_run = 1;
		} else if ((v = cli_opt_value(argc, argv, &i, "--batch", &missing)) || missing) {
			if (missing || cli_parse_long(v, 1, 100000, &a->batch) < 0)
				return cli_usage_error("--batch needs a number from 1 to 100000");
		} else if ((v = cli_opt_value(argc, argv, &i, "--max-seconds", &missing)) ||
		           missing) {
			if (missing || cli_parse_long(v, 1, 86400 * 7, &a->max_seconds) < 0)
				return cli_usage_error("--max-seconds needs a number of seconds");
		} else if ((v = cli_opt_value(argc, argv, &i, "--stats-keep", &missing)) ||
		           missing) {
			if (missing || cli_parse_duration_ms(v, &a->stats_keep) < 0)
				return cli_usage_error(
				    "--stats-keep needs a duration such as 7d or 12h");
		} else {
			return cli_usage_error("purge: unexpected argument '%s'", argv[i]);
		}
	}
	return 0;
}

/* The expired records of every shard (sharded: summed) into *expected;
 * the exit code. */
static int count_expired(int64_t *expected)
{
	for (int s = 0; s < cli_nstores; s++) {
		int64_t n = 0;
		int rc;

		if ((rc = idem_admin_purge_count(cli_stores[s], &n)) < 0)
			return cli_fail("cannot count expired records", rc);
		*expected += n;
	}
	return 0;
}

static int report_dry_run(const cli_globals *g, int64_t expected)
{
	if (g->json)
		return cli_print_json(
		    json_pack("{s:b, s:I}", "dry_run", 1, "would_delete", (json_int_t)expected));
	printf("%lld expired record%s would be purged (dry run: nothing deleted)\n",
	       (long long)expected, expected == 1 ? "" : "s");
	return 0;
}

/*
 * One shard's store: a batch at a time until one comes back short (then
 * t->complete, and the flushed counters idemctl stats reads are pruned to
 * --stats-keep), --max-seconds passed since t->start, or a failure. The
 * exit code.
 */
static int purge_shard(idem_store *store, const purge_args *a, purge_tally *t)
{
	int rc = 0;

	t->complete = 0;
	for (;;) {
		int64_t n = 0;
		struct timespec pause = {0, 2000000}; /* let queued writers in */
		char extra[64];

		if ((rc = idem_store_purge(store, (int)a->batch, 1, &n)) < 0) {
			cli_progress_end(&t->prog);
			return cli_fail("purge failed", rc);
		}
		t->total += n;
		t->batches++;
		snprintf(extra, sizeof(extra), "%lld deleted", (long long)t->total);
		cli_progress_update(&t->prog, t->total, extra);
		if (n < a->batch) {
			t->complete = 1;
			break;
		}
		if (a->max_seconds > 0 && now_s() - t->start >= (double)a->max_seconds)
			break;
		nanosleep(&pause, NULL);
	}
	if (rc == 0 && t->complete) {
		int64_t gone = 0;

		if ((rc = idem_stats_prune(store, a->stats_keep, &gone)) < 0)
			rc = cli_fail("pruning old stats failed", rc);
		t->pruned += gone;
	}
	return rc;
}

/* What was purged (rc: the purge's exit code so far); the exit code. */
static int report(const cli_globals *g, const purge_tally *t, double elapsed, int rc)
{
	if (rc == 0 && g->json)
		rc = cli_print_json(json_pack(
		    "{s:b, s:I, s:I, s:b, s:I, s:I}", "dry_run", 0, "deleted", (json_int_t)t->total,
		    "batches", (json_int_t)t->batches, "complete", t->complete, "elapsed_ms",
		    (json_int_t)(elapsed * 1000), "stats_deleted", (json_int_t)t->pruned));
	else if (rc == 0)
		printf("purged %lld expired record%s in %lld batch%s, %.1f s%s\n",
		       (long long)t->total, t->total == 1 ? "" : "s", (long long)t->batches,
		       t->batches == 1 ? "" : "es", elapsed,
		       t->complete ? "" : " (stopped at --max-seconds: more remain)");
	if (rc > 0 && t->total > 0 && !g->json)
		printf("purged %lld record%s before the failure\n", (long long)t->total,
		       t->total == 1 ? "" : "s");
	return rc;
}

static int run(const cli_globals *g, int argc, char **argv)
{
	purge_args a = {1000, 0, 0, 7LL * 86400 * 1000};
	purge_tally t = {0};
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	int64_t expected = 0;
	int rc;

	if ((rc = parse_args(&a, argc, argv)) != 0)
		return rc;
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	cli_progress_start(&t.prog, "purging", 0);
	if ((a.dry_run || t.prog.on) && (rc = count_expired(&expected)) != 0)
		goto done;
	if (a.dry_run) {
		rc = report_dry_run(g, expected);
		goto done;
	}
	t.prog.total = expected;
	t.start = now_s();
	/* Sharded: each shard's store in turn. */
	for (int s = 0; s < cli_nstores; s++)
		if ((rc = purge_shard(cli_stores[s], &a, &t)) != 0 || !t.complete)
			break;
	cli_progress_end(&t.prog);
	rc = report(g, &t, now_s() - t.start, rc);
done:
	cli_close(store, pay);
	return rc;
}

const cli_command cli_purge = {
    "purge",
    "delete expired idempotency records in small batches",
    "purge [--batch N] [--dry-run] [--max-seconds S] [--stats-keep DUR] [--json]\n\n"
    "Deletes expired idempotency records, N per transaction (default 1000, up to\n"
    "100000) through the expiry index, until none are left or S seconds passed.\n"
    "Safe while idemd serves: a PROCESSING record whose lease is live and every\n"
    "business row are never touched. --dry-run only counts what would go.\n"
    "Once every expired record is gone, counters older than --stats-keep\n"
    "(default 7d) are deleted from the stats table too. With several --db\n"
    "(shards), each shard is purged in turn.\n"
    "A progress line is drawn when stderr is a terminal.\n"
    "--json prints {\"dry_run\", \"deleted\", \"batches\", \"complete\", \"elapsed_ms\",\n"
    "\"stats_deleted\"}\n"
    "(with --dry-run: {\"dry_run\", \"would_delete\"}).\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db purge --batch 500 --max-seconds 60\n",
    run,
};
