/*
 * cli/channel.c: `idemctl channel add|list|rotate-secret`. A signing secret
 * is printed once, when it is made; list never shows one.
 */
#include <stdlib.h>

#include "cli/cli.h"

static int add(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char secret[IDEM_PAY_SECRET_SIZE];
	int rc;

	if (argc != 1 || argv[0][0] == '-')
		return cli_usage_error("channel add takes one NAME");
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	rc = idem_pay_channel_add(pay, argv[0], secret);
	if (rc < 0)
		rc = cli_fail("cannot add channel", rc);
	else if (g->json)
		rc = cli_print_json(json_pack("{s:s, s:s}", "channel", argv[0], "secret", secret));
	else
		printf("channel %s created\nsecret: %s\n"
		       "Sign each callback body: X-Signature: hex(HMAC-SHA256(body, secret)).\n",
		       argv[0], secret);
	cli_close(store, pay);
	return rc;
}

typedef struct {
	int json;
	json_t *list;
	int64_t n;
} list_ctx;

static int list_entry(void *ctx, const idem_admin_entry *e)
{
	list_ctx *l = ctx;
	char when[32];

	cli_time(when, e->created_at_ms);
	l->n++;
	if (l->json)
		return json_array_append_new(l->list, json_pack("{s:s, s:s}", "channel", e->id,
								"created_at", when)) < 0
			   ? IDEM_ENOMEM
			   : 0;
	printf("%-32s  %s\n", e->id, when);
	return 0;
}

static int list(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	list_ctx l = {g->json, NULL, 0};
	int rc;

	(void)argv;
	if (argc != 0)
		return cli_usage_error("channel list takes no arguments");
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	if (g->json && !(l.list = json_array())) {
		rc = cli_fail("cannot list channels", IDEM_ENOMEM);
		goto done;
	}
	if (!g->json)
		printf("%-32s  %s\n", "CHANNEL", "CREATED_AT");
	if ((rc = idem_admin_channel_list(pay, list_entry, &l)) < 0) {
		rc = cli_fail("cannot list channels", rc);
		goto done;
	}
	if (g->json) {
		rc = cli_print_json(json_pack("{s:o}", "channels", l.list));
		l.list = NULL;
	} else {
		printf("%lld channel%s\n", (long long)l.n, l.n == 1 ? "" : "s");
	}
done:
	json_decref(l.list);
	cli_close(store, pay);
	return rc;
}

static int rotate(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char secret[IDEM_PAY_SECRET_SIZE];
	int rc;

	if (argc != 1 || argv[0][0] == '-')
		return cli_usage_error("channel rotate-secret takes one NAME");
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	rc = idem_admin_channel_rotate_secret(pay, argv[0], secret);
	if (rc < 0)
		rc = cli_fail("cannot rotate the secret", rc);
	else if (g->json)
		rc = cli_print_json(json_pack("{s:s, s:s}", "channel", argv[0], "secret", secret));
	else
		printf("channel %s has a new secret: %s\n"
		       "Callbacks signed with the old secret are rejected from now on.\n",
		       argv[0], secret);
	cli_close(store, pay);
	return rc;
}

const cli_command cli_channel_add = {
	"channel add",
	"register a payment channel and print its signing secret",
	"channel add NAME [--json]\n\n"
	"Registers a channel (1..32 of a-z 0-9 _ -) and prints its HMAC secret once.\n"
	"--json prints {\"channel\", \"secret\"}.\n\n"
	"example:\n  idemctl --db sqlite:var/idem.db channel add wechat --json\n",
	add,
};

const cli_command cli_channel_list = {
	"channel list",
	"list channels (names; never secrets)",
	"channel list [--json]\n\n"
	"Lists every channel with its creation time.\n"
	"--json prints {\"channels\": [{\"channel\", \"created_at\"}]}.\n\n"
	"example:\n  idemctl --db sqlite:var/idem.db channel list --json\n",
	list,
};

const cli_command cli_channel_rotate_secret = {
	"channel rotate-secret",
	"give a channel a new signing secret",
	"channel rotate-secret NAME [--json]\n\n"
	"Replaces the channel's HMAC secret and prints the new one once. Callbacks\n"
	"signed with the old secret get 401 from the moment this returns.\n"
	"--json prints {\"channel\", \"secret\"}.\n\n"
	"example:\n  idemctl --db sqlite:var/idem.db channel rotate-secret wechat\n",
	rotate,
};
