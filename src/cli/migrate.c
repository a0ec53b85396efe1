/*
 * cli/migrate.c: `idemctl migrate [--status]`: apply pending schema
 * migrations, or only report the version. The store is opened with
 * migrations off, so --status never changes the database.
 */
#include <string.h>

#include "cli/cli.h"

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	idem_store *shown = NULL;
	int status_only = 0, applied = 0, after = 0, latest = 0, rc;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--status") == 0)
			status_only = 1;
		else
			return cli_usage_error("migrate: unexpected argument '%s'", argv[i]);
	}
	opts.migrate = 0;
	opts.read_connections = 1;
	if ((rc = cli_open_opts(g, &opts, &store, &pay)) != 0)
		return rc;
	/* Sharded: every shard's store, shard 0 last. Each backend has its own
	 * latest version, so the shard furthest behind its own latest is the one
	 * reported (shard 0 when none is behind). */
	for (int s = cli_nstores - 1; s >= 0; s--) {
		int b = 0, a = 0, l;

		store = cli_stores[s];
		l = idem_store_schema_latest(store);
		if ((rc = idem_store_schema_version(store, &b)) < 0) {
			rc = cli_fail("cannot read the schema version", rc);
			goto done;
		}
		a = b;
		if (!status_only && (rc = idem_store_migrate(store, &a)) < 0) {
			rc = cli_fail("migration failed", rc);
			goto done;
		}
		if (a - b > applied)
			applied = a - b;
		if (!shown || l - a >= latest - after) {
			shown = store;
			after = a;
			latest = l;
		}
	}
	if (g->json) {
		rc = cli_print_json(json_pack("{s:s, s:i, s:i, s:i, s:b}", "backend",
		                              idem_store_backend(shown), "schema_version", after,
		                              "latest", latest, "applied", applied, "up_to_date",
		                              after == latest));
	} else if (status_only) {
		printf("schema version %d of %d (%s)%s\n", after, latest, idem_store_backend(shown),
		       after == latest ? ", up to date" : ": run 'idemctl migrate'");
	} else {
		printf("schema version %d of %d (%s): %d migration%s applied\n", after, latest,
		       idem_store_backend(shown), applied, applied == 1 ? "" : "s");
	}
	if (rc == 0 && after != latest)
		rc = EXIT_CHECK;
done:
	cli_close(store, pay);
	return rc;
}

const cli_command cli_migrate = {
    "migrate",
    "apply pending schema migrations (or --status: show the version)",
    "migrate [--status] [--json]\n\n"
    "Applies every pending schema migration, each exactly once, in a transaction;\n"
    "safe to run while idemd serves and from two hosts at once. --status only\n"
    "reports the version and exits 3 when migrations are pending. With several\n"
    "--db (shards), each shard is migrated, and the shard furthest behind its\n"
    "backend's latest version is reported (shard 0 when none is).\n"
    "--json prints {\"backend\", \"schema_version\", \"latest\", \"applied\", \"up_to_date\"}.\n\n"
    "example:\n  idemctl --db postgresql://idem@127.0.0.1/idem migrate --status\n",
    run,
};
