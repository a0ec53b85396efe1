/*
 * cli/channel.c: `idemctl channel add|list|rotate-secret`. A signing secret
 * is printed once, when it is made; list never shows one.
 */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* ---- secrets at rest (--secret-key-file) ---- */

int cli_use_secret_key(idem_pay *pay, const char *path)
{
	unsigned char key[32];
	int rc;

	if ((rc = idem_pay_secret_key_read(path, key)) == 0)
		rc = idem_pay_set_secret_key(pay, key);
	OPENSSL_cleanse(key, sizeof(key));
	return rc;
}

/*
 * Before writing a secret without a key: refuse when the stored ones are
 * sealed (a plain secret among them would be the one left readable).
 */
static int check_no_key_needed(const cli_globals *g, idem_pay *pay)
{
	int rc;

	if (g->secret_key_file && *g->secret_key_file)
		return 0;
	if ((rc = idem_pay_set_secret_key(pay, NULL)) < 0)
		return cli_fail("cannot write a channel secret", rc);
	return 0;
}

/* NAME [--base-url URL] [--timeout-ms N]: parsed; 0 or a usage error. */
typedef struct {
	const char *name, *base_url;
	long timeout_ms;
	int has_timeout;
} conn_args;

static int parse_conn_args(const char *cmd, int argc, char **argv, conn_args *a)
{
	memset(a, 0, sizeof(*a));
	a->timeout_ms = 5000;
	for (int i = 0; i < argc; i++) {
		int missing = 0;
		const char *v;

		if ((v = cli_opt_value(argc, argv, &i, "--base-url", &missing)) || missing) {
			if (missing || !*v)
				return cli_usage_error("--base-url needs a URL");
			a->base_url = v;
		} else if ((v = cli_opt_value(argc, argv, &i, "--timeout-ms", &missing)) ||
		           missing) {
			if (missing || cli_parse_long(v, 1, 600000, &a->timeout_ms) < 0)
				return cli_usage_error(
				    "--timeout-ms needs a number of ms, 1..600000");
			a->has_timeout = 1;
		} else if (argv[i][0] == '-' || a->name) {
			return cli_usage_error(
			    "%s takes one NAME and --base-url URL, --timeout-ms N", cmd);
		} else {
			a->name = argv[i];
		}
	}
	if (!a->name)
		return cli_usage_error("%s takes one NAME", cmd);
	if (a->has_timeout && !a->base_url)
		return cli_usage_error("--timeout-ms goes with --base-url");
	return 0;
}

static int add(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char secret[IDEM_PAY_SECRET_SIZE];
	conn_args a;
	int rc;

	if ((rc = parse_conn_args("channel add", argc, argv, &a)) != 0)
		return rc;
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	if ((rc = check_no_key_needed(g, pay)) != 0) {
		cli_close(store, pay);
		return rc;
	}
	rc = idem_pay_channel_add(pay, a.name, secret);
	if (rc == 0 && a.base_url &&
	    (rc = idem_pay_channel_connect(pay, a.name, a.base_url, a.timeout_ms)) < 0)
		rc = cli_fail("channel created, but cannot connect it (fix with channel connect)",
		              rc);
	else if (rc < 0)
		rc = cli_fail("cannot add channel", rc);
	else if (g->json)
		rc = cli_print_json(json_pack("{s:s, s:s, s:s?, s:I}", "channel", a.name, "secret",
		                              secret, "base_url", a.base_url, "timeout_ms",
		                              (json_int_t)a.timeout_ms));
	else if (a.base_url)
		printf("channel %s created, connected to %s (timeout %ld ms)\nsecret: %s\n"
		       "Both directions are signed: X-Signature: hex(HMAC-SHA256(body, secret)).\n",
		       a.name, a.base_url, a.timeout_ms, secret);
	else
		printf("channel %s created\nsecret: %s\n"
		       "Sign each callback body: X-Signature: hex(HMAC-SHA256(body, secret)).\n",
		       a.name, secret);
	OPENSSL_cleanse(secret, sizeof(secret));
	cli_close(store, pay);
	return rc;
}

static int connect_cmd(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	conn_args a;
	int rc;

	if ((rc = parse_conn_args("channel connect", argc, argv, &a)) != 0)
		return rc;
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	rc = idem_pay_channel_connect(pay, a.name, a.base_url, a.timeout_ms);
	if (rc < 0)
		rc = cli_fail("cannot connect the channel", rc);
	else if (g->json)
		rc = cli_print_json(json_pack("{s:s, s:s?, s:I}", "channel", a.name, "base_url",
		                              a.base_url, "timeout_ms", (json_int_t)a.timeout_ms));
	else if (a.base_url)
		printf("channel %s connected to %s (timeout %ld ms)\n", a.name, a.base_url,
		       a.timeout_ms);
	else
		printf("channel %s disconnected: it only receives notifications\n", a.name);
	cli_close(store, pay);
	return rc;
}

static int list_entry(void *ctx, const idem_admin_entry *e)
{
	cli_list *l = ctx;
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
	(void)argv;
	return cli_list_run(g, argc, "channel", idem_admin_channel_list, list_entry, "%-32s  %s\n",
	                    "CHANNEL", "CREATED_AT");
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
	if ((rc = check_no_key_needed(g, pay)) != 0) {
		cli_close(store, pay);
		return rc;
	}
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
    "channel add NAME [--base-url URL [--timeout-ms N]] [--json]\n\n"
    "Registers a channel (1..32 of a-z 0-9 _ -) and prints its HMAC secret once.\n"
    "With --base-url, idemd sends payments and refunds on it to that channel\n"
    "(docs/channels.md, the CHANNEL.md protocol), each call given --timeout-ms\n"
    "(default 5000); without it the channel only sends notifications.\n"
    "--json prints {\"channel\", \"secret\", \"base_url\", \"timeout_ms\"}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db channel add wechat"
    " --base-url https://pay.example.com/v1 --json\n",
    add,
};

const cli_command cli_channel_connect = {
    "channel connect",
    "point an existing channel at its API (or disconnect it)",
    "channel connect NAME [--base-url URL [--timeout-ms N]] [--json]\n\n"
    "Sets where idemd calls the channel; without --base-url the channel is\n"
    "disconnected and only receives notifications again. Running idemd\n"
    "instances pick the change up within 5 s.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db channel connect wechat"
    " --base-url http://127.0.0.1:9000 --timeout-ms 3000\n",
    connect_cmd,
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

/* `channel rekey [--new-secret-key-file PATH]`: seal every secret (again). */
static int rekey(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	const char *new_path = NULL;
	unsigned char key[32];
	int64_t changed = 0;
	int rc, missing = 0;

	for (int i = 0; i < argc; i++) {
		const char *v = cli_opt_value(argc, argv, &i, "--new-secret-key-file", &missing);

		if (missing || !v || !*v)
			return cli_usage_error(
			    missing ? "--new-secret-key-file needs a PATH"
			            : "channel rekey takes only --new-secret-key-file");
		new_path = v;
	}
	if (!g->secret_key_file || !*g->secret_key_file)
		return cli_usage_error("channel rekey needs --secret-key-file (the current key)");
	if (new_path && (rc = idem_pay_secret_key_read(new_path, key)) < 0)
		return cli_fail("cannot read the new secret key", rc);
	if ((rc = cli_open(g, &store, &pay)) != 0) {
		OPENSSL_cleanse(key, sizeof(key));
		return rc;
	}
	rc = idem_admin_channel_rekey(pay, new_path ? key : NULL, &changed);
	OPENSSL_cleanse(key, sizeof(key));
	if (rc < 0)
		rc = cli_fail("cannot rekey the channel secrets", rc);
	else if (g->json)
		rc = cli_print_json(json_pack("{s:I}", "sealed", (json_int_t)changed));
	else
		printf("%lld channel secret%s sealed%s\n", (long long)changed,
		       changed == 1 ? "" : "s",
		       new_path ? " with the new key: use it from now on" : "");
	cli_close(store, pay);
	return rc;
}

const cli_command cli_channel_rekey = {
    "channel rekey",
    "seal every channel secret with the secret key (or a new one)",
    "channel rekey [--new-secret-key-file PATH] [--json]\n\n"
    "With --secret-key-file KEY, seals every channel secret stored in plain text\n"
    "(written before a key was used) with KEY. With --new-secret-key-file NEW, also\n"
    "opens the sealed ones with KEY and seals all of them with NEW, in one\n"
    "transaction; then start idemd with NEW. Secrets themselves do not change.\n"
    "--json prints {\"sealed\": N}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db --secret-key-file /etc/idem/key channel rekey\n",
    rekey,
};
