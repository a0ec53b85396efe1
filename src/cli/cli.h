/*
 * cli/cli.h: idemctl's command table. Each command lives in its own file
 * and gets the parsed global options; it prints results on stdout, one-line
 * errors on stderr, and returns an exit code:
 *   0 success, 1 failure (store, I/O), 2 bad usage, 3 a check failed.
 */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include "idem/idem.h"

#define EXIT_USAGE 2
#define EXIT_CHECK 3

typedef struct {
	const char *db;  /* --db URL or IDEM_DB */
	int json;        /* --json */
} cli_globals;

typedef struct {
	const char *name;    /* "merchant add" */
	const char *summary;
	const char *usage;   /* shown by --help, with an example */
	int (*run)(const cli_globals *g, int argc, char **argv);
} cli_command;

extern const cli_command cli_merchant_add, cli_channel_add, cli_demo;

/* Open the store and the payment domain; prints a one-line error on failure. */
int cli_open(const cli_globals *g, idem_store **store, idem_pay **pay);
void cli_close(idem_store *store, idem_pay *pay);
/* Print "idemctl: what: <idem error>" and return 1. */
int cli_fail(const char *what, int rc);

#endif
