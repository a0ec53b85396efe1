/*
 * cli/merchant.c: `idemctl merchant add|list|rotate-key`. An API key is
 * printed once, when it is made; only its digest is stored, and list never
 * shows key material.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/*
 * A stored name as it may be shown on a terminal and in JSON: well-formed
 * UTF-8 is kept, control characters and bytes that are not UTF-8 become
 * "\xNN" (an old database may hold such a name: listing must not fail on
 * it, nor send raw escapes to a terminal). out has room for n bytes.
 */
static void shown_name(char *out, size_t n, const char *in)
{
	const unsigned char *s = (const unsigned char *)in;
	size_t len = strlen(in), o = 0;

	for (size_t i = 0; i < len && o + 5 <= n;) {
		size_t k = s[i] < 0x80                    ? 1
		           : s[i] >= 0xc2 && s[i] <= 0xdf ? 2
		           : s[i] >= 0xe0 && s[i] <= 0xef ? 3
		           : s[i] >= 0xf0 && s[i] <= 0xf4 ? 4
		                                          : 0;
		uint32_t cp = k == 1 ? s[i] : k ? s[i] & (0x7fu >> k) : 0;
		int ok = k > 0 && i + k <= len;

		for (size_t j = 1; ok && j < k; j++) {
			ok = (s[i + j] & 0xc0) == 0x80;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if (ok)
			ok = !(k == 3 && cp < 0x800) &&
			     !(k == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
			     !(cp >= 0xd800 && cp <= 0xdfff) && cp >= 0x20 &&
			     !(cp >= 0x7f && cp < 0xa0);
		if (ok) {
			memcpy(out + o, s + i, k);
			o += k;
			i += k;
		} else {
			snprintf(out + o, n - o, "\\x%02X", s[i]);
			o += 4;
			i++;
		}
	}
	out[o] = '\0';
}

/*
 * The key is committed: it must reach the operator, even when the JSON
 * cannot be built (out of memory), so then it is printed as text. name NULL:
 * a rotated key ({"merchant_id", "api_key"}).
 */
static int print_key(const char *id, const char *name, const char *key, int shard)
{
	json_t *obj =
	    name ? json_pack("{s:s, s:s, s:s}", "merchant_id", id, "name", name, "api_key", key)
	         : json_pack("{s:s, s:s}", "merchant_id", id, "api_key", key);

	/* Sharded (several --db): the shard it lives on, too. */
	if (obj && shard >= 0)
		json_object_set_new(obj, "shard", json_integer(shard));
	char *s = obj ? json_dumps(obj, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;

	json_decref(obj);
	if (!s) {
		printf("merchant %s\napi key: %s\n", id, key);
		fprintf(stderr,
		        "idemctl: the key of merchant %s is committed, but its JSON could not"
		        " be built: it is printed above as text\n",
		        id);
		return 1;
	}
	printf("%s\n", s);
	free(s);
	return 0;
}

static int add(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char id[IDEM_PAY_ID_SIZE], key[IDEM_PAY_SECRET_SIZE];
	int rc, shard = 0;

	if (argc != 1 || argv[0][0] == '-')
		return cli_usage_error("merchant add takes one NAME");
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	/* The library checks the name before it writes anything. */
	rc = idem_pay_merchant_add(pay, argv[0], id, key);
	if (rc == 0 && idem_pay_shard_count(pay) > 1 &&
	    idem_pay_merchant_shard(pay, id, &shard) < 0)
		shard = -1; /* committed: the key is printed all the same */
	if (rc < 0) {
		rc = cli_fail("cannot add merchant", rc);
	} else if (g->json) {
		rc = print_key(id, argv[0], key, idem_pay_shard_count(pay) > 1 ? shard : -1);
	} else {
		printf("merchant %s (%s) created\napi key: %s\n"
		       "The key is shown only this once; only its digest is stored.\n",
		       id, argv[0], key);
		if (idem_pay_shard_count(pay) > 1)
			printf("shard %d of %d\n", shard, idem_pay_shard_count(pay));
	}
	cli_close(store, pay);
	return rc;
}

static int list_entry(void *ctx, const idem_admin_entry *e)
{
	cli_list *l = ctx;
	char when[32], id[4 * 64 + 1], name[4 * 256 + 1];

	cli_time(when, e->created_at_ms);
	shown_name(id, sizeof(id), e->id);
	shown_name(name, sizeof(name), e->name);
	l->n++;
	if (l->json)
		return json_array_append_new(l->list,
		                             json_pack("{s:s, s:s, s:s}", "merchant_id", id, "name",
		                                       name, "created_at", when)) < 0
		           ? IDEM_ENOMEM
		           : 0;
	printf("%-36s  %-24s  %s\n", id, when, name);
	return 0;
}

static int list(const cli_globals *g, int argc, char **argv)
{
	(void)argv;
	return cli_list_run(g, argc, "merchant", idem_admin_merchant_list, list_entry,
	                    "%-36s  %-24s  %s\n", "MERCHANT_ID", "CREATED_AT", "NAME");
}

static int rotate(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	char key[IDEM_PAY_SECRET_SIZE];
	int rc;

	if (argc != 1 || argv[0][0] == '-')
		return cli_usage_error("merchant rotate-key takes one MERCHANT_ID");
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	rc = idem_admin_merchant_rotate_key(pay, argv[0], key);
	if (rc < 0)
		rc = cli_fail("cannot rotate the key", rc);
	else if (g->json)
		rc = print_key(argv[0], NULL, key, -1);
	else
		printf("merchant %s has a new api key: %s\n"
		       "The old key is revoked. The new one is shown only this once.\n",
		       argv[0], key);
	cli_close(store, pay);
	return rc;
}

const cli_command cli_merchant_add = {
    "merchant add",
    "create a merchant and print its API key (once)",
    "merchant add NAME [--json]\n\n"
    "Creates a merchant and prints its id and API key. The key is shown this once;\n"
    "only its SHA-256 digest is stored.\n"
    "--json prints {\"merchant_id\", \"name\", \"api_key\"}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db merchant add \"Acme Shop\" --json\n",
    add,
};

const cli_command cli_merchant_list = {
    "merchant list",
    "list merchants (ids, names; never keys)",
    "merchant list [--json]\n\n"
    "Lists every merchant's id, creation time and name, oldest first.\n"
    "--json prints {\"merchants\": [{\"merchant_id\", \"name\", \"created_at\"}]}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db merchant list\n",
    list,
};

const cli_command cli_merchant_rotate_key = {
    "merchant rotate-key",
    "give a merchant a new API key; the old one stops working",
    "merchant rotate-key MERCHANT_ID [--json]\n\n"
    "Replaces the merchant's API key and prints the new one once. The old key is\n"
    "rejected (401) from then on; an idemd that verified it recently may accept\n"
    "it for a few seconds more.\n"
    "--json prints {\"merchant_id\", \"api_key\"}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db merchant rotate-key m_0123abcd --json\n",
    rotate,
};
