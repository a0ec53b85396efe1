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
	&cli_merchant_add,
	&cli_channel_add,
	&cli_demo,
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	fprintf(f, "usage: idemctl [--db URL] [--json] COMMAND [ARGS]\n\n"
		   "Operates an idem store. --db defaults to $IDEM_DB.\n\ncommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-16s %s\n", commands[i]->name, commands[i]->summary);
	fprintf(f, "\n'idemctl COMMAND --help' shows a command's options and an example.\n"
		   "exit codes: 0 success, 1 failure, 2 bad usage, 3 a check failed\n");
}

int cli_open(const cli_globals *g, idem_store **store, idem_pay **pay)
{
	int rc;

	*store = NULL;
	*pay = NULL;
	if (!g->db || !*g->db) {
		fprintf(stderr, "idemctl: no database: give --db URL or set IDEM_DB\n");
		return EXIT_USAGE;
	}
	if ((rc = idem_store_open(store, g->db, NULL)) < 0)
		return cli_fail("cannot open store", rc);
	if ((rc = idem_pay_open(pay, *store, NULL)) < 0) {
		idem_store_close(*store);
		*store = NULL;
		return cli_fail("cannot start", rc);
	}
	return 0;
}

void cli_close(idem_store *store, idem_pay *pay)
{
	idem_pay_close(pay);
	idem_store_close(store);
}

int cli_fail(const char *what, int rc)
{
	fprintf(stderr, "idemctl: %s: %s (%s)\n", what, idem_error_last()->message,
		idem_strerror(rc));
	return 1;
}

int main(int argc, char **argv)
{
	cli_globals g = {getenv("IDEM_DB"), 0};
	int i = 1;

	/* Global options come before the command, and may also follow it. */
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
			g.db = argv[++i];
		} else if (strncmp(argv[i], "--db=", 5) == 0) {
			g.db = argv[i] + 5;
		} else if (strcmp(argv[i], "--json") == 0) {
			g.json = 1;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage(stdout);
			return 0;
		} else {
			fprintf(stderr, "idemctl: unknown option '%s' (see --help)\n", argv[i]);
			return EXIT_USAGE;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	/* Commands are one or two words: "demo", "merchant add". */
	for (size_t c = 0; c < NCOMMANDS; c++) {
		const char *name = commands[c]->name, *sp = strchr(name, ' ');
		int words = sp ? 2 : 1;

		if (sp ? (i + 1 < argc && strncmp(argv[i], name, (size_t)(sp - name)) == 0 &&
			  argv[i][sp - name] == '\0' && strcmp(argv[i + 1], sp + 1) == 0)
		       : strcmp(argv[i], name) == 0) {
			int nargs = argc - i - words, k = 0;
			char **args = calloc((size_t)nargs + 1, sizeof(char *));

			if (!args)
				return 1;
			for (int j = i + words; j < argc; j++) {
				if (strcmp(argv[j], "--json") == 0) {
					g.json = 1;
				} else if (strcmp(argv[j], "--db") == 0 && j + 1 < argc) {
					g.db = argv[++j];
				} else if (strcmp(argv[j], "--help") == 0 || strcmp(argv[j], "-h") == 0) {
					printf("usage: idemctl %s\n", commands[c]->usage);
					free(args);
					return 0;
				} else {
					args[k++] = argv[j];
				}
			}
			int rc = commands[c]->run(&g, k, args);

			free(args);
			return rc;
		}
	}
	fprintf(stderr, "idemctl: unknown command '%s' (see --help)\n", argv[i]);
	return EXIT_USAGE;
}
