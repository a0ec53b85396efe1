/* cli/channel.c: `idemctl channel add NAME`: prints the signing secret once. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char secret[IDEM_PAY_SECRET_SIZE];
	int rc;

	if (argc != 1) {
		fprintf(stderr, "idemctl: channel add takes one NAME (see --help)\n");
		return EXIT_USAGE;
	}
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	rc = idem_pay_channel_add(pay, argv[0], secret);
	if (rc < 0) {
		rc = cli_fail("cannot add channel", rc);
	} else if (g->json) {
		json_t *o = json_pack("{s:s, s:s}", "channel", argv[0], "secret", secret);
		char *s = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;

		printf("%s\n", s ? s : "{}");
		free(s);
		json_decref(o);
	} else {
		printf("channel %s created\nsecret: %s\n"
		       "Sign each callback body: X-Signature: hex(HMAC-SHA256(body, secret)).\n",
		       argv[0], secret);
	}
	cli_close(store, pay);
	return rc;
}

const cli_command cli_channel_add = {
	"channel add",
	"register a payment channel and print its signing secret",
	"channel add NAME [--json]\n\n"
	"Registers a channel (1..32 of a-z 0-9 _ -) and prints its HMAC secret.\n\n"
	"example:\n  idemctl --db sqlite:var/idem.db channel add wechat --json",
	run,
};
