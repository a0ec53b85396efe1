/*
 * cli/main.c: idemctl's entry point: global options (--db, --json), then
 * one command from the table. Holds no SQL: every command goes through the
 * library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const cli_command *const commands[] = {
    &cli_migrate,       &cli_merchant_add,
    &cli_merchant_list, &cli_merchant_rotate_key,
    &cli_channel_add,   &cli_channel_connect,
    &cli_channel_list,  &cli_channel_rotate_secret,
    &cli_channel_rekey, &cli_purge,
    &cli_stats,         &cli_inspect,
    &cli_recon_import,  &cli_demo,
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char exit_codes[] =
    "exit codes: 0 success, 1 failure (store, file), 2 bad usage, 3 a check failed\n";

static void usage(FILE *f)
{
	fprintf(f, "usage: idemctl [--db URL] [--json] [--secret-key-file PATH] COMMAND [ARGS]\n\n"
	           "Operates an idem store. --db defaults to $IDEM_DB; --json prints one JSON\n"
	           "object for scripts; --secret-key-file (default $IDEM_SECRET_KEY_FILE) is the\n"
	           "key channel secrets are sealed with at rest, as idemd's. --db given several\n"
	           "times names the shards, in idemd's order (docs/scaling.md, Sharding).\n\n"
	           "commands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-22s %s\n", commands[i]->name, commands[i]->summary);
	fprintf(f, "\n'idemctl COMMAND --help' shows a command's options and an example.\n%s",
	        exit_codes);
}

idem_store *cli_stores[CLI_MAX_SHARDS];
int cli_nstores;

/* Open url as shard i (migrated when asked and behind). */
static int open_one(const char *url, idem_store_opts o, int i, idem_store **store)
{
	int rc, version = 0, migrate = o.migrate;
	char what[64];

	/* Migrating takes the write lock (SQLite: BEGIN IMMEDIATE) even when
	 * there is nothing to do: only when the schema is behind, so that an
	 * operator's read never queues behind idemd's writers. */
	o.migrate = 0;
	snprintf(what, sizeof(what), i ? "cannot open store (shard %d)" : "cannot open store", i);
	if ((rc = idem_store_open(store, url, &o)) < 0)
		return cli_fail(what, rc);
	if (migrate && ((rc = idem_store_schema_version(*store, &version)) < 0 ||
	                (version < idem_store_schema_latest(*store) &&
	                 (rc = idem_store_migrate(*store, NULL)) < 0))) {
		idem_store_close(*store);
		*store = NULL;
		return cli_fail("cannot migrate the store", rc);
	}
	return 0;
}

int cli_open_opts(const cli_globals *g, const idem_store_opts *opts, idem_store **store,
                  idem_pay **pay)
{
	idem_store_opts o = IDEM_STORE_OPTS_INIT;
	int rc, n = g->nshards > 1 ? g->nshards : 1;

	*store = NULL;
	*pay = NULL;
	if (!g->db || !*g->db) {
		fprintf(stderr, "idemctl: no database: give --db URL or set IDEM_DB\n");
		return EXIT_USAGE;
	}
	if (opts)
		o = *opts;
	cli_nstores = 0;
	for (int i = 0; i < n; i++) {
		if ((rc = open_one(i == 0 ? g->db : g->shard_db[i], o, i, &cli_stores[i])) != 0) {
			cli_close(NULL, NULL);
			return rc;
		}
		cli_nstores++;
	}
	*store = cli_stores[0];
	if ((rc = idem_pay_open_shards(pay, cli_stores, n, NULL)) < 0) {
		cli_close(NULL, NULL);
		*store = NULL;
		return cli_fail("cannot start", rc);
	}
	if (g->secret_key_file && *g->secret_key_file &&
	    (rc = cli_use_secret_key(*pay, g->secret_key_file)) < 0) {
		rc = cli_fail("cannot use the secret key", rc);
		cli_close(*store, *pay);
		*store = NULL;
		*pay = NULL;
		return rc;
	}
	return 0;
}

int cli_open(const cli_globals *g, idem_store **store, idem_pay **pay)
{
	return cli_open_opts(g, NULL, store, pay);
}

void cli_close(idem_store *store, idem_pay *pay)
{
	int own = 0;

	idem_pay_close(pay);
	for (int i = 0; i < cli_nstores; i++)
		own |= store == cli_stores[i];
	if (!own)
		idem_store_close(store);
	for (int i = 0; i < cli_nstores; i++)
		idem_store_close(cli_stores[i]);
	cli_nstores = 0;
}

/* --db URL: the first replaces IDEM_DB, each next one adds a shard. */
static int add_db(cli_globals *g, int *seen, const char *url)
{
	if (*seen == 0) {
		g->db = url;
	} else {
		if (*seen >= CLI_MAX_SHARDS)
			return cli_usage_error("at most %d --db (shards)", CLI_MAX_SHARDS);
		g->shard_db[*seen] = url;
	}
	g->nshards = ++*seen;
	return 0;
}

int cli_fail(const char *what, int rc)
{
	const idem_error *e = idem_error_last();

	if (e->code == rc && e->message[0])
		fprintf(stderr, "idemctl: %s: %s (%s)\n", what, e->message, idem_strerror(rc));
	else
		fprintf(stderr, "idemctl: %s: %s\n", what, idem_strerror(rc));
	return 1;
}

/* Does argv[i..] name command c? Returns the number of words (0: no). */
static int matches(const cli_command *c, int argc, char **argv, int i)
{
	const char *sp = strchr(c->name, ' ');

	if (!sp)
		return strcmp(argv[i], c->name) == 0;
	return i + 1 < argc && strncmp(argv[i], c->name, (size_t)(sp - c->name)) == 0 &&
	               argv[i][sp - c->name] == '\0' && strcmp(argv[i + 1], sp + 1) == 0
	           ? 2
	           : 0;
}

static int is_help(const char *a)
{
	return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* "idemctl merchant --help": the group's subcommands with their usage. */
static void group_usage(const char *group, size_t n)
{
	printf("usage: idemctl [--db URL] %s SUBCOMMAND [ARGS]\n\nsubcommands:\n", group);
	for (size_t c = 0; c < NCOMMANDS; c++) {
		const char *name = commands[c]->name;

		if (strncmp(name, group, n) == 0 && name[n] == ' ')
			printf("  %-22s %s\n", name + n + 1, commands[c]->summary);
	}
	printf("\n'idemctl %s SUBCOMMAND --help' shows a subcommand's options and an "
	       "example.\n%s",
	       group, exit_codes);
}

/* "merchant" with no or an unknown subcommand: say which ones exist;
 * "merchant --help" (before any subcommand): list them, exit 0. */
static int unknown_command(int argc, char **argv, int i)
{
	char subs[256] = "";
	size_t used = 0, n = strlen(argv[i]);

	for (size_t c = 0; c < NCOMMANDS; c++) {
		const char *name = commands[c]->name;

		if (strncmp(name, argv[i], n) == 0 && name[n] == ' ' && used < sizeof(subs))
			used += (size_t)snprintf(subs + used, sizeof(subs) - used, "%s%s",
			                         used ? ", " : "", name + n + 1);
	}
	if (used && i + 1 < argc && is_help(argv[i + 1])) {
		group_usage(argv[i], n);
		return 0;
	}
	if (used && i + 1 < argc)
		return cli_usage_error("unknown %s subcommand '%s' (one of: %s)", argv[i],
		                       argv[i + 1], subs);
	if (used)
		return cli_usage_error("%s needs a subcommand: %s", argv[i], subs);
	return cli_usage_error("unknown command '%s'", argv[i]);
}

int main(int argc, char **argv)
{
	cli_globals g = {getenv("IDEM_DB"), 0, getenv("IDEM_SECRET_KEY_FILE"), {NULL}, 1};
	int i = 1, dbs = 0;

	/* Global options come before the command, and may also follow it. */
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
			if (add_db(&g, &dbs, argv[++i]) != 0)
				return EXIT_USAGE;
		} else if (strncmp(argv[i], "--db=", 5) == 0) {
			if (add_db(&g, &dbs, argv[i] + 5) != 0)
				return EXIT_USAGE;
		} else if (strcmp(argv[i], "--json") == 0) {
			g.json = 1;
		} else if (strcmp(argv[i], "--secret-key-file") == 0 && i + 1 < argc) {
			g.secret_key_file = argv[++i];
		} else if (strncmp(argv[i], "--secret-key-file=", 18) == 0) {
			g.secret_key_file = argv[i] + 18;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage(stdout);
			return 0;
		} else {
			return cli_usage_error("unknown option '%s'", argv[i]);
		}
	}
	if (i >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	for (size_t c = 0; c < NCOMMANDS; c++) {
		int words = matches(commands[c], argc, argv, i);

		if (!words)
			continue;
		int nargs = argc - i - words, k = 0, rc;
		char **args = calloc((size_t)nargs + 1, sizeof(char *));

		if (!args)
			return 1;
		for (int j = i + words; j < argc; j++) {
			if (strcmp(argv[j], "--json") == 0) {
				g.json = 1;
			} else if (strcmp(argv[j], "--db") == 0 && j + 1 < argc) {
				if (add_db(&g, &dbs, argv[++j]) != 0) {
					free(args);
					return EXIT_USAGE;
				}
			} else if (strncmp(argv[j], "--db=", 5) == 0) {
				if (add_db(&g, &dbs, argv[j] + 5) != 0) {
					free(args);
					return EXIT_USAGE;
				}
			} else if (strcmp(argv[j], "--secret-key-file") == 0 && j + 1 < argc) {
				g.secret_key_file = argv[++j];
			} else if (strncmp(argv[j], "--secret-key-file=", 18) == 0) {
				g.secret_key_file = argv[j] + 18;
			} else if (strcmp(argv[j], "--help") == 0 || strcmp(argv[j], "-h") == 0) {
				printf("usage: idemctl [--db URL] %s\n%s", commands[c]->usage,
				       exit_codes);
				free(args);
				return 0;
			} else {
				args[k++] = argv[j];
			}
		}
		rc = commands[c]->run(&g, k, args);
		free(args);
		return rc;
	}
	return unknown_command(argc, argv, i);
}
