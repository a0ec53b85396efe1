/*
 * cli/demo.c: `idemctl demo`: on an empty database, create a demo merchant
 * and the `mock` channel and print their credentials with curl commands
 * that work when pasted. `make run` calls it before starting idemd.
 */
#include <stdio.h>

#include "cli/cli.h"

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char id[IDEM_PAY_ID_SIZE], key[IDEM_PAY_SECRET_SIZE], secret[IDEM_PAY_SECRET_SIZE];
	const char *base = argc > 0 ? argv[0] : "http://127.0.0.1:8080";
	int64_t n = 0;
	int rc;

	if (argc > 1) {
		fprintf(stderr, "idemctl: demo takes at most a base URL (see --help)\n");
		return EXIT_USAGE;
	}
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	if ((rc = idem_pay_merchant_count(pay, &n)) < 0) {
		rc = cli_fail("cannot read merchants", rc);
		goto done;
	}
	if (n > 0) {
		printf("The database has merchants already; their keys were shown when they were "
		       "created.\nCreate another with: idemctl --db %s merchant add NAME\n",
		       g->db);
		goto done;
	}
	if ((rc = idem_pay_merchant_add(pay, "Demo merchant", id, key)) < 0) {
		rc = cli_fail("cannot add the demo merchant", rc);
		goto done;
	}
	if ((rc = idem_pay_channel_add(pay, "mock", secret)) < 0) {
		rc = cli_fail("cannot add the mock channel", rc);
		goto done;
	}
	printf("Demo merchant %s, API key (shown once):\n  %s\n", id, key);
	printf("Channel 'mock', signing secret:\n  %s\n\n", secret);
	printf("Create a payment (run it twice: the second answer is a replay):\n\n"
	       "curl -i %s/v1/payments \\\n"
	       "  -H 'Authorization: Bearer %s' \\\n"
	       "  -H 'Content-Type: application/json' \\\n"
	       "  -H 'Idempotency-Key: demo-order-1' \\\n"
	       "  -d '{\"merchant_order_no\":\"ORD-1\",\"amount\":1000,\"currency\":\"CNY\","
	       "\"channel\":\"mock\"}'\n\n",
	       base, key);
	printf("Then, as the channel, report it paid (use the payment id from the answer):\n\n"
	       "body='{\"notify_id\":\"N-1\",\"payment_id\":\"PAY_ID\",\"channel_txn_id\":\"T-1\","
	       "\"status\":\"SUCCESS\",\"amount\":1000}'\n"
	       "sig=$(printf %%s \"$body\" | openssl dgst -sha256 -hmac '%s' | sed 's/^.* //')\n"
	       "curl -i %s/v1/notifications/mock -H \"X-Signature: $sig\" \\\n"
	       "  -H 'Content-Type: application/json' -d \"$body\"\n\n",
	       secret, base);
done:
	cli_close(store, pay);
	return rc;
}

const cli_command cli_demo = {
    "demo",
    "on an empty database, create a demo merchant and the mock channel",
    "demo [BASE_URL]\n\n"
    "On an empty database, creates a demo merchant and the 'mock' channel and prints\n"
    "their credentials and curl examples against BASE_URL (http://127.0.0.1:8080).\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db demo\n",
    run,
};
