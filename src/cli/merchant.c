/* cli/merchant.c: `idemctl merchant add NAME`: prints the API key once. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char id[IDEM_PAY_ID_SIZE], key[IDEM_PAY_SECRET_SIZE];
	int rc;

	if (argc != 1) {
		fprintf(stderr, "idemctl: merchant add takes one NAME (see --help)\n");
		return EXIT_USAGE;
	}
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	rc = idem_pay_merchant_add(pay, argv[0], id, key);
	if (rc < 0) {
		rc = cli_fail("cannot add merchant", rc);
	} else if (g->json) {
		json_t *o = json_pack("{s:s, s:s, s:s}", "merchant_id", id, "name", argv[0],
				      "api_key", key);
		char *s = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;

		printf("%s\n", s ? s : "{}");
		free(s);
		json_decref(o);
	} else {
		printf("merchant %s (%s) created\napi key: %s\n"
		       "The key is shown only this once; only its digest is stored.\n",
		       id, argv[0], key);
	}
	cli_close(store, pay);
	return rc;
}

const cli_command cli_merchant_add = {
	"merchant add",
	"create a merchant and print its API key",
	"merchant add NAME [--json]\n\n"
	"Creates a merchant and prints its id and API key (shown once).\n\n"
	"example:\n  idemctl --db sqlite:var/idem.db merchant add \"Acme Shop\" --json",
	run,
};
