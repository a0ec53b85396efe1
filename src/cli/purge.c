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

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	long batch = 1000, max_seconds = 0;
	int dry_run = 0, complete = 0, rc;
	int64_t total = 0, batches = 0, expected = 0, stats_keep = 7LL * 86400 * 1000, pruned = 0;
	double start, elapsed;
	cli_progress prog;

	for (int i = 0; i < argc; i++) {
		const char *v;
		int missing = 0;

		if (strcmp(argv[i], "--dry-run") == 0) {
			dry_run = 1;
		} else if ((v = cli_opt_value(argc, argv, &i, "--batch", &missing)) || missing) {
			if (missing || cli_parse_long(v, 1, 100000, &batch) < 0)
				return cli_usage_error("--batch needs a number from 1 to 100000");
		} else if ((v = cli_opt_value(argc, argv, &i, "--max-seconds", &missing)) ||
		           missing) {
			if (missing || cli_parse_long(v, 1, 86400 * 7, &max_seconds) < 0)
				return cli_usage_error("--max-seconds needs a number of seconds");
		} else if ((v = cli_opt_value(argc, argv, &i, "--stats-keep", &missing)) ||
		           missing) {
			if (missing || cli_parse_duration_ms(v, &stats_keep) < 0)
				return cli_usage_error(
				    "--stats-keep needs a duration such as 7d or 12h");
		} else {
			return cli_usage_error("purge: unexpected argument '%s'", argv[i]);
		}
	}
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	cli_progress_start(&prog, "purging", 0);
	/* Sharded: each shard's store in turn (the counts are summed). */
	for (int s = 0; (dry_run || prog.on) && s < cli_nstores; s++) {
		int64_t n = 0;

		if ((rc = idem_admin_purge_count(cli_stores[s], &n)) < 0) {
			rc = cli_fail("cannot count expired records", rc);
			goto done;
		}
		expected += n;
	}
	if (dry_run) {
		if (g->json)
			rc = cli_print_json(json_pack("{s:b, s:I}", "dry_run", 1, "would_delete",
			                              (json_int_t)expected));
		else
			printf("%lld expired record%s would be purged (dry run: nothing deleted)\n",
			       (long long)expected, expected == 1 ? "" : "s");
		goto done;
	}
	prog.total = expected;
	start = now_s();
	for (int s = 0; s < cli_nstores; s++) {
		store = cli_stores[s];
		complete = 0;
		for (;;) {
			int64_t n = 0;
			struct timespec pause = {0, 2000000}; /* let queued writers in */
			char extra[64];

			if ((rc = idem_store_purge(store, (int)batch, 1, &n)) < 0) {
				cli_progress_end(&prog);
				rc = cli_fail("purge failed", rc);
				break;
			}
			total += n;
			batches++;
			snprintf(extra, sizeof(extra), "%lld deleted", (long long)total);
			cli_progress_update(&prog, total, extra);
			if (n < batch) {
				complete = 1;
				break;
			}
			if (max_seconds > 0 && now_s() - start >= (double)max_seconds)
				break;
			nanosleep(&pause, NULL);
		}
		/* The flushed counters idemctl stats reads are kept --stats-keep long. */
		if (rc == 0 && complete) {
			int64_t gone = 0;

			if ((rc = idem_stats_prune(store, stats_keep, &gone)) < 0)
				rc = cli_fail("pruning old stats failed", rc);
			pruned += gone;
		}
		if (rc != 0 || !complete)
			break;
	}
	cli_progress_end(&prog);
	store = cli_stores[0];
	elapsed = now_s() - start;
	if (rc == 0 && g->json)
		rc = cli_print_json(json_pack(
		    "{s:b, s:I, s:I, s:b, s:I, s:I}", "dry_run", 0, "deleted", (json_int_t)total,
		    "batches", (json_int_t)batches, "complete", complete, "elapsed_ms",
		    (json_int_t)(elapsed * 1000), "stats_deleted", (json_int_t)pruned));
	else if (rc == 0)
		printf("purged %lld expired record%s in %lld batch%s, %.1f s%s\n", (long long)total,
		       total == 1 ? "" : "s", (long long)batches, batches == 1 ? "" : "es", elapsed,
		       complete ? "" : " (stopped at --max-seconds: more remain)");
	if (rc > 0 && total > 0 && !g->json)
		printf("purged %lld record%s before the failure\n", (long long)total,
		       total == 1 ? "" : "s");
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
